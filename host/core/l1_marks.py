"""The guest's marks, and what waits for them in a host under test (L1):
a guest program's wrapper that marks one of its records for L1, the
shell step in L1 that waits for a mark, the wrapper that keeps a
schedule's output in L1 until it ends, and their exits.  The channel
itself is QEMU's (host/core/qemu.py MARK_PORT); why a measurement waits
on the guest: docs/host-under-test.md, "One command a measurement"."""

from __future__ import annotations

import dataclasses

from memqual.host.core.errors import GuestError
from memqual.host.core.shell import Shell

# How long a schedule waits for the guest's mark, on L1's clock: the
# guest's own work before its mark (a KSM agent's fill) comes first.  A
# mark that does not come is a channel that broke, and its schedule ends
# (exit 7) instead of waiting out its own deadline.
MARK_WAIT_S = 300.0

# A guest program, run so that it marks one of its records for L1: when
# a line holds " event=$3 " a connection to the mark address ($1, port
# $2) says so; lines holding " event=$4 " stay in the guest (a line sent
# out while L1 measures brings this machine's acknowledgement into L1 at
# a moment this machine sets).  Every word is an argument: no input
# reaches the shell's text.
_MARKED = (
    'address=$1 port=$2 at=$3 quiet=$4; shift 4; "$@" | while IFS= read -r line; do '
    'case "$line" in *" event=$quiet "*) ;; *) printf "%s\\n" "$line";; esac; '
    'case "$line" in *" event=$at "*) (echo "$at" | nc "$address" "$port" >/dev/null 2>&1 &);; esac; '
    "done"
)

# The step of a schedule in L1 that waits for the guest's mark: block on
# the mark FIFO ($MARK) at most $MARK_WAIT s of L1's clock, then print
# L1's clock at the wait's start and at the mark, then "==".  With $READY
# set, that file is made once the wait has begun: memqual waits for it
# before it lets the guest mark.  The waiter holds none of the command's
# descriptors: SSH would wait for it to let go of stderr.
AWAIT_MARK = (
    "read -r from rest </proc/uptime; "
    '(sleep "$MARK_WAIT" && echo late >"$MARK") </dev/null >/dev/null 2>&1 & late=$!; '
    'if [ -n "$READY" ]; then : >"$READY"; fi; '
    'read -r word <"$MARK" || exit 5; kill "$late" 2>/dev/null; '
    'case "$word" in abort) exit 6;; late) exit 7;; esac; '
    "read -r seen rest </proc/uptime; "
    'echo "mark $from $seen"; echo ==; '
)

# A schedule's output kept in a file in L1 (tmpfs) until it ends, for
# the same reason; L1's own deadline ($1) kills the schedule ($2) alone,
# so what it read still comes back.
KEEP_UNTIL_END = (
    "tmp=$(mktemp) || exit 1; deadline=$1; script=$2; shift 2; "
    'timeout -s KILL "$deadline" sh -c "$script" schedule "$@" >"$tmp"; status=$?; '
    'cat "$tmp"; rm -f "$tmp"; exit $status'
)

# A schedule's exits that say why it stopped.
EXITS = {
    3: "a write failed",
    4: "a step memqual does not know",
    5: "the mark channel closed",
    6: "its wait for the guest's mark was cancelled",
    7: "the guest's mark did not come within the wait",
    137: "killed at L1's deadline",
}


@dataclasses.dataclass(frozen=True)
class Mark:
    """A mark as L1 saw it: its clock when the wait began and when the
    mark came.  A mark that came at once was there before the wait, and
    its moment was not L1's to fix."""

    waited_from_s: float
    seen_s: float

    @property
    def waited_s(self) -> float:
        return self.seen_s - self.waited_from_s


def marked(argv: list[str], address: str, port: int, at: str, quiet: str = "-") -> list[str]:
    """``argv`` of a guest program, run so that it marks its ``at`` event
    for L1 and keeps its ``quiet`` event's lines in the guest (``_MARKED``)."""
    return ["sh", "-c", _MARKED, "marked", address, str(port), at, quiet, *argv]


def parse_mark(text: str) -> Mark:
    """A mark step's line: L1's clock when its wait began and ended."""
    words = text.split()
    try:
        if len(words) != 3 or words[0] != "mark":
            raise ValueError(text)
        return Mark(float(words[1]), float(words[2]))
    except ValueError:
        raise GuestError(f"not a mark seen in L1: {text[:200]!r}") from None


def cancel_mark(shell: Shell, fifo: str) -> None:
    """End a schedule's wait for the guest's mark (it exits 6): the guest
    will not mark.  Nothing waits: the write gives up after a few seconds."""
    script = '[ -p "$1" ] && echo abort >"$1"'  # a FIFO only: never a file made
    shell.run(["timeout", "-s", "KILL", "10", "sh", "-c", script, "cancel", fifo], timeout=30, check=False)

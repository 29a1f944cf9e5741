"""Balloon moves the host under test (L1) sends itself, at the guest's
mark: one command in L1 waits for the guest's tracker to mark that it is
armed, then writes ``balloon MIB`` into the guest QEMU's second monitor
(host/core/qemu.py L1_MONITOR_PIPE), so the move starts at a point of
the guest's work, not when memqual's QMP reaches L1.  Why:
docs/host-under-test.md, "The balloon's moves at the guest's mark"."""

from __future__ import annotations

import dataclasses
import secrets
import threading

from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.l1_marks import AWAIT_MARK, EXITS, KEEP_UNTIL_END, MARK_WAIT_S, Mark, cancel_mark, parse_mark
from memqual.host.core.nested import BOOT_TIMEOUT_FACTOR
from memqual.host.core.polling import poll
from memqual.host.core.qemu import L1_MARK_FIFO, L1_MONITOR_PIPE
from memqual.host.core.shell import Shell

MIB = 1 << 20
# The schedule's steps as words: "mark" (l1_marks.AWAIT_MARK), "balloon
# MIB" (the target written to the monitor's FIFO by the shell's own echo,
# L1's clock after it).  No input reaches the shell's text.
_MOVES = (
    'while [ $# -gt 0 ]; do case "$1" in '
    "mark) " + AWAIT_MARK + "shift;; "
    'balloon) echo "balloon $2" >"$HMP.in" || exit 3; read -r at rest </proc/uptime; '
    'echo "sent $2 $at"; echo ==; shift 2;; '
    "*) exit 4;; esac; done"
)
# How long memqual waits for L1's schedule to begin its wait, on this
# machine's clock: one SSH command into L1 and a shell's start.
READY_WAIT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Sent:
    """A target L1 wrote to the guest's monitor, and L1's clock then."""

    mib: int
    at_s: float


@dataclasses.dataclass(frozen=True)
class MoveOutcome:
    mark: Mark
    sent: Sent


def parse_outcome(stdout: str) -> MoveOutcome:
    """The schedule's output: its mark, then what it sent."""
    parts = stdout.split("==\n")[:-1]
    if len(parts) != 2:
        raise GuestError(f"not a balloon schedule's output: {stdout[:200]!r}")
    words = parts[1].split()
    if len(words) != 3 or words[0] != "sent":
        raise GuestError(f"not a target L1 sent: {parts[1][:200]!r}")
    return MoveOutcome(parse_mark(parts[0]), Sent(int(words[1]), float(words[2])))


class PendingMove:
    """A move waiting in L1 for the guest's mark: ``result()`` once the
    guest has marked, ``cancel()`` when it will not."""

    def __init__(self, moves: L1Moves, target_mib: int, deadline_s: float) -> None:
        self._moves = moves
        self._done = threading.Event()
        self._outcome: MoveOutcome | BaseException | None = None
        self._ready = f"{moves.ready_dir}/memqual-ready-{secrets.token_hex(6)}"
        self._deadline_s = deadline_s
        argv = [
            "env",
            f"MARK={moves.mark_fifo}",
            f"MARK_WAIT={int(moves.mark_wait_s)}",
            f"HMP={moves.monitor_pipe}",
            f"READY={self._ready}",
            "sh",
            "-c",
            KEEP_UNTIL_END,
            "keep-until-end",
            str(int(deadline_s) + 1),
            _MOVES,
            "mark",
            "balloon",
            str(target_mib),
        ]
        self._thread = threading.Thread(target=self._run, args=(argv,), name="l1-balloon-move", daemon=True)
        self._thread.start()
        try:
            self._wait_ready()
        except BaseException:
            self.cancel()
            raise

    def _run(self, argv: list[str]) -> None:
        try:
            out = self._moves.shell.run(argv, timeout=self._deadline_s + 30, check=False)
            if out.status != 0:
                why = EXITS.get(out.status, "failed")
                raise GuestError(f"L1's balloon move exited {out.status}: {why} ({out.stderr.strip()[:200]})")
            self._outcome = parse_outcome(out.stdout)
        except BaseException as exc:  # handed to result()
            self._outcome = exc
        finally:
            self._done.set()

    def _wait_ready(self) -> None:
        """Until L1's schedule waits for the mark: a mark before its wait
        would not be its start."""
        shell = self._moves.shell

        def ready() -> bool:
            if self._done.is_set():
                raise GuestError(f"L1's balloon move ended before it waited for the mark: {self._outcome}")
            return shell.run(["sh", "-c", '[ -e "$1" ] && rm -f "$1"', "ready", self._ready], check=False).status == 0

        # 0.1 s: the period of a check over L1's SSH, not a wait for an event
        poll(ready, READY_WAIT_S * self._moves.slowdown, 0.1, what="L1's balloon move waiting for the guest's mark")

    def result(self, timeout_s: float) -> MoveOutcome:
        if not self._done.wait(timeout_s):
            raise Timeout(f"L1's balloon move did not end within {timeout_s:.0f} s")
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None
        return self._outcome

    def cancel(self) -> None:
        """End the wait in L1 (the guest will not mark) and the thread."""
        if not self._done.is_set():
            cancel_mark(self._moves.shell, self._moves.mark_fifo)
        self._done.wait(60)


@dataclasses.dataclass(frozen=True)
class L1Moves:
    """The balloon moves of L1's one guest, sent by L1 at the guest's mark."""

    shell: Shell
    mark_fifo: str = L1_MARK_FIFO
    monitor_pipe: str = L1_MONITOR_PIPE
    mark_wait_s: float = MARK_WAIT_S
    slowdown: float = BOOT_TIMEOUT_FACTOR
    ready_dir: str = "/run"  # L1's, root's alone

    def start(self, target_bytes: int, deadline_s: float) -> PendingMove:
        """A move to ``target_bytes`` (whole MiB: the human monitor's unit),
        waiting in L1 for the guest's mark once this returns."""
        if target_bytes % MIB or target_bytes <= 0:
            raise ValueError(f"a target L1 sends is whole MiB, not {target_bytes} bytes")
        return PendingMove(self, target_bytes // MIB, deadline_s)

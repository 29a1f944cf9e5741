"""Driving guest/ksm_stress.c from the host.

The agent prints one record per line ("t=... event=fill_done pages=...");
a thread collects them as they come, so a scenario can wait for an event
with a deadline while it drives host KSM.  Phases that hold (hold:S, dirty:S)
end early on SIGUSR1: ``advance()`` sends it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

from memqual.host.core import clock, l1_marks
from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.shell import Shell

AGENT = "ksm_stress"
PAGE_SIZE = 4096
# Under icount (sleep=off) an idle guest's clock jumps to its next timer, so
# a hold's cap and the run's bound, counted in guest seconds, run out in a
# moment of the host's while the host is still working beside the guest.
# Every hold is ended by the host (SIGUSR1), which keeps its own wall
# deadline: on that clock the guest's caps only have to be out of reach.
ICOUNT_GUEST_BOUND_S = 1e7


def marked(argv: list[str], address: str, port: int) -> list[str]:
    """``argv`` of the agent as a host under test's measurement runs it:
    the same records, but a mark for L1 the moment it starts dirtying (L1
    starts ksmd then, not when memqual's command reaches it), and its
    progress lines kept in the guest (host/core/l1_marks.py)."""
    return l1_marks.marked(argv, address, port, at="dirty_start", quiet="dirty_progress")


def parse_record(line: str) -> dict[str, str] | None:
    """'t=1.5 event=fill_done pages=3' -> {'t': '1.5', 'event': 'fill_done',
    'pages': '3'}; None for a line that is not a record."""
    record: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if not sep:
            return None
        record[key] = value
    return record if "event" in record else None


@dataclasses.dataclass(frozen=True)
class StressArgs:
    """ksm_stress's command line, typed."""

    mib: int
    phases: Sequence[str]
    byte: int = 1
    mergeable: bool = False
    thp: bool = False
    timeout_s: float = 300.0

    def argv(self, path: str, on: clock.Clock | None = None) -> list[str]:
        phases, bound = list(self.phases), self.timeout_s
        if (on or clock.current()).icount:
            phases = [f"hold:{ICOUNT_GUEST_BOUND_S:g}" if p.startswith("hold:") else p for p in phases]
            bound = ICOUNT_GUEST_BOUND_S
        argv = [
            path,
            "--mib",
            str(self.mib),
            "--byte",
            str(self.byte),
            "--phases",
            ",".join(phases),
            "--timeout",
            f"{bound:g}",
        ]
        if self.mergeable:
            argv.append("--mergeable")
        if self.thp:
            argv.append("--thp")
        return argv

    @property
    def pages(self) -> int:
        return self.mib * (1 << 20) // PAGE_SIZE


class StressAgent:
    """One running ksm_stress; use as a context manager (it is killed on
    exit if still running; its own --timeout bounds it anyway)."""

    def __init__(self, ssh: Shell, path: str, args: StressArgs, mark: tuple[str, int] | None = None) -> None:
        """``mark``: the address and port of a host under test's mark channel,
        where the agent marks its dirtying's start (``marked``)."""
        self.args = args
        self._ssh = ssh
        self.records: list[dict[str, str]] = []
        self._cond = threading.Condition()
        self._ended = False
        self._failure: BaseException | None = None
        argv = args.argv(path)
        self._bg = ssh.start(argv if mark is None else marked(argv, *mark))
        self._thread = threading.Thread(target=self._collect, name="ksm_stress-reader", daemon=True)
        self._thread.start()

    def __enter__(self) -> StressAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._ended:
            self._bg.kill()
        self._thread.join(timeout=5)

    def _collect(self) -> None:
        try:
            for line in self._bg.lines(timeout=self.args.timeout_s + 60):
                record = parse_record(line)
                if record is not None:
                    with self._cond:
                        self.records.append(record)
                        self._cond.notify_all()
        except BaseException as exc:  # reported by wait_event
            self._failure = exc
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    @property
    def pid(self) -> int:
        return int(self.wait_event("start", 60)["pid"])

    def wait_event(self, event: str, timeout_s: float, occurrence: int = 1) -> dict[str, str]:
        """The n-th record of this event; GuestError when the agent reports
        an error or ends first, Timeout past the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                errors = [r for r in self.records if r["event"] == "error"]
                if errors:
                    raise GuestError(f"ksm_stress failed: {_format(errors[0])}")
                found = [r for r in self.records if r["event"] == event]
                if len(found) >= occurrence:
                    return found[occurrence - 1]
                if self._ended:
                    raise GuestError(
                        f"ksm_stress ended before event={event} (#{occurrence}); last record: "
                        f"{_format(self.records[-1]) if self.records else 'none'}; {self._failure or ''}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout(f"ksm_stress: no event={event} (#{occurrence}) within {timeout_s:.0f} s")
                self._cond.wait(remaining)

    def advance(self) -> None:
        """End the current hold/dirty phase (SIGUSR1)."""
        self._ssh.run(["kill", "-USR1", str(self.pid)], timeout=30)

    def finish(self, timeout_s: float) -> int:
        """Wait for the agent to exit; its exit status.

        Waits for the channel's exit status as well as the agent's last
        line: the guest's SSH server sends the status once it has reaped
        the process, so the agent is gone before the test's next command
        starts and no command of a test overlaps its end."""
        deadline = time.monotonic() + timeout_s
        self.wait_event("done", timeout_s)
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            raise Timeout(f"ksm_stress printed event=done but its output did not end within {timeout_s:.0f} s")
        self._bg.wait(max(0.0, deadline - time.monotonic()))
        return int(self.records[-1].get("status", "-1")) if self.records[-1]["event"] == "done" else -1


def _format(record: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in record.items())

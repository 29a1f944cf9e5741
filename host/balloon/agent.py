"""The guest side of a balloon move: ``balloon_agent``'s output
(``t=<monotonic> key=value`` lines) and ``balloon_agent track``, which
times a move inside the guest from the balloon counters in /proc/vmstat
(docs/balloon.md, "Timed inside the guest")."""

from __future__ import annotations

import dataclasses
from typing import Any

from memqual.host.core.errors import GuestError
from memqual.host.core.l1_marks import marked
from memqual.host.core.shell import Shell


def agent_records(stdout: str, event: str | None = None) -> list[dict[str, str]]:
    """Parsed balloon_agent lines, optionally only one event."""
    out = [parse_agent_line(line) for line in stdout.splitlines() if line.startswith("t=")]
    return [r for r in out if event is None or r.get("event") == event]


def agent_stat(stdout: str) -> dict[str, int]:
    """The last ``event=stat`` record of an agent run, numeric fields as int."""
    stats = agent_records(stdout, "stat")
    if not stats:
        raise GuestError(f"balloon_agent printed no stat line: {stdout[-200:]!r}")
    return {k: int(v) for k, v in stats[-1].items() if k not in ("t", "event") and v.lstrip("-").isdigit()}


@dataclasses.dataclass(frozen=True)
class GuestTiming:
    """One balloon move timed inside the guest (balloon_agent track): from
    the poll that first saw the counter move to the poll that saw it reach
    the pages asked.  Each instant lies within the gap to the poll before
    it, so the duration is good to ``resolution_s`` (the larger gap)."""

    pages: int
    moved: int
    seconds: float
    first_gap_s: float
    end_gap_s: float
    polls: int
    period_s: float
    max_gap_s: float

    @property
    def resolution_s(self) -> float:
        return max(self.first_gap_s, self.end_gap_s)

    @classmethod
    def from_agent(cls, stdout: str) -> GuestTiming:
        tracked = agent_records(stdout, "tracked")
        if not tracked:
            raise GuestError(f"balloon_agent track printed no result: {stdout[-300:]!r}")
        r = tracked[-1]
        try:
            return cls(
                pages=int(r["pages"]),
                moved=int(r["moved"]),
                seconds=float(r["seconds"]),
                first_gap_s=float(r["first_gap_s"]),
                end_gap_s=float(r["end_gap_s"]),
                polls=int(r["polls"]),
                period_s=float(r["period_s"]),
                max_gap_s=float(r["max_gap_s"]),
            )
        except (KeyError, ValueError) as exc:
            raise GuestError(f"balloon_agent track result incomplete ({exc}): {r}") from exc


@dataclasses.dataclass(frozen=True)
class GuestClock:
    """The clock the guest's timestamps come from: the clocksource, and the
    resolution of CLOCK_MONOTONIC (the kernel's hrtimer resolution, as
    /proc/timer_list gives it and clock_getres returns: 1 ns with
    high-resolution timers, a whole tick without).  Unlike the gaps
    between the tracker's polls, which a loaded host stretches, neither
    depends on how busy the host is."""

    source: str
    resolution_ns: int

    @classmethod
    def read(cls, ssh: Shell) -> GuestClock:
        source = ssh.run(["cat", "/sys/devices/system/clocksource/clocksource0/current_clocksource"], timeout=30)
        timers = ssh.run(["cat", "/proc/timer_list"], timeout=30)
        return cls.parse(source.stdout, timers.stdout)

    @classmethod
    def parse(cls, source: str, timer_list: str) -> GuestClock:
        found = [
            int(line.split(":", 1)[1].split()[0])
            for line in timer_list.splitlines()
            if line.strip().startswith(".resolution:")
        ]
        if not found or not source.strip():
            raise GuestError(f"the guest's clock: no clocksource or resolution in {timer_list[:200]!r}")
        return cls(source.strip(), max(found))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The tracker's record once it has read the counter's base: the move may start.
TRACKING = "tracking"


class GuestTracker:
    """``balloon_agent track`` running in the guest while the host moves
    the balloon: start it, wait until it is armed (it has read the counter's
    base), move the balloon, then ``result()``."""

    def __init__(
        self,
        ssh: Shell,
        agent: str,
        direction: str,
        pages: int,
        period_us: int,
        bound_s: int,
        mark: tuple[str, int] | None = None,
    ) -> None:
        """``mark``: the address and port of a host under test's mark
        channel; the tracker then marks for L1 the moment it is armed
        (host/balloon/l1_moves.py sends the target at that mark)."""
        if direction not in ("inflate", "deflate"):
            raise ValueError(f"direction is inflate or deflate, not {direction!r}")
        argv = [agent, "track", direction, str(pages), str(period_us), str(bound_s)]
        self._command = ssh.start(argv if mark is None else marked(argv, *mark, at=TRACKING))
        self._bound_s = bound_s
        for line in self._command.lines(timeout=30):
            record = parse_agent_line(line)
            if record.get("event") == TRACKING:
                return
            if record.get("event") in ("error", "timeout"):
                break
        result = self._command.wait(timeout=10)
        raise GuestError(f"balloon_agent track did not arm: {result.stdout[-300:]!r} {result.stderr[-300:]!r}")

    def result(self) -> GuestTiming:
        result = self._command.wait(timeout=self._bound_s + 10)
        if result.status != 0:
            raise GuestError(f"balloon_agent track exited {result.status}: {result.stdout[-300:]!r}")
        return GuestTiming.from_agent(result.stdout)

    def cancel(self) -> None:
        self._command.kill()


def parse_agent_line(line: str) -> dict[str, str]:
    """One balloon_agent record ``t=... key=value ...`` as a dict."""
    out: dict[str, str] = {}
    for field in line.split():
        key, sep, value = field.partition("=")
        if sep:
            out[key] = value
    return out

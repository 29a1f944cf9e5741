"""The guest statistics scenario (scenario 6 of e2e/test_balloon.py): the
polling interval set and read back, bad intervals refused by memqual and by
QEMU, and when each update arrives, bracketed by the host's polls.  It
measures and returns what it saw; the e2e test asserts (docs/balloon.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from memqual.host.balloon.device import STATS_INTERVAL_MAX, BalloonController, GuestStats
from memqual.host.balloon.scenarios import MACHINE
from memqual.host.core.errors import BadInput, Timeout
from memqual.host.core.polling import poll
from memqual.host.core.record import Measurement

POLL_S = 0.02  # the host's poll of guest-stats
UPDATES = 3  # updates bracketed at each interval
INTERVALS = (1, 2)
SET_FIELDS = ("stat-free-memory", "stat-total-memory", "stat-available-memory")
# QEMU asks for the next update an interval after the last one came
# (virtio_balloon_receive_stats re-arms its timer): never sooner.  Later
# only by the guest's answer, which 80 % of the interval allows for.
EARLY_S = 0.01
LATE_SHARE = 1.8

Window = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Update:
    stats: GuestStats
    window: Window  # host time the update arrived in
    next_since: float  # the start of the poll that saw it


def next_update(ctl: BalloonController, after: int, since: float, deadline_s: float) -> Update:
    """Poll guest-stats until its last-update is newer than ``after``, which
    the poll that started at ``since`` still showed.  The window runs from
    the start of the last poll that did not show the update to the end of
    the first that did."""
    starts = [since]

    def read() -> tuple[GuestStats, float]:
        starts.append(ctl.clock())
        return ctl.guest_stats(), ctl.clock()

    polled = poll(
        read,
        deadline_s,
        POLL_S,
        what="a guest-stats update",
        until=lambda seen: seen[0].last_update > after,
        clock=ctl.clock,
        sleep=ctl.sleep,
        on_timeout=lambda _: Timeout(f"guest-stats not updated after {after} within {deadline_s:g} s"),
    )
    stats_now, ended = polled.value
    return Update(stats_now, (starts[-2], ended), starts[-1])


@dataclasses.dataclass(frozen=True)
class IntervalUpdates:
    """Consecutive updates at one polling interval."""

    interval_s: int
    read_back: int  # the interval QEMU reports after it was set
    windows: list[Window]
    stats: GuestStats  # the last update

    @property
    def bounds(self) -> list[Window]:
        """Each period between updates, as the shortest and longest the
        windows allow: a busy host widens them, it cannot move an update out."""
        return [(b[0] - a[1], b[1] - a[0]) for a, b in zip(self.windows, self.windows[1:], strict=False)]

    @property
    def periods(self) -> list[float]:
        return [b[1] - a[1] for a, b in zip(self.windows, self.windows[1:], strict=False)]

    def problems(self) -> list[str]:
        """Periods shorter than the interval, or longer than the guest's
        answer allows; fields still unset.  Wall periods: on the icount
        clock QEMU's timer runs on the guest's instruction count, and the
        interval bounds no wall period (the caller leaves them out)."""
        interval, bounds = self.interval_s, self.bounds
        problems = []
        if not all(high >= interval - EARLY_S for _, high in bounds):
            problems.append(f"{interval} s, faster: {bounds}")
        if not all(low <= LATE_SHARE * interval for low, _ in bounds):
            problems.append(f"{interval} s, slower: {bounds}")
        return problems

    def unset(self) -> list[str]:
        return [key for key in SET_FIELDS if self.stats.stats.get(key, -1) == -1]


@dataclasses.dataclass(frozen=True)
class StatsRun:
    before: GuestStats  # the driver sends one buffer as it probes: may be set already
    memqual_refused: dict[str, bool]  # bad interval -> refused before QEMU
    qemu_refusals: dict[str, str]  # bad interval -> QEMU's refusal ("" if it took it)
    intervals: list[IntervalUpdates]

    def record(self) -> Measurement:
        by_interval = {i.interval_s: i for i in self.intervals}
        return Measurement(
            scenario="balloon.stats",
            metric="stats_update_period_s",
            unit="s",
            better="lower",
            samples=by_interval[1].periods,
            settings={"interval_s": 1, "machine": MACHINE},
            extra={
                "period_2s": by_interval[2].periods,
                "period_bounds_s": {str(k): v.bounds for k, v in by_interval.items()},
                "qemu_refusals": self.qemu_refusals,
                "stats": self.intervals[-1].stats.stats,
                "unset_before_interval": self.before.unset,
            },
        )


def refusal(set_interval: Callable[[int], None], seconds: int) -> str:
    """BadInput's text when ``set_interval(seconds)`` refuses, else ""."""
    try:
        set_interval(seconds)
    except BadInput as exc:
        return str(exc)
    return ""


def measure_stats(ctl: BalloonController, intervals: tuple[int, ...] = INTERVALS) -> StatsRun:
    """Bad intervals first, then UPDATES updates bracketed at each of
    ``intervals`` (after one update to start from), then polling off."""
    before = ctl.guest_stats()
    memqual_refused, qemu_refusals = {}, {}
    for bad in (-1, STATS_INTERVAL_MAX + 1):
        memqual_refused[str(bad)] = bool(refusal(ctl.set_stats_interval, bad))
        qemu_refusals[str(bad)] = refusal(ctl.qemu_set_stats_interval, bad)
    runs = []
    last = before
    for interval in intervals:
        ctl.set_stats_interval(interval)
        read_back = ctl.stats_interval()
        update = next_update(ctl, last.last_update, ctl.clock(), deadline_s=10 * interval)
        windows = []
        for _ in range(UPDATES):
            update = next_update(ctl, update.stats.last_update, update.next_since, deadline_s=5 * interval)
            windows.append(update.window)
        last = update.stats
        runs.append(IntervalUpdates(interval, read_back, windows, last))
    ctl.set_stats_interval(0)
    return StatsRun(before, memqual_refused, qemu_refusals, runs)

"""The KSM advisor (Linux 6.8+): with ``advisor_mode`` scan-time, ksmd sets
its own pages_to_scan at the end of every full scan so that a full scan
takes ``advisor_target_scan_time`` seconds.  ``run_advisor`` switches it
on from a known start over the pages already there, reads pages_to_scan
as each full scan ends until one took the target and a few more ended,
and returns the series (``AdvisorRun``); it judges nothing.  On a host
under test ``run_advisor_whole`` watches a fixed number of scans as one
command in L1, on L1's clock.  The knobs go through host KSM's saved set
(host/ksm/state.py).  docs/ksm.md, "The KSM advisor"."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Protocol

from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.polling import poll
from memqual.host.core.record import Measurement
from memqual.host.ksm.scenarios import ScenarioFailed
from memqual.host.ksm.schedule import Now, Outcome, ScanEnds, Schedule, SetKnob
from memqual.host.ksm.table import ADVISOR, AdvisorSizes

MODE = "advisor_mode"
TARGET = "advisor_target_scan_time"
START = "advisor_min_pages_to_scan"  # the pages_to_scan it starts from (no floor)
SCAN_TIME = "scan-time"
KNOBS = (MODE, TARGET, START, "advisor_max_pages_to_scan", "advisor_max_cpu")
POLL_S = 0.02  # a full scan here takes 0.1 s or more: its end is seen within a fifth of it
# A scan's deadline where the watch is one command: the profile's whole
# watch over its scans, never less than this (an emulated host's first
# scans take seconds of its clock).
MIN_SCAN_TIMEOUT_S = 20.0
# How a run on a host under test times its scans: one command in L1 reads
# L1's /proc/uptime at each scan end (host/ksm/l1_ksm.py).
L1_TIMED_BY = "L1's /proc/uptime, read in L1 at each full scan's end"
# The scan ends watched in one command on a host under test: the advisor
# there must reach its target and ``after_scans`` more within them.  On
# 6.12 as L1 (quick sizes, 512 MiB guest) it reached its 1 s target at the
# 7th scan, 28.5 s of L1's clock after run=1; the rest is headroom.
L1_SCANS = 14


class AdvisorFiles(Protocol):
    """What the procedure reads of host KSM's sysfs directory."""

    def has(self, name: str) -> bool: ...
    def read(self, name: str) -> str: ...
    def read_int(self, name: str) -> int: ...


class AdvisorHost(Protocol):
    """Host KSM as the advisor's procedure drives it: ``KsmController``."""

    @property
    def fs(self) -> AdvisorFiles: ...
    def set(self, **knobs: int | str) -> None: ...
    def unmerge(self) -> None: ...


class WholeAdvisorHost(AdvisorHost, Protocol):
    """A host KSM that runs the watch as one command (a host under test's,
    host/ksm/l1_ksm.py), pages_to_scan read at every scan end."""

    def run_schedule(self, schedule: Schedule, timeout_s: float, knobs: tuple[str, ...] = ()) -> Outcome: ...


def check(fs: AdvisorFiles) -> None:
    """CapabilityMissing, with the reason, on a kernel without the advisor."""
    missing = [name for name in KNOBS if not fs.has(name)]
    if missing:
        raise CapabilityMissing(
            f"host KSM: this kernel has no {', '.join(missing)} (the KSM advisor came in Linux 6.8)"
        )


def kernel_seconds(duration_s: float) -> int:
    """A full scan's length as the advisor counts it: whole seconds, at least 1."""
    return max(1, math.floor(duration_s))


@dataclasses.dataclass(frozen=True)
class Reading:
    """pages_to_scan as one or more full scans ended, and when: seconds
    since the advisor started (on the clock its run's ``timed_by`` names)
    and full scans since then."""

    at_s: float
    full_scans: int
    pages_to_scan: int


@dataclasses.dataclass(frozen=True)
class Scan:
    """One reading's scans: how long each took (the reading's span over
    its scans), and the pages_to_scan the advisor set at its end."""

    reading: Reading
    seconds: float

    def on_target(self, target_s: int) -> bool:
        return kernel_seconds(self.seconds) <= target_s


@dataclasses.dataclass(frozen=True)
class AdvisorRun:
    """The advisor from its start: the readings at the ends of full scans."""

    target_s: int
    start_pages: int  # pages_to_scan as it was switched on
    sleep_ms: int
    readings: tuple[Reading, ...]
    agent_pages: int
    timed_by: str = "this machine's monotonic clock, polling sysfs"

    @property
    def scans(self) -> list[Scan]:
        out, before = [], Reading(0.0, 0, self.start_pages)
        for reading in self.readings:
            count = max(reading.full_scans - before.full_scans, 1)
            out.append(Scan(reading, (reading.at_s - before.at_s) / count))
            before = reading
        return out

    @property
    def reached(self) -> Scan | None:
        """The first scan that took the target or less, as the advisor counts."""
        return next((s for s in self.scans if s.on_target(self.target_s)), None)

    def settled(self, after_scans: int) -> bool:
        """A scan reached the target and ``after_scans`` more ended."""
        reached = self.reached
        last = self.readings[-1].full_scans if self.readings else 0
        return reached is not None and last - reached.reading.full_scans >= after_scans

    @property
    def slow_start(self) -> bool:
        """Whether its first scan, at the start's pages_to_scan, was slower than the target."""
        scans = self.scans
        return bool(scans) and not scans[0].on_target(self.target_s)

    @property
    def peak_pages(self) -> int:
        return max((r.pages_to_scan for r in self.readings), default=self.start_pages)

    @property
    def rise(self) -> float:
        """The highest pages_to_scan over the one it started from."""
        return self.peak_pages / self.start_pages

    def records(self) -> list[Measurement]:
        reached = self.reached
        if reached is None:
            raise ValueError("the advisor never reached its target: nothing to record")
        settings = {
            "target_s": self.target_s,
            "start_pages": self.start_pages,
            "sleep_ms": self.sleep_ms,
            "timed_by": self.timed_by,
        }
        extra = {
            "agent_pages": self.agent_pages,
            "pages_to_scan_at_target": reached.reading.pages_to_scan,
            "first_step_pages": self.readings[0].pages_to_scan,
            "scans": [
                {**dataclasses.asdict(s.reading), "scan_s": round(s.seconds, 3), "kernel_s": kernel_seconds(s.seconds)}
                for s in self.scans
            ],
        }

        def metric(name: str, unit: str, better: str, value: float) -> Measurement:
            return Measurement(ADVISOR.name, name, unit, better, [value], settings=settings, extra=extra)

        return [
            metric("seconds_to_target", "s", "lower", reached.reading.at_s),
            metric("pages_to_scan_rise", "1", "higher", self.rise),
        ]


def switch_on(ksm: AdvisorHost, sizes: AdvisorSizes) -> tuple[int, int]:
    """The advisor switched on at ``sizes``' target from a known start,
    ksmd still stopped: (pages_to_scan it starts from, full_scans now)."""
    check(ksm.fs)
    # run=2 unmerges and puts ksmd's cursor at the head of its list: the
    # first scan after it is a whole one, timed from its start.
    ksm.unmerge()
    smart = {"smart_scan": 0} if ksm.fs.has("smart_scan") else {}  # every page, every scan
    ksm.set(sleep_millisecs=sizes.sleep_ms, **{START: sizes.start_pages, TARGET: sizes.target_s}, **smart)
    # The mode last: switching it on sets pages_to_scan to the start.
    ksm.set(**{MODE: SCAN_TIME})
    return ksm.fs.read_int("pages_to_scan"), ksm.fs.read_int("full_scans")


def run_advisor_whole(ksm: WholeAdvisorHost, sizes: AdvisorSizes, agent_pages: int, scans: int) -> AdvisorRun:
    """``run_advisor`` on a host that runs the watch as one command: ksmd
    started and the next ``scans`` scan ends read in the host, on its
    clock, from the moment ``run=1`` is written; nothing crosses the
    network while the advisor steps.  ScenarioFailed when the advisor had
    not reached its target and ``sizes.after_scans`` more scans by then."""
    start_pages, base = switch_on(ksm, sizes)
    schedule = Schedule((Now(), SetKnob("run", 1), ScanEnds(scans)))
    outcome = ksm.run_schedule(schedule, max(sizes.timeout_s / scans, MIN_SCAN_TIMEOUT_S), knobs=("pages_to_scan",))
    (started,), (ends,) = outcome.now_s, outcome.scan_ends
    readings = tuple(
        Reading(round(end.taken_s - started, 2), end.full_scans - base, end.knob("pages_to_scan")) for end in ends
    )
    run = AdvisorRun(sizes.target_s, start_pages, sizes.sleep_ms, readings, agent_pages, timed_by=L1_TIMED_BY)
    if not run.settled(sizes.after_scans):
        raise ScenarioFailed(
            f"the KSM advisor did not bring a full scan to {sizes.target_s} s and {sizes.after_scans} more scans "
            f"within {scans} scans (from pages_to_scan {start_pages}): {list(readings)}"
        )
    return run


def run_advisor(
    ksm: AdvisorHost,
    sizes: AdvisorSizes,
    agent_pages: int,
    note: Callable[[str], object] = lambda _: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> AdvisorRun:
    """Switch the advisor on at ``sizes``' target over the pages there
    now and watch it: readings until a scan took the target or less and
    ``sizes.after_scans`` more ended.  ScenarioFailed past the deadline."""
    start_pages, base = switch_on(ksm, sizes)
    ksm.set(run=1)
    started = clock()
    readings: list[Reading] = []

    def read() -> bool:
        scans = ksm.fs.read_int("full_scans") - base
        if scans > (readings[-1].full_scans if readings else 0):
            readings.append(Reading(clock() - started, scans, ksm.fs.read_int("pages_to_scan")))
            note(f"advisor: {readings[-1]}")
        return AdvisorRun(sizes.target_s, start_pages, sizes.sleep_ms, tuple(readings), agent_pages).settled(
            sizes.after_scans
        )

    poll(
        read,
        sizes.timeout_s,
        POLL_S,
        what="the KSM advisor's full scans",
        clock=clock,
        sleep=sleep,
        on_timeout=lambda _: ScenarioFailed(
            f"the KSM advisor did not bring a full scan to {sizes.target_s} s and {sizes.after_scans} more scans "
            f"within {sizes.timeout_s:.0f} s (from pages_to_scan {start_pages}): {readings}"
        ),
    )
    return AdvisorRun(sizes.target_s, start_pages, sizes.sleep_ms, tuple(readings), agent_pages)

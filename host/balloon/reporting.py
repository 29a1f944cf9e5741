"""The free page reporting scenario (scenario 4 of e2e/test_balloon.py):
memory the guest touched and freed leaves QEMU's RSS with reporting on,
and stays without it.  It measures and returns what it saw; the e2e test
asserts (docs/balloon.md)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

from memqual.host.balloon import rss_watch
from memqual.host.balloon.rss import rss_kib, wait_rss, wait_rss_steady
from memqual.host.balloon.scenarios import GUEST_MIB, MACHINE, Guest, ScenarioFailed
from memqual.host.core import clock
from memqual.host.core.record import Measurement
from memqual.host.core.shell import Shell

TOUCH_MIB = 512  # the ab profile's (host/balloon/table.py REPORTING)
DEADLINE_S = 30.0  # reporting waits 2 s and works in 2 MiB blocks
OFF_WINDOW_S = 10.0  # how long "it does not fall" is watched
WARMUP_MIB = 64  # touched and freed once before the baseline is read
QUIET_S = 3.0  # steady for longer than reporting's 2 s delay before it runs
# "Back": this share of what the touch added is gone again.  Judged on the
# rise, not on the baseline, because the guest's own page cache and slab move
# the baseline by tens of MiB between runs (measured: back to 113% of the
# baseline with 96% of a 512 MiB rise given back; without reporting 0%).
ON_RETURNED = 0.80
OFF_RETURNED = 0.25  # without reporting: at most this share of the rise goes
# The touched memory is held until memqual has read the peak and ends the
# agent; the hold's own length is only a bound (under icount an idle
# guest's seconds pass faster than the host's).
HOLD_S = 3600
ALLOCATED_S = 120.0  # the touch itself: 2.5-3 s here under TCG
# The wall-clock metric (this machine's QEMU, polled from here) and the one
# on a host under test's clock (L1's /proc/uptime, read by the watcher in
# L1: host/balloon/rss_watch.py), never one name for both.
METRIC = "rss_return_s"
L1_METRIC = "rss_return_l1_s"
# On L1 also the guest QEMU's run time over the reporting passes per MiB
# they gave back: the host's handling and madvise of the reported pages
# (and the guest's reporting, which is little), at schedstat's nanoseconds
# of L1's clock where the return's time is /proc/uptime's centiseconds.
L1_WORK_METRIC = "report_cpu_l1_ns_per_mib"
# On L1 the return is timed from the RSS's first fall below the held peak:
# this share of the rise gone (5 MiB of 512) is that fall, past what QEMU's
# own allocations move (without reporting the RSS moved by 0 % of it).
# Not from the free: this machine's command that frees the memory reaches
# the guest at a moment this machine's load decides.
START_RETURNED = 0.01


def returned_share(base_kib: int, peak_kib: int, now_kib: int) -> float:
    """Share of what a touch added to QEMU's RSS (peak - base) that is gone again."""
    added = peak_kib - base_kib
    return (peak_kib - now_kib) / added if added > 0 else 0.0


def at_or_below(base_kib: int, peak_kib: int, share: float) -> int:
    """The highest RSS (KiB) at which ``share`` of the rise is gone: an RSS
    ``kib`` has ``returned_share >= share`` exactly when ``kib`` is at or
    below it (the watcher in L1 compares integers only)."""
    added = max(peak_kib - base_kib, 0)
    # round() first: 0.8 x 5 is 4.000000000000001 in floating point
    return peak_kib - math.ceil(round(share * added, 6))


@dataclasses.dataclass(frozen=True)
class Reporting:
    """QEMU's RSS around one touch and free."""

    reporting: bool
    settled: bool  # the baseline was steady
    base_kib: int
    peak_kib: int
    met: bool  # ON_RETURNED of the rise gone within the window
    last_kib: int
    waited_s: float
    window_s: float
    touched_mib: int = TOUCH_MIB
    # On a host under test: what the watcher in L1 saw; then ``waited_s``
    # and ``window_s`` are L1 seconds (its clock: L1's instructions on icount).
    l1: rss_watch.Watch | None = None
    host_knobs: tuple[str, ...] = ()  # a host under test's boot knobs (HOST_UNDER_TEST_KNOBS)

    @property
    def share(self) -> float:
        return returned_share(self.base_kib, self.peak_kib, self.last_kib)

    @property
    def metric(self) -> str:
        return METRIC if self.l1 is None else L1_METRIC

    def record(self) -> Measurement:
        extra: dict[str, object] = {
            "rss_base_kib": self.base_kib,
            "rss_peak_kib": self.peak_kib,
            "rss_end_kib": self.last_kib,
            "returned_share": round(self.share, 3),
        }
        settings: dict[str, object] = {"guest_mib": GUEST_MIB, "touched_mib": self.touched_mib, "machine": MACHINE}
        if self.host_knobs:
            settings["host_knobs"] = list(self.host_knobs)
        if self.l1 is not None:
            settings |= {
                "timed_by": "L1's /proc/uptime, read in L1 (host/balloon/rss_watch.py)",
                "timed_from": f"the RSS's first fall by {START_RETURNED:.0%} of the rise",
                "poll_us": rss_watch.POLL_US,
            }
            start = self.l1.start
            extra |= {
                "l1_window_s": self.window_s,
                "l1_watched_s": round(self.l1.watched_s, 2),
                "l1_polls": self.l1.polls,
                "l1_resolution_s": round(self.l1.resolution_s, 3),
                "l1_first_kib": self.l1.first.kib,
                "l1_start_kib": start.kib if start is not None else None,
                # from the watcher's first reading (just before the free was
                # sent) to the fall: reporting's 2 s delay, and this machine's
                # command reaching the guest
                "l1_to_start_s": round(start.uptime_s - self.l1.first.uptime_s, 2) if start is not None else None,
                # the guest's reporting passes, 2 s apart: (L1 s, KiB fallen)
                "l1_passes": [list(one) for one in self.l1.passes()],
                # and the guest QEMU's run time over each (ns of L1's clock)
                "l1_pass_cpu_ns": [p.cpu_ns for p in self.l1.pass_work],
                "problems": self.l1.problems() if self.reporting else [],
            }
        return Measurement(
            scenario="balloon.free_page_reporting",
            metric=self.metric,
            unit="s",
            better="lower",
            variant={"free_page_reporting": self.reporting},
            samples=[self.waited_s],
            settings=settings,
            extra=extra,
        )

    def work_record(self) -> Measurement | None:
        """On L1 with reporting on, the guest QEMU's run time over the
        passes per MiB they gave back (``L1_WORK_METRIC``); else None."""
        per_mib = self.l1.cpu_ns_per_mib if self.l1 is not None and self.reporting else None
        if per_mib is None or self.l1 is None:
            return None
        return Measurement(
            scenario="balloon.free_page_reporting",
            metric=L1_WORK_METRIC,
            unit="ns/MiB",
            better="lower",
            variant={"free_page_reporting": self.reporting},
            samples=[per_mib],
            settings={
                "guest_mib": GUEST_MIB,
                "touched_mib": self.touched_mib,
                "machine": MACHINE,
                "timed_by": "the guest QEMU's threads' schedstat in L1, from the poll before each pass's first "
                "fall to its last (host/balloon/rss_watch.py)",
                "poll_us": rss_watch.POLL_US,
                **({"host_knobs": list(self.host_knobs)} if self.host_knobs else {}),
            },
            extra={
                "l1_passes": [dataclasses.asdict(p) for p in self.l1.pass_work],
                "problems": self.l1.problems(),
            },
        )


def held_peak(
    guest: Guest,
    agent: str,
    read: Callable[[int], int],
    touch_mib: int = TOUCH_MIB,
    around_free: Callable[[int, Callable[[], None]], None] | None = None,
) -> int:
    """QEMU's RSS while the agent holds ``touch_mib`` it touched; the agent
    is ended (its memory freed) before this returns.  ``around_free``, given
    the peak and the free, calls the free itself (the watcher in L1 starts
    first).

    Read while held, not after the agent exits: the exit frees 512 MiB,
    and reporting (2 s after a free) can start before the SSH command's
    end reaches the host. Seen once: half the rise was back at the read."""
    hold = guest.ssh.start([agent, "hold", str(touch_mib), str(HOLD_S)])
    try:
        for line in hold.lines(timeout=ALLOCATED_S):
            if "event=allocated" in line:
                peak = read(guest.pid)
                if around_free is not None:
                    around_free(peak, hold.kill)
                return peak
        raise ScenarioFailed(f"the agent ended before it held {touch_mib} MiB: {hold.wait(10).stdout[-300:]!r}")
    finally:
        hold.kill()


def touch_and_free(
    guest: Guest,
    agent: str,
    reporting: bool,
    read: Callable[[int], int] = rss_kib,
    clock_s: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    touch_mib: int = TOUCH_MIB,
) -> Reporting:
    """Touch and free ``touch_mib`` in a guest booted with free page reporting
    on or off, and watch QEMU's RSS fall back.

    The baseline is QEMU's RSS once the guest has run the agent once and
    settled: the first exec after a (warm) start makes QEMU resident some
    25 MiB that stay (measured: 172 -> 197 MiB, then every 512 MiB
    touch-and-free returns to 199 MiB); a baseline before that makes the
    share given back look smaller for reasons that are not reporting's.
    Reporting's work is the guest's and QEMU's: its deadline follows the
    clock; "it does not fall" is watched for the same wall window on every
    clock (under icount an idle guest's clock runs ahead, so the window
    holds more of the guest's time, not less)."""
    guest.ssh.run([agent, "hold", str(WARMUP_MIB), "0"], timeout=120)
    settled, base, _ = wait_rss_steady(
        guest.pid, quiet_s=QUIET_S, deadline_s=DEADLINE_S, clock=clock_s, sleep=sleep, read=read
    )
    peak = held_peak(guest, agent, read, touch_mib)
    window = clock.deadline_s(DEADLINE_S) if reporting else OFF_WINDOW_S
    met, last, waited = wait_rss(
        guest.pid,
        lambda kib: returned_share(base, peak, kib) >= ON_RETURNED,
        deadline_s=window,
        clock=clock_s,
        sleep=sleep,
        read=read,
    )
    return Reporting(reporting, settled, base, peak, met, last, waited, window, touch_mib)


def touch_and_free_on_l1(
    guest: Guest,
    agent: str,
    reporting: bool,
    l1: Shell,
    qemu_pid: int,
    read: Callable[[int], int],
    clock_s: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    touch_mib: int = TOUCH_MIB,
    host_knobs: tuple[str, ...] = (),
) -> Reporting:
    """``touch_and_free`` on a host under test (L1), its guest's QEMU
    ``qemu_pid`` of L1: the baseline and the peak as there (``read`` is
    L1's VmRSS over its SSH: they time nothing), and the return timed in
    L1 by the watcher, on L1's clock, from the RSS's first fall
    (``START_RETURNED``) to ``ON_RETURNED`` of the rise back.

    Its deadlines are L1 seconds from the watcher's start, just before the
    free: ``DEADLINE_S`` with reporting, else the window ``OFF_WINDOW_S``
    in which the RSS must stay up (L1's clock runs on while its guest
    idles under icount, as the guest's does: the same windows hold as
    much of the guest's reporting as on this machine).  ``host_knobs``:
    the words L1 booted with, for the records."""
    guest.ssh.run([agent, "hold", str(WARMUP_MIB), "0"], timeout=120)
    settled, base, _ = wait_rss_steady(
        guest.pid, quiet_s=QUIET_S, deadline_s=DEADLINE_S, clock=clock_s, sleep=sleep, read=read
    )
    window = DEADLINE_S if reporting else OFF_WINDOW_S
    seen: list[rss_watch.Watch] = []

    def around_free(peak: int, free: Callable[[], None]) -> None:
        start, target = at_or_below(base, peak, START_RETURNED), at_or_below(base, peak, ON_RETURNED)
        seen.append(rss_watch.watch(l1, qemu_pid, start, target, window, free))

    peak = held_peak(guest, agent, read, touch_mib, around_free)
    watched = seen[0]
    returned = watched.return_s
    met = returned is not None
    waited = returned if returned is not None else watched.watched_s
    return Reporting(
        reporting, settled, base, peak, met, watched.last.kib, waited, window, touch_mib, watched, host_knobs
    )

"""The free page reporting scenario (scenario 4 of e2e/test_balloon.py):
memory the guest touched and freed leaves QEMU's RSS with reporting on,
and stays without it.  It measures and returns what it saw; the e2e test
asserts (docs/balloon.md)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from memqual.host.balloon.rss import rss_kib, wait_rss, wait_rss_steady
from memqual.host.balloon.scenarios import GUEST_MIB, MACHINE, Guest, ScenarioFailed
from memqual.host.core import clock
from memqual.host.core.record import Measurement

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


def returned_share(base_kib: int, peak_kib: int, now_kib: int) -> float:
    """Share of what a touch added to QEMU's RSS (peak - base) that is gone again."""
    added = peak_kib - base_kib
    return (peak_kib - now_kib) / added if added > 0 else 0.0


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

    @property
    def share(self) -> float:
        return returned_share(self.base_kib, self.peak_kib, self.last_kib)

    def record(self) -> Measurement:
        return Measurement(
            scenario="balloon.free_page_reporting",
            metric="rss_return_s",
            unit="s",
            better="lower",
            variant={"free_page_reporting": self.reporting},
            samples=[self.waited_s],
            settings={"guest_mib": GUEST_MIB, "touched_mib": self.touched_mib, "machine": MACHINE},
            extra={
                "rss_base_kib": self.base_kib,
                "rss_peak_kib": self.peak_kib,
                "rss_end_kib": self.last_kib,
                "returned_share": round(self.share, 3),
            },
        )


def held_peak(guest: Guest, agent: str, read: Callable[[int], int], touch_mib: int = TOUCH_MIB) -> int:
    """QEMU's RSS while the agent holds ``touch_mib`` it touched; the agent
    is ended (its memory freed) before this returns.

    Read while held, not after the agent exits: the exit frees 512 MiB,
    and reporting (2 s after a free) can start before the SSH command's
    end reaches the host. Seen once: half the rise was back at the read."""
    hold = guest.ssh.start([agent, "hold", str(touch_mib), str(HOLD_S)])
    try:
        for line in hold.lines(timeout=ALLOCATED_S):
            if "event=allocated" in line:
                return read(guest.pid)
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

"""virtio-balloon end to end: real guests, real QEMU, QMP.

Scenarios (docs/balloon.md says why each is built the way it is):
1. inflate/deflate timing in a 1 GiB guest down to what it can safely keep
   (its MemAvailable less 64 MiB), 5 repeats (2 quick) alternated with two
   smaller sizes (one quick) that calibrate the transfer-cost model; cross-checked against the
   guest's balloon_inflate counter, MemTotal and QEMU's RSS.
2. sizes: the same in a 2 GiB guest.
3. correctness: odd targets, deflate gives back everything, driver unload
   with the balloon inflated, device_del / device_add of the balloon; the
   floor (stops short, SSH survives) in its own guest.
4. free page reporting on (RSS back near baseline) and off (it stays up).
5. deflate-on-oom: guest memory pressure deflates instead of killing,
   6. guest statistics at their polling interval, invalid intervals refused
   (one guest for both).

All guests are machine type pc: device_del/device_add needs PCI hotplug,
and one machine type keeps the timings comparable across scenarios.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from memqual.e2e.base import GuestTest
from memqual.host.balloon import (
    DEADLINE_S,
    PAGE,
    STALL_S,
    STATS_INTERVAL_MAX,
    BalloonController,
    BalloonMover,
    Drain,
    agent_records,
    drain_percpu_lists,
    find_floor,
    wait_actual,
    wait_no_balloon,
    wait_rss,
    wait_rss_steady,
)
from memqual.host.balloon import model as bm
from memqual.host.balloon import timing as bt
from memqual.host.balloon.agent import GuestClock, GuestTiming
from memqual.host.balloon.table import INFLATE as TIMING_ROW
from memqual.host.balloon.timing import guest_stat
from memqual.host.core import clock
from memqual.host.core import descriptive as stats
from memqual.host.core.errors import BadInput
from memqual.host.core.machine import BalloonDevice, Machine, MachineConfig
from memqual.host.core.polling import poll
from memqual.host.core.record import Measurement

MIB = 1 << 20
AGENT = "balloon_agent"
MACHINE = "pc"
MARGIN_MIB = 64  # left above the floor so the guest can still exec and fault
# Main cycles per guest come from the scenario's row (host/balloon/table.py).
# Quick: 2, with one smaller calibration size (the model needs two sizes),
# about 35 s under TCG here against 57-75 s for 3: no claim's verdict reads
# these records, and what CI must show (every cross-check, the guest's
# resolution, the model's calibration) each cycle shows.  The inflate's CV
# within a run is about 0.07 here: comparisons of this metric are for the
# full profile's 5, or for an A/B's blocks (one cycle, no calibration, a
# fresh guest per block and arm).
TOUCH_MIB = 256  # touched and freed before each timed inflate (RSS cross-check)
CAL_FRACTIONS = (0.5, 0.25)  # smaller inflates for the model's calibration
# What makes the guest's timing finer than the host's QMP polls is its
# clock: CLOCK_MONOTONIC with high-resolution timers resolves 1 ns (a tick,
# 4 ms at HZ=250, without them).  That is asserted, since no load on the
# host changes it.  The gaps between the tracker's polls around each end
# (its measured resolution) are reported, not bounded: 0.11-1.3 ms on a
# quiet host here, but up to 24 ms (one move in twelve; median 0.27 ms)
# with two busy loops beside the guest, and the quick profile's median of
# two moves once came out 5.1 ms under Avocado's default parallelism.
GUEST_CLOCK_RESOLUTION_NS = 1000
# What scenarios 1 and 2 record, in order (memqual bisect --metric reads
# the names here).
TIMING_METRICS = ("inflate_s", "inflate_guest_s", "deflate_guest_s", "deflate_s")
FPR_TOUCH_MIB = 512
FPR_DEADLINE_S = 30.0  # reporting waits 2 s and works in 2 MiB blocks
FPR_OFF_WINDOW_S = 10.0  # how long "it does not fall" is watched
FPR_WARMUP_MIB = 64  # touched and freed once before the baseline is read
FPR_QUIET_S = 3.0  # steady for longer than reporting's 2 s delay before it runs
# "Back": this share of what the touch added is gone again.  Judged on the
# rise, not on the baseline, because the guest's own page cache and slab move
# the baseline by tens of MiB between runs (measured: back to 113% of the
# baseline with 96% of a 512 MiB rise given back; without reporting 0%).
FPR_ON_RETURNED = 0.80
FPR_OFF_RETURNED = 0.25  # without reporting: at most this share of the rise goes
PRESSURE_MIB = 300


def returned_share(base_kib: int, peak_kib: int, now_kib: int) -> float:
    """Share of what a touch added to QEMU's RSS (peak - base) that is gone again."""
    added = peak_kib - base_kib
    return (peak_kib - now_kib) / added if added > 0 else 0.0


def stats_update_window(
    ctl: BalloonController, after: int, since: float, deadline_s: float
) -> tuple[Any, tuple[float, float], float]:
    """Poll guest-stats (every 20 ms, with a deadline) until its last-update
    is newer than ``after``, which the poll started at host time ``since``
    still showed.  Returns the stats, the host-time window the update
    arrived in (from the start of the last poll that did not show it to the
    end of the first that did) and the start of that first poll."""
    starts = [since]  # the start of each poll, after the one at ``since``

    def update() -> tuple[Any, float]:
        starts.append(time.monotonic())
        return ctl.guest_stats(), time.monotonic()

    # 20 ms: the poll period of guest-stats
    polled = poll(
        update,
        deadline_s,
        0.02,
        what="a guest-stats update",
        until=lambda seen: seen[0].last_update > after,
        on_timeout=lambda _: AssertionError(f"guest-stats not updated after {after} within {deadline_s:g} s"),
    )
    stats_now, ended = polled.value
    return stats_now, (starts[-2], ended), starts[-1]


def oom_kills(vm: Machine) -> list[str]:
    return [line for line in vm.ssh.run(["dmesg"]).stdout.splitlines() if "Killed process" in line]


class BalloonBase(GuestTest):
    """
    :avocado: enable
    :avocado: tags=balloon
    """

    def boot_balloon(self, memory_mib: int, **device: Any) -> tuple[Machine, BalloonController, str]:
        vm = self.boot(MachineConfig(memory_mib=memory_mib, machine=MACHINE, balloon=BalloonDevice(**device)))
        return vm, BalloonController(vm, device_id="balloon0"), vm.deploy(AGENT)

    def timing(self, memory_mib: int, touch_mib: int, fractions: tuple[float, ...]) -> None:
        """Scenarios 1 and 2: plan the cycles, measure each, record the run
        (host/balloon/timing.py holds the plumbing)."""
        vm, ctl, agent = self.boot_balloon(memory_mib)
        mover = BalloonMover(ctl, vm.ssh, agent)
        first = guest_stat(vm.ssh, agent)
        full = bt.safe_inflate_bytes(first["mem_available_kib"], MARGIN_MIB)
        run = bt.TimingRun(memory_mib, ctl.ram_bytes(), full, touch_mib, MARGIN_MIB, MACHINE, first)
        for step in bt.plan(TIMING_ROW.sizes_for().repeats, fractions):
            size = int(full * step.fraction) // PAGE * PAGE
            cycle = bt.run_cycle(vm.ssh, ctl, mover, agent, step, size, touch_mib)
            run.cycles.append(cycle)
            self.check_cycle(cycle, first, touch_mib)

        prediction = run.prediction() if fractions else None
        records = run.records(prediction)
        self.assertEqual(tuple(m.metric for m in records), TIMING_METRICS)
        for measurement in records:
            self.record(measurement)
        # The guest's timestamps come from a clock finer than the host's QMP
        # polls can be (QEMU answers between virtqueue requests), and each
        # move spanned more than the gap around either end: the guest
        # timed the move, not one poll's gap.
        self.check_guest_timing(vm, run.guest_inflates + run.guest_deflates)
        if prediction is not None:
            self.log.info("model against seed 003 (predicted ms for 15 of 16 GiB on this host):")
            for row in bm.side_by_side(prediction):
                self.log.info("  %s | seed %s ms | %s | %s", *row)
        seconds = [r.seconds for r in run.inflates]
        self.log.info(
            "inflate %.0f MiB of %d MiB: median %.3f s (%.3f GB/s, CV %.2f); seed 512 KB bitmap %.2f GB/s",
            full / MIB,
            memory_mib,
            stats.median(seconds),
            stats.median([r.moved_bytes / r.seconds / 1e9 for r in run.inflates]),
            stats.cv(seconds),
            bm.seed_gbps(1237),
        )
        self.log.info(
            "guest-timed inflate: median %.3f s at resolution %.2f ms (host-timed resolution %.2f ms)",
            stats.median([g.seconds for g in run.guest_inflates]),
            1e3 * stats.median([g.resolution_s for g in run.guest_inflates]),
            1e3 * stats.median([r.resolution_s for r in run.inflates]),
        )

    def check_guest_timing(self, vm: Machine, timings: list[GuestTiming]) -> None:
        """What a loaded host cannot disturb in the guest's timing: its
        clock's resolution, and that every move spanned its polls."""
        clock = GuestClock.read(vm.ssh)
        self.log.info("guest clock: %s, CLOCK_MONOTONIC resolution %d ns", clock.source, clock.resolution_ns)
        self.assertLessEqual(
            clock.resolution_ns, GUEST_CLOCK_RESOLUTION_NS, f"the guest's clock is coarse: {clock} (no hrtimers?)"
        )
        self.assertTrue(timings, "no move was timed in the guest")
        for timing in timings:
            self.assertLess(
                timing.resolution_s, timing.seconds, f"a move fell between two of the guest's polls: {timing}"
            )
        self.log.info(
            "guest-timed resolution (the gap between polls around each end): median %.2f ms, max %.2f ms",
            1e3 * stats.median([t.resolution_s for t in timings]),
            1e3 * max(t.resolution_s for t in timings),
        )

    def check_cycle(self, cycle: bt.Cycle, first: dict[str, int], touch_mib: int) -> None:
        """What every cycle of the timing scenarios must show."""
        inflate, deflate = cycle.inflate, cycle.deflate
        self.assertTrue(
            inflate.reached, f"inflate to {inflate.host.target_bytes} stopped at {inflate.host.actual_bytes}"
        )
        self.assertTrue(deflate is not None and deflate.reached, "deflate did not return to guest RAM")
        assert deflate is not None and cycle.restored is not None
        if inflate.guest and deflate.guest:
            # On the icount clock a guest second is a count of instructions,
            # not a host second: the windows are on two clocks.
            same_clock = not clock.current().icount
            for host_side, guest_side in ((inflate.host, inflate.guest), (deflate.host, deflate.guest)):
                # The guest's first-to-last window lies inside the host's
                # command-to-reached window, up to both resolutions.
                slack = host_side.resolution_s + guest_side.resolution_s
                if same_clock:
                    self.assertLessEqual(
                        guest_side.seconds,
                        host_side.seconds + slack,
                        f"guest timed {guest_side} against host {host_side}",
                    )
                self.assertGreaterEqual(guest_side.moved, inflate.pages_asked)
        # Every cycle: the guest gives back all it took, to the page.
        self.assertLessEqual(abs(cycle.restored["mem_total_kib"] - first["mem_total_kib"]), PAGE // 1024)
        if not cycle.step.main:
            return
        check = cycle.cross_check()
        pages = check["pages"]
        self.assertLessEqual(
            abs(check["balloon_inflate_delta"] - pages), 0.01 * pages, f"balloon_inflate delta: {check}"
        )
        self.assertLessEqual(abs(check["mem_total_drop_pages"] - pages), 0.01 * pages, f"MemTotal drop: {check}")
        if touch_mib:
            # at least a quarter of the touched pages must leave QEMU's RSS
            self.assertLess(
                check["rss_after_kib"], check["rss_before_kib"] - touch_mib * 1024 // 4, f"RSS did not fall: {check}"
            )


class BalloonTiming(BalloonBase):
    """The timed inflate/deflate cycles (``--only balloon-timing``: the
    balloon's primaries alone, for a short A/B).

    :avocado: enable
    :avocado: tags=balloon,balloon-timing
    """

    def test_inflate_deflate_1g(self) -> None:
        """Scenario 1: 1 GiB guest, timed, cross-checked, model calibrated.

        :avocado: tags=ab
        """
        self.timing(1024, TOUCH_MIB, CAL_FRACTIONS if TIMING_ROW.sizes_for().calibrate else ())

    def test_sizes_2g(self) -> None:
        """Scenario 2, full profile only: the same cycle in a 2 GiB guest
        (about 90 s under TCG; no verdict reads it)."""
        self.require(TIMING_ROW.sizes_for().large_guests, "2 GiB guest only with MEMQUAL_PROFILE=full (CI time)")
        self.timing(2048, 0, ())

    def test_sizes_4g(self) -> None:
        """Scenario 2, full profile only: 4 GiB (about a minute more under TCG)."""
        self.require(TIMING_ROW.sizes_for().large_guests, "4 GiB guest only with MEMQUAL_PROFILE=full (CI time)")
        self.timing(4096, 0, ())


class BalloonCorrectness(BalloonBase):
    """
    :avocado: enable
    :avocado: tags=balloon
    """

    def test_correctness(self) -> None:
        """Scenario 3: odd targets, give-back, unload, hot-unplug/plug (the
        floor has its own test, BalloonFloor: its value is what an A/B
        compares, these checks pass or fail once per arm).

        deflate-on-oom is on, as in the floor's guest.

        :avocado: tags=ab-checks
        """
        vm, ctl, agent = self.boot_balloon(1024, deflate_on_oom=True)
        ram = ctl.ram_bytes()
        first = guest_stat(vm.ssh, agent)

        # Odd targets: what memqual refuses, and what QEMU itself does.
        answers = {}
        for bad in (0, -PAGE):
            with self.assertRaises(BadInput):
                ctl.set_target(bad)
            answer = ctl.qemu_balloon(bad)
            self.assertFalse(answer.accepted, f"QEMU accepted balloon target {bad}")
            # QEMU 7.2 names the argument ('target'), QEMU 10 its QAPI
            # member ('value'); both say what is wrong with it.
            self.assertIn("expects a size", answer.error)
            answers[str(bad)] = answer.error
        with self.assertRaises(BadInput):
            ctl.set_target(ram + PAGE)
        self.assertTrue(ctl.reach(ram // 2, deadline_s=clock.deadline_s(DEADLINE_S)).reached)
        clamped = ctl.reach(2 * ram, deadline_s=clock.deadline_s(DEADLINE_S), checked=False)
        self.assertTrue(clamped.reached and clamped.actual_bytes == ram, "QEMU did not clamp to RAM")
        answers["2*ram"] = "accepted, clamped to RAM (balloon fully deflated)"
        self.assertLessEqual(abs(guest_stat(vm.ssh, agent)["mem_total_kib"] - first["mem_total_kib"]), PAGE // 1024)

        # Unloading the driver with the balloon inflated returns the memory.
        self.assertTrue(ctl.reach(ram // 2, deadline_s=clock.deadline_s(DEADLINE_S)).reached)
        unload = agent_records(vm.ssh.run([agent, "unload"], timeout=60).stdout, "unload")[0]
        self.assertEqual(unload["status"], "0")
        actual, unload_s = wait_actual(ctl, lambda v: v == ram, deadline_s=30)
        self.assertLessEqual(abs(guest_stat(vm.ssh, agent)["mem_total_kib"] - first["mem_total_kib"]), PAGE // 1024)
        ctl.set_target(ram)  # or the reloaded driver inflates to the old target again
        self.assertEqual(agent_records(vm.ssh.run([agent, "load"]).stdout, "load")[0]["module_loaded"], "1")
        self.assertTrue(ctl.reach(ram // 2, deadline_s=clock.deadline_s(DEADLINE_S)).reached)
        self.assertTrue(ctl.reach(ram, deadline_s=clock.deadline_s(DEADLINE_S)).reached)

        # device_del / device_add with the driver loaded.
        vm.qmp("device_del", id="balloon0")
        gone_s = wait_no_balloon(ctl, deadline_s=30)
        bound = vm.ssh.run(["ls", "/sys/bus/virtio/drivers/virtio_balloon"]).stdout.split()
        self.assertFalse([b for b in bound if b.startswith("virtio")], f"driver still bound: {bound}")
        vm.qmp("device_add", driver="virtio-balloon-pci", id="balloon0")
        readd = ctl.reach(ram // 2, deadline_s=clock.deadline_s(DEADLINE_S))  # only a bound driver moves it
        self.assertTrue(readd.reached)
        self.assertTrue(ctl.reach(ram, deadline_s=clock.deadline_s(DEADLINE_S)).reached)
        self.record(
            Measurement(
                scenario="balloon.unload",
                metric="return_s",
                unit="s",
                better="lower",
                samples=[unload_s],
                settings={"guest_mib": 1024, "machine": MACHINE, "deflate_on_oom": True},
                extra={"qemu_answers": answers, "device_del_s": gone_s, "readd_inflate_s": readd.seconds},
            )
        )


class BalloonFloor(BalloonBase):
    """
    :avocado: enable
    :avocado: tags=balloon
    """

    def test_floor(self) -> None:
        """Scenario 3, the floor: asked for 1 MiB the guest stops short,
        memqual backs off by MARGIN_MIB at once, SSH survives (no OOM kill
        in the guest), and deflating gives back everything.

        deflate-on-oom is on here: without it the guest at its floor sits on
        its min watermark and the next kernel allocation (an SSH keepalive
        answered by dropbear, kthreadd forking a kworker) invokes the OOM
        killer, which takes dropbear and then panics the guest ("System is
        deadlocked on memory"): seen in 4 of 18 probes here, see
        docs/balloon.md.  With it on, the OOM notifier deflates 1 MiB
        instead and the probe is safe.  (MemTotal then does not move with the
        balloon; scenario 1, with deflate-on-oom off, checks MemTotal.)

        Before each probe the guest's per-CPU free-page lists are emptied
        (every CPU but the boot CPU cycled offline and online): the balloon
        cannot take pages stranded there, and how many are stranded
        depends on the boot's history (13-24 MiB here), not on the kernel
        (host/balloon/percpu.py).

        :avocado: tags=ab,floor
        """
        vm, ctl, agent = self.boot_balloon(1024, deflate_on_oom=True)
        ram = ctl.ram_bytes()
        first = guest_stat(vm.ssh, agent)
        drains: list[Drain] = []
        floor = find_floor(
            ctl,
            margin_bytes=MARGIN_MIB * MIB,
            stall_s=STALL_S,
            before_probe=lambda: drains.append(drain_percpu_lists(vm.ssh)),
        )
        self.assertTrue(floor.probe.stalled)
        self.assertLess(floor.floor_bytes, ram // 2)
        # Every probe ran with every CPU but the boot CPU drained.
        self.assertEqual(len(drains), len(floor.probes))
        for drain in drains:
            self.assertEqual(len(drain.cpus), vm.config.cpus - 1, f"CPUs drained: {drain.cpus}")
        self.assertEqual(vm.ssh.run(["echo", "alive"]).stdout.strip(), "alive")
        self.assertEqual(oom_kills(vm), [], "the guest OOM-killed at the floor")
        # Deflate gives back everything, to the page.
        self.assertTrue(ctl.reach(ram, deadline_s=clock.deadline_s(DEADLINE_S)).reached)
        self.assertLessEqual(abs(guest_stat(vm.ssh, agent)["mem_total_kib"] - first["mem_total_kib"]), PAGE // 1024)
        self.record(
            Measurement(
                scenario="balloon.floor",
                metric="floor_mib",
                unit="MiB",
                better="lower",
                samples=[floor.floor_bytes / MIB],
                settings={
                    "guest_mib": 1024,
                    "machine": MACHINE,
                    "stall_s": STALL_S,
                    "deflate_on_oom": True,
                    "percpu_drained": True,
                },
                extra={
                    "safe_mib": floor.safe_bytes / MIB,
                    "probe_s": floor.probe.seconds,
                    "probes_mib": [p / MIB for p in floor.probes],
                    "given_back_mib": [g / MIB for g in floor.given_back],
                },
            )
        )


class BalloonFreePageReporting(BalloonBase):
    """
    :avocado: enable
    :avocado: tags=balloon
    """

    def _touch_and_free(self, reporting: bool) -> tuple[int, int, bool, int, float]:
        vm, ctl, agent = self.boot_balloon(1024, free_page_reporting=reporting)
        # The baseline is QEMU's RSS once the guest has run the agent once
        # and settled: the first exec after a (warm) start makes QEMU resident
        # some 25 MiB that stay (measured: 172 -> 197 MiB, then every 512 MiB
        # touch-and-free returns to 199 MiB).  A baseline taken before that
        # makes the share given back look smaller for reasons that are not reporting's.
        vm.ssh.run([agent, "hold", str(FPR_WARMUP_MIB), "0"], timeout=120)
        steady, base, _ = wait_rss_steady(vm.pid, quiet_s=FPR_QUIET_S, deadline_s=FPR_DEADLINE_S)
        self.assertTrue(steady, f"QEMU's RSS did not settle after the warm-up (now {base} KiB)")
        vm.ssh.run([agent, "hold", str(FPR_TOUCH_MIB), "0"], timeout=120)
        peak = ctl.rss_kib()
        self.assertGreater(peak, base + FPR_TOUCH_MIB * 1024 // 2, "touching guest memory did not raise RSS")
        # Reporting's work is the guest's and QEMU's: its deadline follows
        # the clock; "it does not fall" is watched for the same wall window
        # on every clock (under icount an idle guest's clock runs ahead, so
        # the window holds more of the guest's time, not less).
        window = clock.deadline_s(FPR_DEADLINE_S) if reporting else FPR_OFF_WINDOW_S
        met, last, waited = wait_rss(
            vm.pid, lambda kib: returned_share(base, peak, kib) >= FPR_ON_RETURNED, deadline_s=window
        )
        return base, peak, met, last, waited

    def _record(self, reporting: bool, base: int, peak: int, last: int, waited: float) -> None:
        self.record(
            Measurement(
                scenario="balloon.free_page_reporting",
                metric="rss_return_s",
                unit="s",
                better="lower",
                variant={"free_page_reporting": reporting},
                samples=[waited],
                settings={"guest_mib": 1024, "touched_mib": FPR_TOUCH_MIB, "machine": MACHINE},
                extra={
                    "rss_base_kib": base,
                    "rss_peak_kib": peak,
                    "rss_end_kib": last,
                    "returned_share": round(returned_share(base, peak, last), 3),
                },
            )
        )

    def test_reporting_on(self) -> None:
        """Scenario 4: with free-page-reporting=on QEMU's RSS falls back.

        :avocado: tags=ab
        """
        base, peak, met, last, waited = self._touch_and_free(True)
        self._record(True, base, peak, last, waited)
        share = returned_share(base, peak, last)
        self.assertTrue(
            met,
            f"RSS gave back {share:.0%} of the rise, not {FPR_ON_RETURNED:.0%}, {clock.deadline_s(FPR_DEADLINE_S):g} s "
            "after the free "
            f"(base {base} KiB, peak {peak} KiB, now {last} KiB)",
        )

    def test_reporting_off(self) -> None:
        """Scenario 4, control: with it off the RSS stays up (a check:
        its time is the watched window, host/judge/primaries.py).

        :avocado: tags=ab-checks
        """
        base, peak, met, last, waited = self._touch_and_free(False)
        self._record(False, base, peak, last, waited)
        share = returned_share(base, peak, last)
        self.assertFalse(met, "RSS fell back without free page reporting: the control proves nothing")
        self.assertLess(share, FPR_OFF_RETURNED, f"RSS gave back {share:.0%} without free page reporting")


class BalloonOomAndStats(BalloonBase):
    """
    :avocado: enable
    :avocado: tags=balloon
    """

    def test_stats_and_deflate_on_oom(self) -> None:
        """Scenarios 6 then 5 in one deflate-on-oom guest (checks: what
        deflates under a fixed pressure is a race with the allocating agent,
        not a cost a comparison decides on; host/judge/primaries.py).

        :avocado: tags=ab-checks
        """
        vm, ctl, agent = self.boot_balloon(1024, deflate_on_oom=True)

        # 6. statistics.  The driver sends one stats buffer when it probes,
        # so "before" may already be set; what matters is that updates come
        # at the interval and the marker (-1) is gone from the main fields.
        before = ctl.guest_stats()
        refused = {}
        for bad in (-1, STATS_INTERVAL_MAX + 1):
            with self.assertRaises(BadInput):
                ctl.set_stats_interval(bad)
            with self.assertRaises(BadInput) as qemu_says:
                ctl.qemu_set_stats_interval(bad)
            refused[str(bad)] = str(qemu_says.exception)
        periods: dict[int, list[float]] = {}
        brackets: dict[int, list[tuple[float, float]]] = {}
        last = before
        for interval in (1, 2):
            ctl.set_stats_interval(interval)
            self.assertEqual(ctl.stats_interval(), interval)
            last, _, since = stats_update_window(ctl, last.last_update, time.monotonic(), deadline_s=10 * interval)
            seen: list[tuple[float, float]] = []
            for _ in range(3):
                last, window, since = stats_update_window(ctl, last.last_update, since, deadline_s=5 * interval)
                seen.append(window)
            # Each update arrived between the start of the last poll that
            # did not show it and the end of the first that did: a busy
            # host widens these windows, it cannot move an update out of one.
            bounds = [(b[0] - a[1], b[1] - a[0]) for a, b in zip(seen, seen[1:], strict=False)]
            periods[interval] = [b[1] - a[1] for a, b in zip(seen, seen[1:], strict=False)]
            brackets[interval] = bounds
            # QEMU asks for the next update an interval after the last one
            # came (virtio_balloon_receive_stats re-arms its timer): never
            # sooner.  Later only by the guest's answer, which 80 % of the
            # interval allows for.  That timer runs on QEMU's virtual
            # clock: under icount it is the guest's instruction count,
            # which jumps ahead while the guest idles (sleep=off) and
            # lags while it works, so the interval bounds no wall period.
            if not clock.current().icount:
                self.assertTrue(all(high >= interval - 0.01 for _, high in bounds), f"{interval} s, faster: {bounds}")
                self.assertTrue(all(low <= 1.8 * interval for low, _ in bounds), f"{interval} s, slower: {bounds}")
            for key in ("stat-free-memory", "stat-total-memory", "stat-available-memory"):
                self.assertNotEqual(last.stats.get(key, -1), -1, f"{key} still unset")
        ctl.set_stats_interval(0)
        self.record(
            Measurement(
                scenario="balloon.stats",
                metric="stats_update_period_s",
                unit="s",
                better="lower",
                samples=periods[1],
                settings={"interval_s": 1, "machine": MACHINE},
                extra={
                    "period_2s": periods[2],
                    "period_bounds_s": {str(k): v for k, v in brackets.items()},
                    "qemu_refusals": refused,
                    "stats": last.stats,
                    "unset_before_interval": before.unset,
                },
            )
        )

        # 5. deflate-on-oom: pressure with the balloon at floor + margin.
        # (with deflate-on-oom the balloon, not a process, pays at the floor)
        floor = find_floor(ctl, margin_bytes=MARGIN_MIB * MIB, stall_s=STALL_S)
        start = guest_stat(vm.ssh, agent)
        # Watch actual from the host while the guest is under pressure.
        pressure = vm.ssh.start([agent, "pressure", str(PRESSURE_MIB), "16", "90"])
        highest = ctl.actual()
        for _line in pressure.lines(timeout=120):  # one line per 16 MiB step
            highest = max(highest, ctl.actual())
        result = pressure.wait(timeout=30)
        self.assertEqual(result.status, 0, f"pressure agent failed: {result.stdout[-300:]} {result.stderr}")
        self.assertEqual(agent_records(result.stdout, "allocated")[-1]["mib"], str(PRESSURE_MIB))
        # The agent's own last progress line: once it frees, the driver
        # re-inflates to the target, so later guest readings mix both ways.
        deflated = int(agent_records(result.stdout, "progress")[-1]["balloon_deflate"]) - start["balloon_deflate"]
        self.assertGreater(deflated, 0, "the balloon did not deflate under pressure")
        self.assertGreater(highest, floor.safe_bytes, "actual never rose above the target under pressure")
        self.assertTrue(ctl.reach(ctl.ram_bytes(), deadline_s=clock.deadline_s(DEADLINE_S)).reached)
        self.assertEqual(oom_kills(vm), [], "the OOM killer ran despite deflate-on-oom")
        self.record(
            Measurement(
                scenario="balloon.deflate_on_oom",
                metric="deflated_mib",
                unit="MiB",
                better="higher",
                samples=[deflated * PAGE / MIB],
                settings={"guest_mib": 1024, "pressure_mib": PRESSURE_MIB, "machine": MACHINE},
                extra={
                    "floor_mib": floor.floor_bytes / MIB,
                    "safe_mib": floor.safe_bytes / MIB,
                    "highest_actual_mib": highest / MIB,
                },
            )
        )


class BalloonMeasureCommand(BalloonBase):
    """
    :avocado: enable
    :avocado: tags=balloon
    """

    def memqual(self, *argv: str) -> subprocess.CompletedProcess[str]:
        memqual = Path(sys.executable).parent / "memqual"
        return subprocess.run([str(memqual), *argv], capture_output=True, text=True, timeout=600)

    def test_measure_command(self) -> None:
        """`memqual balloon measure`, what a lab engineer runs by hand: a
        real guest inflated and deflated, timed by host and guest; bad
        input refused in one line with exit 2."""
        bad = self.memqual("balloon", "measure", "--memory", "1024", "--target", "4096")
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertEqual(len(bad.stderr.strip().splitlines()), 1, bad.stderr)
        self.assertIn("not below the guest's 1024 MiB", bad.stderr)

        done = self.memqual("balloon", "measure", "--memory", "1024", "--target", "512", "--repeats", "2", "--json")
        self.assertEqual(done.returncode, 0, done.stderr[-1000:])
        result = json.loads(done.stdout)
        self.assertTrue(result["reached"])
        self.assertEqual(result["repeats_done"], 2)
        inflate = result["inflate"]
        self.assertEqual(inflate["host_s"]["n"], 2)
        self.assertGreater(inflate["gbps_host"], 0)
        # The guest's clock (no load changes it), reported by the command;
        # its poll gaps are reported too, and bounded only by each move.
        clock = result["guest_clock"]
        self.assertLessEqual(clock["resolution_ns"], GUEST_CLOCK_RESOLUTION_NS, f"coarse guest clock: {clock}")
        for m in result["moves"]:
            # 512 MiB asked (to the page): the moved bytes say so.
            self.assertEqual(m["inflate"]["moved_bytes"], 512 * MIB)
            for direction in ("inflate", "deflate"):
                move = m[direction]
                self.assertGreaterEqual(move["guest_polls"], 3, f"{direction}: {move}")
                self.assertLess(0, move["guest_resolution_s"], f"{direction}: {move}")
                self.assertLess(move["guest_resolution_s"], move["guest_s"], f"{direction}: {move}")
            self.assertLessEqual(
                m["inflate"]["guest_s"],
                m["inflate"]["host_s"] + m["inflate"]["host_resolution_s"] + m["inflate"]["guest_resolution_s"],
            )
        self.record(
            Measurement(
                scenario="balloon.measure_command",
                metric="inflate_s",
                unit="s",
                better="lower",
                samples=[m["inflate"]["host_s"] for m in result["moves"]],
                settings={"guest_mib": 1024, "target_mib": 512, "machine": "pc"},
                extra={"command_result": result},
            )
        )

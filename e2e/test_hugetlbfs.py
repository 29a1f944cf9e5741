"""Guests whose RAM is 2 MiB hugetlbfs pages, the pages reserved on the host
for the test and given back after it, also after a kill.  The procedures
are host/hugetlbfs/'s; this file boots, calls, records and asserts.

1. balloon: what an inflate gives back, in whole huge pages (its time is
   the primary; anonymous memory beside it; free page reporting the
   control), also under a host under test, on L1's pool
   (host/hugetlbfs/l1_pool.py); 2. ksm (full profile): nothing merges,
   on this machine's ksmd or L1's.
   docs/hugetlbfs.md, docs/host-under-test.md."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from memqual.e2e.base import GuestTest, requires
from memqual.host.balloon.agent import GuestTracker
from memqual.host.balloon.device import BalloonController, BalloonResult
from memqual.host.balloon.driver import VariantDriver
from memqual.host.balloon.timed_move import EVENTS_TIMING, TRACK_PERIOD_US
from memqual.host.core import clock, knobs, nested, scenario
from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import BalloonDevice, MachineConfig
from memqual.host.hugetlbfs import l1_pool, pool
from memqual.host.hugetlbfs import scenarios as hs
from memqual.host.hugetlbfs.table import BALLOON
from memqual.host.ksm import merge as km
from memqual.host.ksm import procfs
from memqual.host.ksm.controller import KsmController
from memqual.host.ksm.l1_ksm import L1Ksm
from memqual.host.ksm.scenarios import ScenarioFailed
from memqual.images import balloon_driver

BALLOON_AGENT = "balloon_agent"
MACHINE = "microvm"


def reserve_and_die(pages: int) -> None:
    """In a child: reserve, then die by SIGKILL holding the reservation."""
    with pool.reserved(pages):
        os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class EventBalloon:
    """The balloon moved by waiting on QEMU's events, no polls: under a
    host under test every query-balloon is work of L1 on the clock that
    times the inflate."""

    ctl: BalloonController

    def ram_bytes(self) -> int:
        return self.ctl.ram_bytes()

    def reach(self, target_bytes: int, deadline_s: float = hs.INFLATE_DEADLINE_S) -> BalloonResult:
        return self.ctl.reach_by_events(target_bytes, deadline_s)


@dataclasses.dataclass(frozen=True)
class OnPool:
    """A guest on a host's pool: the guest, the pool's reads, what was reserved."""

    vm: Machine
    reads: pool.HugePool
    held: pool.Reservation


class HugetlbfsTest(GuestTest):
    """
    :avocado: enable
    :avocado: tags=hugetlbfs
    """

    # A host under test runs everything under TCG, L1's boots included.
    timeout = 900 * (nested.BOOT_TIMEOUT_FACTOR if nested.from_environment() is not None else 1)

    @contextlib.contextmanager
    def reservation(self, memory_mib: int) -> Iterator[pool.Reservation]:
        """The guest's pages reserved, or a skip saying why they cannot be."""
        reason = pool.capability()
        self.require(not reason, reason)
        try:
            with pool.reserved(pool.pages_for(memory_mib)) as held:
                yield held
        except CapabilityMissing as exc:
            self.require(False, str(exc))
        after = pool.read_pool()
        self.assertEqual(after.total, held.before.total, "the reserved huge pages were not given back")

    @contextlib.contextmanager
    def on_pool(self, memory_mib: int, reporting: bool = False) -> Iterator[OnPool]:
        """A guest whose RAM is the pool's: on this machine's pool, reserved
        for the block; under a host under test on L1's, reserved at L1's
        boot (QEMU maps the RAM as L1 starts it) and gone with L1."""
        host = self.host_under_test()
        if host is None:
            with self.reservation(memory_mib) as held:
                yield OnPool(self.boot_on("hugetlbfs", memory_mib, held.mount, reporting), pool.ThisPool(), held)
            return
        held = l1_pool.reservation(memory_mib)
        knob = l1_pool.boot_knob(memory_mib, held.pages)
        vm = self.boot_on("hugetlbfs", memory_mib, held.mount, reporting, host.with_boot_knobs(knob))
        reads = l1_pool.L1Pool(vm.host_ssh)
        found = reads.read_pool().total
        self.require(found == held.pages, f"the host under test booted with {found} huge pages, not the {knob} asked")
        yield OnPool(vm, reads, held)

    def boot_on(
        self,
        backing: str,
        memory_mib: int,
        mount: Path | None = None,
        reporting: bool = False,
        host: nested.HostUnderTest | None = None,
    ) -> Machine:
        extra = pool.backend_args(memory_mib, mount) if mount is not None else ()
        device = BalloonDevice(free_page_reporting=reporting)
        return self.boot(
            MachineConfig(memory_mib=memory_mib, machine=MACHINE, balloon=device, extra_args=extra, warm=False),
            host=host,
        )

    def balloon(self, vm: Machine) -> hs.Balloon:
        """The guest's balloon: polled on this machine (the primary's
        instrument); waited on by its events under a host under test."""
        ctl = BalloonController(vm, device_id="balloon0")
        return ctl if self.host_under_test() is None else EventBalloon(ctl)

    def track(self, vm: Machine, agent: str) -> hs.Track | None:
        """Under a host under test each inflate is timed inside the guest
        too: on icount the guest's clock is L1's, the host's work for the
        inflate counted in it.  On this machine the primary stays the
        host's QMP view, as its spread was measured."""
        if self.host_under_test() is None:
            return None
        bound = int(self.deadline_s())
        return lambda pages: GuestTracker(vm.ssh, agent, "inflate", pages, TRACK_PERIOD_US, bound)

    def deadline_s(self) -> float:
        """An inflate's deadline: under a host under test stretched for the
        clock (L1 on icount runs the guest that much slower)."""
        if self.host_under_test() is None:
            return hs.INFLATE_DEADLINE_S
        return clock.deadline_s(hs.INFLATE_DEADLINE_S)

    def touch(self, vm: Machine, agent: str) -> Callable[[], None]:
        """Touch and free TOUCH_MIB in the guest (the balloon agent's hold)."""

        def touch() -> None:
            vm.ssh.run([agent, "hold", str(hs.TOUCH_MIB), "0"], timeout=120)

        return touch

    def inflates(
        self, vm: Machine, backing: str, repeats: int, reads: pool.HugePool | None = None
    ) -> tuple[hs.Inflate, list[hs.Inflate]]:
        """A sub-page inflate, then ``repeats`` large ones; the pool's free
        pages counted around each through ``reads`` (None: anonymous memory)."""
        balloon = self.balloon(vm)
        agent = vm.deploy(BALLOON_AGENT)
        free = reads.free_pages if reads is not None else None
        touch = self.touch(vm, agent)
        deadline, track = self.deadline_s(), self.track(vm, agent)
        small = hs.inflate(balloon, hs.SMALL_MIB * hs.MIB, backing, free, touch, deadline)
        large = [
            hs.inflate(balloon, hs.LARGE_MIB * hs.MIB, backing, free, touch, deadline, track) for _ in range(repeats)
        ]
        return small, large

    def large_request_inflates(self, vm: Machine, repeats: int, reads: pool.HugePool) -> list[hs.Inflate] | None:
        """The same inflates with the driver variant at LARGE_REQUEST_PFNS
        pages a request, the stock driver back after; None (logged) where
        the variant cannot be built for this image."""
        try:
            variant = balloon_driver.for_image(self.image())
        except CapabilityMissing as exc:
            self.log.info("no large requests: %s", exc)
            return None
        ctl = BalloonController(vm, device_id="balloon0")
        driver = VariantDriver(vm, ctl, variant.ko)
        driver.deploy()
        driver.load(hs.LARGE_REQUEST_PFNS)
        agent = vm.deploy(BALLOON_AGENT)
        touch, deadline, track = self.touch(vm, agent), self.deadline_s(), self.track(vm, agent)
        balloon = ctl if self.host_under_test() is None else EventBalloon(ctl)
        found = [
            hs.inflate(balloon, hs.LARGE_MIB * hs.MIB, "hugetlbfs", reads.free_pages, touch, deadline, track)
            for _ in range(repeats)
        ]
        driver.restore_stock()
        return found

    def test_balloon(self) -> None:
        """The balloon on 2 MiB pages: whole pages back, its time.

        :avocado: tags=ab
        """
        sizes = BALLOON.sizes_for()
        settings: dict[str, object] = {"guest_mib": hs.GUEST_MIB, "touch_mib": hs.TOUCH_MIB, "large_mib": hs.LARGE_MIB}
        if self.host_under_test() is not None:
            settings["host_timing"] = EVENTS_TIMING  # inflate_s is not the polled figure of this machine's records
        with self.on_pool(hs.GUEST_MIB) as on:
            held = on.held
            small, large = self.inflates(on.vm, "hugetlbfs", sizes.repeats, on.reads)
            requested = self.large_request_inflates(on.vm, sizes.repeats, on.reads) if sizes.large_requests else None
            on.vm.shutdown()
        self.record(hs.returned_record(small, large, settings))
        self.record(hs.time_record(large, "hugetlbfs", settings))
        if any(i.guest_seconds is not None for i in large):
            self.record(hs.guest_time_record(large, "hugetlbfs", settings))
        self.log.info(
            "hugetlbfs: %d MiB inflate returned %s huge pages; %d MiB inflates returned %s of at most %s "
            "(pages faulted by each touch %s), in %s s (in the guest: %s s)",
            hs.SMALL_MIB,
            small.returned_pages,
            hs.LARGE_MIB,
            [i.returned_pages for i in large],
            [i.whole_pages_at_most for i in large],
            [i.faulted_pages for i in large],
            [round(i.seconds, 3) for i in large],
            [i.guest_seconds for i in large],
        )
        self.assertEqual(small.returned_pages, 0, "less than one huge page in the balloon gave a huge page back")
        # The guest's memory was in huge pages when the balloon took it (at
        # least half of what it touched): what came back is what the
        # balloon gave, not what was never there.
        in_use = [held.before.free + held.pages - (i.free_before or 0) for i in large]
        self.assertTrue(all(n >= hs.TOUCH_MIB // 4 for n in in_use), f"huge pages in use at the inflates: {in_use}")
        for each in large:
            self.assertEqual(each.moved_bytes, hs.LARGE_MIB * hs.MIB)
            returned = each.returned_pages or 0
            self.assertGreaterEqual(returned, 0, "the pool lost pages while the balloon inflated")
            self.assertLessEqual(returned, each.whole_pages_at_most, "more huge pages back than the balloon holds")
        if requested is not None:
            self.record(hs.returned_record(None, requested, settings, hs.LARGE_REQUEST_PFNS))
            self.log.info(
                "hugetlbfs, %d pages a request: %d MiB inflates returned %s huge pages of at most %s, in %s s "
                "(in the guest: %s s)",
                hs.LARGE_REQUEST_PFNS,
                hs.LARGE_MIB,
                [i.returned_pages for i in requested],
                [i.whole_pages_at_most for i in requested],
                [round(i.seconds, 3) for i in requested],
                [i.guest_seconds for i in requested],
            )
            # Requests that hold whole huge pages give whole pages back,
            # never more than the balloon holds.
            for each in requested:
                self.assertGreater(each.returned_pages or 0, 0, "large requests gave back no huge page")
                self.assertLessEqual(each.returned_pages or 0, each.whole_pages_at_most)
        if sizes.reporting_control:
            with self.on_pool(hs.GUEST_MIB, reporting=True) as on:
                found = hs.reported(
                    on.reads.free_pages,
                    self.touch(on.vm, on.vm.deploy(BALLOON_AGENT)),
                    deadline_s=self.report_deadline_s(),
                )
                on.vm.shutdown()
            self.record(hs.reported_record(found, settings))
            self.log.info(
                "hugetlbfs, free page reporting: %d of %d touched huge pages back after %.1f s",
                found.returned_pages,
                found.touched_pages,
                found.seconds,
            )
            # The count that saw no page come back from the balloon sees
            # reported ones, whole pages, no more than were touched.
            self.assertLessEqual(found.returned_pages, found.touched_pages + pool.pages_for(hs.GUEST_MIB))
        if sizes.anon_reference:
            _, anon = self.inflates(self.boot_on("anon", hs.GUEST_MIB), "anon", sizes.repeats)
            self.record(hs.time_record(anon, "anon", settings))
            if any(i.guest_seconds is not None for i in anon):
                self.record(hs.guest_time_record(anon, "anon", settings))
            self.log.info(
                "anon: %d MiB inflates in %s s (in the guest: %s s)",
                hs.LARGE_MIB,
                [round(i.seconds, 3) for i in anon],
                [i.guest_seconds for i in anon],
            )

    def merge_here(self, backing: str) -> tuple[km.MergeRun, tuple[int, int] | None]:
        """The merge on this machine's ksmd, the guest on ``backing`` (the
        pool reserved here for hugetlbfs), and what KSM merged of the
        guest's RAM under the mount (None: anonymous memory, or no
        per-mapping KSM line in this kernel's smaps)."""
        with contextlib.ExitStack() as stack:
            mount = stack.enter_context(self.reservation(hs.GUEST_MIB)).mount if backing == "hugetlbfs" else None
            ksm = stack.enter_context(KsmController(lock_timeout_s=600.0))
            vm = self.boot_on(backing, hs.GUEST_MIB, mount)
            run = km.run_merge(ksm, vm)
            found = procfs.mapped_ksm_kib(vm.pid, mount) if mount is not None else None
            vm.shutdown()
        return run, found

    def merge_on_l1(self, backing: str) -> tuple[km.MergeRun, tuple[int, int] | None]:
        """The same on L1's ksmd, the guest on L1's pool for hugetlbfs:
        L1 has no knob to put back and ends with its guest."""
        with contextlib.ExitStack() as stack:
            if backing == "hugetlbfs":
                on = stack.enter_context(self.on_pool(hs.GUEST_MIB))
                vm, mount = on.vm, on.held.mount
            else:
                vm, mount = self.boot_on(backing, hs.GUEST_MIB), None
            ksm = L1Ksm.of(vm.host_ssh, vm.pid)
            self.require(ksm.fs.exists(), f"the host under test's kernel has no {ksm.fs.root}")
            try:
                run = km.run_merge(ksm, vm)
            except ScenarioFailed as exc:
                self.fail(str(exc))
            found = None
            if mount is not None:
                smaps = vm.host_ssh.run(["cat", f"/proc/{ksm.qemu_pid}/smaps"], timeout=60).stdout
                found = procfs.parse_mapped_ksm_kib(smaps, mount)
            vm.shutdown()
        return run, found

    def report_deadline_s(self) -> float:
        """Free page reporting's wait: under a host under test the guest
        reports on its own clock, which runs slower than this machine's."""
        if self.host_under_test() is None:
            return hs.REPORT_DEADLINE_S
        return clock.deadline_s(hs.REPORT_DEADLINE_S) * nested.BOOT_TIMEOUT_FACTOR

    @requires(
        lambda: nested.from_environment() is None,
        "a killed run's reservation is this machine's pool, held by a process here, and the next start puts this "
        "machine's nr_hugepages back; a host under test reserves its pool at its boot and ends with its guest, so "
        "nothing of a killed run outlives it: run it without --host-kernel",
    )
    def test_a_killed_run_s_pages_come_back(self) -> None:
        """A run killed while it holds huge pages leaves the pool changed;
        the next start (every knob set of the scenario table) restores it."""
        reason = pool.capability()
        self.require(not reason, reason)
        before = pool.read_pool().total
        child = multiprocessing.get_context("fork").Process(target=reserve_and_die, args=(8,))
        child.start()
        child.join(60)
        self.assertEqual(child.exitcode, -signal.SIGKILL)
        self.assertEqual(pool.read_pool().total, before + 8, "the killed run did not hold its reservation")
        self.assertIn(pool.KNOBS, scenario.knob_sets())
        restored = knobs.restore_every_stale(scenario.knob_sets())
        self.assertEqual([r.what for r in restored], [pool.KNOBS.what])
        self.assertEqual(pool.read_pool().total, before, "the next start did not give the pages back")

    def test_ksm_merges_nothing(self) -> None:
        """Host KSM over identical pages in a hugetlbfs guest and in the
        same guest on anonymous memory: this machine's ksmd, or under a
        host under test L1's, over L1's pool (host/ksm/l1_ksm.py).

        :avocado: tags=slow
        """
        settings: dict[str, object] = {"guest_mib": hs.GUEST_MIB, "agent_mib": km.MERGE_MIB}
        runs = {}
        guest_ram: tuple[int, int] | None = None
        for backing in hs.BACKINGS:
            if self.host_under_test() is None:
                runs[backing], found = self.merge_here(backing)
            else:
                runs[backing], found = self.merge_on_l1(backing)
            guest_ram = found if backing == "hugetlbfs" else guest_ram
            run = runs[backing]
            self.record(hs.ksm_record(backing, run.pages, run.grown, run.baseline, settings))
            self.log.info("ksm on %s: baseline %d, grown %d of %d pages", backing, run.baseline, run.grown, run.pages)
        self.assertGreaterEqual(runs["anon"].grown, 0.9 * runs["anon"].pages, "the fill did not merge on anon memory")
        # QEMU's own anonymous memory (firmware, ROMs, its heap) may merge
        # at any time, the fill's scans included: the guest's RAM is the
        # mapping of the file under the mount, and KSM never merges it.
        self.require(guest_ram is not None, "this kernel's /proc/PID/smaps has no per-mapping KSM line")
        assert guest_ram is not None
        size_kib, merged_kib = guest_ram
        self.log.info(
            "hugetlbfs guest RAM: %d KiB mapped, %d KiB merged; QEMU in all %d pages",
            size_kib,
            merged_kib,
            runs["hugetlbfs"].grown,
        )
        self.assertGreaterEqual(size_kib, hs.GUEST_MIB * 1024, "the guest's RAM is not mapped from the hugetlbfs mount")
        self.assertEqual(merged_kib, 0, "KSM merged pages of a hugetlbfs-backed guest's RAM")

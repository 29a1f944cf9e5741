"""KSM end to end: a real guest, real QEMU, the host's real ksmd.

Scenarios: 1. merge (and mem-merge=off, its control); 2. integrity;
3. volatile scan cost (seed 001, 4 KiB and THP); 4. the guest's own KSM;
5. many guests and the sharing model.  The procedures are host/ksm/'s
(merge.py, volatile.py, guest_ksm.py, sharing.py); this file boots the
guests, calls them, records and asserts directions.  docs/ksm.md says why
each is built the way it is."""

from __future__ import annotations

import contextlib
import os
import time

from memqual.e2e.base import drives_its_host, requires
from memqual.e2e.host_ksm import HostKsmTest
from memqual.host.core import clock, descriptive, nested
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig
from memqual.host.ksm import guest_ksm as gk
from memqual.host.ksm import merge as km
from memqual.host.ksm import scenarios as ks
from memqual.host.ksm import sharing, table, volatile
from memqual.host.ksm.agent import AGENT, StressArgs
from memqual.host.ksm.controller import KsmController
from memqual.host.ksm.l1_ksm import L1Ksm
from memqual.host.ksm.scancost import replicate_first, replicate_ratios, samples
from memqual.host.ksm.volatile import CLAIM_METRIC, VolatileGuest

MODEL_TOLERANCE = 0.15  # many guests, measured here: within 2 % (docs/ksm.md)
# Merged pages per guest, many guests over one alone: 1.0 when nothing
# merges across guests.  Measured 3.3-4.4x with every guest restored from
# one snapshot (identical memory), 1.99-3.35x with cold boots (an A/B's
# blocks, 6.1 and 6.12): between the two.
CROSS_GUEST_GAIN = 1.5
FOREIGN_TOLERANCE = 0.01


class KsmTest(HostKsmTest):
    """
    :avocado: enable
    :avocado: tags=ksm
    """

    # Includes waiting for the host KSM lock held by a sibling test; a host
    # under test runs everything under TCG, L1's ksmd included.
    timeout = 900 * (nested.BOOT_TIMEOUT_FACTOR if nested.from_environment() is not None else 1)

    # -- helpers -----------------------------------------------------------
    def l1_ksm(self, vm: Machine) -> L1Ksm:
        """The KSM of ``vm``'s host under test (its own L1): no lock, no
        snapshot, L1 ends with the guest (host/ksm/l1_ksm.py)."""
        ksm = L1Ksm.of(vm.host_ssh, vm.pid)
        self.require(ksm.fs.exists(), f"the host under test's kernel has no {ksm.fs.root}")
        return ksm

    def host_release(self, vm: Machine | None) -> str:
        """The release of the kernel whose ksmd the scenario measured."""
        if vm is None or self.host_under_test() is None:
            return os.uname().release
        return str(vm.host_ssh.run(["uname", "-r"], timeout=60).stdout.strip())

    # -- 1. merge ------------------------------------------------------------
    def _merge(self, mem_merge: bool) -> None:
        if self.host_under_test() is not None:
            vm = self.boot(MachineConfig(memory_mib=ks.GUEST_MIB, mem_merge=mem_merge))
            with self.scenario():
                run = km.run_merge(self.l1_ksm(vm), vm)
            self.assertEqual(run.agent_status, 0)
            own_merged = 0  # no control region: mem_merge is True here
        else:
            with self.host_ksm() as ksm, contextlib.ExitStack() as stack:
                if not mem_merge:
                    stack.enter_context(km.host_mergeable(km.CONTROL_MIB))
                vm = self.boot(MachineConfig(memory_mib=ks.GUEST_MIB, mem_merge=mem_merge))
                run = km.run_merge(ksm, vm)
                self.assertEqual(run.agent_status, 0)
                own_merged = ksm.process(os.getpid()).merging_pages or 0
        pages, grown, agent_merged, proc = run.pages, run.grown, run.agent_merged, run.process
        self.assertEqual(run.bad_pages, 0, f"guest pages changed: {run.verify}")
        self.log.info(
            "merge mem_merge=%s: baseline %d, grown %d of %d pages, 90%% after %s s",
            mem_merge,
            run.baseline,
            grown,
            pages,
            run.seconds_to_90pct,
        )
        self.record(run.record(mem_merge))
        if mem_merge:
            self.assertGreaterEqual(
                grown, 0.9 * pages, f"only {grown} of {pages} pages merged after 3 full scans (baseline {run.baseline})"
            )
            self.assertGreaterEqual(
                agent_merged, 0.9 * pages, f"of the merged pages only {agent_merged} were the agent's ({pages} filled)"
            )
        else:
            self.assertGreaterEqual(
                own_merged,
                0.9 * km.CONTROL_MIB * 256,
                "ksmd did not merge the host control region: it was not scanning",
            )
            self.assertEqual(proc.merging_pages, 0, f"mem-merge=off, yet QEMU has merged pages: {proc.stat}")
            self.assertEqual(proc.stat_int("ksm_rmap_items") or 0, 0, "mem-merge=off, yet ksmd tracks QEMU pages")

    def test_merge(self) -> None:
        """Scenario 1: one-byte fill merges within 3 full scans.

        :avocado: tags=ab,ksm-merge
        """
        self._merge(mem_merge=True)

    @requires(
        lambda: nested.from_environment() is None,
        "the control's mergeable region is memqual's own memory on this machine, and no memqual process runs in "
        "the host under test: run it without --host-kernel",
    )
    def test_merge_off(self) -> None:
        """Scenario 1, negative control: -machine mem-merge=off (a check:
        nothing may merge, host/ksm/table.py).

        :avocado: tags=ab-checks
        """
        self._merge(mem_merge=False)

    # -- 2. integrity --------------------------------------------------------
    def test_integrity(self) -> None:
        """Scenario 2: merge, break with distinct tails, unmerge, verify."""
        if self.host_under_test() is not None:
            vm = self.boot(MachineConfig(memory_mib=ks.GUEST_MIB))
            with self.scenario():
                run = km.run_integrity(self.l1_ksm(vm), vm)
        else:
            with self.host_ksm() as ksm:
                vm = self.boot(MachineConfig(memory_mib=ks.GUEST_MIB))
                run = km.run_integrity(ksm, vm)
        merged, after_tail, unmerged, verify = run.merged, run.after_tail, run.unmerged, run.verify
        self.log.info(
            "integrity: merged %d, after tails %d, after run=2 %d, verify %s", merged, after_tail, unmerged, verify
        )
        self.record(run.record())
        self.assertEqual(run.bad_pages, 0, f"pages corrupted across merge/COW/unmerge: {verify}")
        # Pages equal but for their last 96 bytes must never be merged: every
        # merged agent page leaves the merged count (other guest pages, e.g.
        # memory the kernel zeroed meanwhile, may merge at the same time).
        self.assertGreaterEqual(
            merged - after_tail,
            0.95 * run.pages,
            f"pages differing only in their tails stayed merged ({merged} -> {after_tail})",
        )
        self.assertEqual(unmerged, 0, "run=2 left QEMU pages merged")
        self.assertEqual(run.control_bad_pages, 5, f"the checker missed corrupted pages: {run.control}")
        self.assertEqual(run.agent_status, 1, "ksm_stress must exit 1 when a verify finds bad pages")

    # -- 3. volatile scan cost ----------------------------------------------
    def volatile_sizes(self) -> table.VolatileSizes:
        return table.volatile_sizes(table.VOLATILE_SCAN.sizes_for(), self.host_under_test() is not None)

    def _volatile(self, pages: str) -> None:
        guests: list[VolatileGuest] = []
        count = self.volatile_sizes().guests
        host = self.host_under_test()
        if host is not None:
            # Each guest has its own L1, booted in THP's mode (guest RAM is
            # faulted in as L1 starts the guest), its KSM prepared afresh.
            started = time.monotonic()
            release = ""
            for index in range(count):
                vm = self.boot(
                    MachineConfig(memory_mib=ks.GUEST_MIB), host=host.with_boot_knobs(volatile.THP_AT_BOOT[pages])
                )
                ksm = self.l1_ksm(vm)
                release = self.host_release(vm)
                with self.scenario():
                    self._check_volatile_host(ksm)
                    volatile.prepare_volatile(ksm, pages)
                guests.append(
                    self._volatile_guest(ksm, vm, pages, index, volatile.retries_left(guests), volatile.ALONE_TOLERANCE)
                )
            self._record_volatile(pages, guests, time.monotonic() - started, release)
            return
        with self.host_ksm() as this_host:
            started = time.monotonic()  # the scenario's own time, not the wait for the lock
            self._check_volatile_host(this_host)
            volatile.prepare_volatile(this_host, pages)
            for index in range(count):
                vm = self.boot(MachineConfig(memory_mib=ks.GUEST_MIB))
                guests.append(self._volatile_guest(this_host, vm, pages, index, volatile.retries_left(guests)))
        self._record_volatile(pages, guests, time.monotonic() - started, os.uname().release)

    def _check_volatile_host(self, ksm: KsmController | L1Ksm) -> None:
        """A host kernel without smart scan (before 6.7) is measured too,
        without it: a host kernel A/B compares its scans with the other's."""
        self.require(ksm.thp.exists(), "the host has no transparent huge pages (/sys/kernel/mm/transparent_hugepage)")
        self.require(
            ksm.fs.has("smart_scan") == ksm.fs.has("pages_skipped"),
            "the host kernel has smart_scan without pages_skipped, or the reverse: not a kernel memqual knows",
        )

    def _volatile_guest(
        self,
        ksm: ks.KsmHost,
        vm: Machine,
        pages: str,
        index: int,
        retries: int,
        tolerance: float = volatile.SHARED_HOST_TOLERANCE,
    ) -> VolatileGuest:
        """One replicate: a fresh guest runs the seed's workload, ksmd
        settles on it, smart_scan 0 and 1 are measured in ABBA order (the
        first variant alternating between guests), and the guest goes away
        before the next one starts, so it never shares a scan with it."""
        sizes = self.volatile_sizes()
        try:
            # The first variant alternates between guests, and between
            # blocks in an A/B (one guest a block).
            return volatile.volatile_guest(
                ksm,
                vm,
                pages,
                first=replicate_first(self.first_unit() + index),
                retries=retries,
                windows=sizes.windows,
                reference_scans=sizes.reference_scans,
                smart_windows=sizes.smart_windows,
                on_window=lambda w: self.log.info("guest %d window %s", index + 1, w.to_json()),
                tolerance=tolerance,
            )
        except ks.ScenarioFailed as exc:
            raise self.failureException(f"guest {index + 1}: {exc}") from exc
        finally:
            vm.shutdown()

    def _record_volatile(self, pages: str, guests: list[VolatileGuest], duration_s: float, release: str) -> None:
        runs = [g.run for g in guests]
        agent_pages = volatile.VOLATILE_MIB * 256
        sizes = self.volatile_sizes()
        settings = volatile.volatile_settings(
            sizes.windows,
            sizes.guests,
            sizes.reference_scans,
            sizes.smart_windows,
            from_mark=self.host_under_test() is not None,
        )
        limit = volatile.skip_limit(release)
        records = volatile.volatile_records(pages, guests, settings, limit=limit, duration_s=duration_s)
        for record in records:
            self.record(record)
        ratios = replicate_ratios(runs, CLAIM_METRIC)
        self.log.info(
            "volatile %s: over %d guests (per guest %s), skip share %s, dirty passes per scan %s; %.0f s",
            pages,
            len(runs),
            ", ".join(f"{r:.2f}" for r in ratios),
            ", ".join(f"{g.skip_share:.3f}" for g in guests),
            ", ".join(f"{g.dirty_passes_per_scan:.2f}" for g in guests),
            duration_s,
        )
        # The workload must really be the seed's: volatile pages throughout.
        volatile_pages = min(w.pages_volatile for r in runs for w in r.windows[0])
        self.assertGreaterEqual(volatile_pages, 0.8 * agent_pages, "the guest's pages were not volatile")
        if not any(r.windows[1] for r in runs):
            # A kernel without smart scan: ksmd went over every page.
            self.assertTrue(all(w.pages_skipped == 0 for r in runs for w in r.windows[0]), "pages skipped")
            return
        self.assertGreater(
            descriptive.median(samples([w for r in runs for w in r.windows[1]], "pages_skipped_per_scan")),
            0.5 * agent_pages,
            "smart scan skipped too few of the volatile pages",
        )
        # Only the direction, guest by guest: the claim's verdict over the
        # guests (or an A/B's blocks) is the report's (memqual.host.judge.claims),
        # and the seed's 8x / 16x was for another mechanism.
        self.assertTrue(
            all(r > 1 for r in ratios), f"smart scan made ksmd's scans dearer per page in a guest: {ratios}"
        )

    def test_volatile_scan_4k(self) -> None:
        """Scenario 3: smart scan against the seed's workload, 4 KiB pages.

        :avocado: tags=ab,ksm-volatile
        """
        self._volatile("4k")

    @drives_its_host
    def test_volatile_scan_thp(self) -> None:
        """Scenario 3: the same with THP-backed guest RAM (exploratory in an
        A/B: the host's huge page splits weigh in, host/ksm/table.py; left
        to the quick profile).

        :avocado: tags=ksm-volatile
        """
        self._volatile("thp")

    # -- 4. guest-side KSM ---------------------------------------------------
    def test_guest_ksm(self) -> None:
        """Scenario 4: the guest kernel's own ksmd merges the agent's pages.

        :avocado: tags=ab,ksm-merge
        """
        # mem-merge=off: host KSM has no part here, and this guest's pages
        # must not disturb a sibling test's host ksmd measurement.
        vm = self.boot(MachineConfig(memory_mib=ks.GUEST_MIB, mem_merge=False))
        guest = gk.GuestKsm(vm.ssh)
        self.require(guest.writable(), f"guest kernel has no writable {guest.root}")
        path = vm.deploy(AGENT)
        # Bad input first: more than the guest has is one clear line, exit 4.
        too_big = ks.GUEST_MIB * 4
        result = vm.ssh.run(StressArgs(mib=too_big, phases=["fill"], timeout_s=30).argv(path), check=False)
        self.assertEqual(result.status, 4, f"an impossible size must exit 4: {result}")
        self.assertRegex(result.stdout, rf"event=error reason=alloc size_mib={too_big} guest_mem_mib=\d+")
        self.assertIn(f"cannot allocate {too_big} MiB: the guest has", result.stderr)

        with self.scenario():
            run = gk.run_guest_ksm(vm, path)
        self.assertEqual(run.agent_status, 0)
        self.record(run.record())
        self.assertGreaterEqual(run.merged, 0.9 * run.pages, f"guest ksmd merged {run.merged} of {run.pages} pages")
        self.assertEqual(run.after_unmerge, 0, "guest run=2 left pages merged")
        self.assertEqual(run.bad_pages, 0, f"guest pages changed: {run.verify}")

    # -- 5. many guests ------------------------------------------------------
    @requires(
        lambda: nested.from_environment() is None,
        "each guest under a host under test has its own L1, so no two share a ksmd: run it without --host-kernel",
    )
    def test_many_guests(self) -> None:
        """Scenario 5: identical guests share memory across guests; the
        saving follows saved(n) = (n - 1) U + n I; re-merges are timed.

        :avocado: tags=ab
        """
        config = MachineConfig(memory_mib=sharing.MANY_GUEST_MIB)
        many_guests = table.MANY.sizes_for().guests
        with self.host_ksm() as ksm:
            run = sharing.run_many_guests(
                ksm,
                lambda: self.boot(config),
                many_guests,
                table.MANY.sizes_for().remerge_repeats,
                note=self.log.info,
                pause=clock.current().icount,
            )
        for measurement in run.records():
            self.record(measurement)

        per_guest, alone, foreign, predicted = run.per_guest, run.alone, run.foreign, run.predicted
        self.assertGreaterEqual(
            per_guest,
            CROSS_GUEST_GAIN * alone,
            f"with {many_guests} guests each merged {per_guest:.0f} pages, alone {alone}: little merged across guests",
        )
        # The model uses host-wide counters: they must be this test's alone.
        self.require(
            foreign <= FOREIGN_TOLERANCE,
            f"other processes on this host hold KSM-merged pages ({foreign:.1%} of the merged): "
            "the host-wide counters the model needs are not this test's alone",
        )
        self.assertLessEqual(
            abs(run.settled.pages_sharing - predicted),
            MODEL_TOLERANCE * predicted,
            f"saved({many_guests}) = {run.settled.pages_sharing} pages, the model says {predicted:.0f} "
            f"(I = {run.model.intra_pages:.0f}, U = {run.model.common_pages:.0f})",
        )

"""The host under test's own memslot search, counted: on a host kernel
built with images/kvm-memslots/ (``--host-kernel``), guest/kvm_lookup.c
runs in L1 and every count the kernel makes must be the model's, on
kvm_lookup.py's layout and on seed 000's guest's.  Without a host kernel,
or on one that does not count, the test is cancelled with the reason.
docs/memslots-kvm.md, "The lookup benchmark in L1".

Run: ``MEMQUAL_HOST_KERNEL=<a kvm-memslots kernel> avocado run e2e/test_memslots_l1.py``
or ``memqual run --host-kernel K --only memslots``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from memqual.e2e.base import GuestTest
from memqual.host.core.errors import GuestError
from memqual.host.core.machine import MachineConfig
from memqual.host.memslots import (
    kvm2011,
    kvm_bench,
    kvm_results,
    l1_faults,
    l1_layout,
    l1_lookup,
    l1_netperf,
    l1_slots,
    seed_layout,
)

Counted = TypeVar("Counted")

# The slot counts of MemslotsKvm's slot operations (test_memslots_kvm.py).
SLOT_COUNTS = (1, 32, 509)
# Every miss searches the slots again only without KVM's MMIO cache.
UNCACHED = "kvm.mmio_caching=0"


class MemslotsOnTheHostUnderTest(GuestTest):
    """
    :avocado: enable
    :avocado: tags=memslots,host-under-test
    """

    # Its figures are L1's own counts and L1's clock: it shares the host.
    counts_only_its_guests = True

    def test_the_kernels_counts_are_the_models(self) -> None:
        host = self.host_under_test()
        self.require(
            host is not None,
            "no host under test: run with --host-kernel (MEMQUAL_HOST_KERNEL) naming a kernel built with "
            "images/kvm-memslots/ (docs/memslots-kvm.md)",
        )
        assert host is not None
        vm = self.boot(MachineConfig(memory_mib=256, cpus=1, machine="microvm"), host=host.with_boot_knobs(UNCACHED))
        vm.qmp("stop")  # its vCPU would add L1 work the passes do not subtract
        uniform = l1_lookup.run(vm.host_ssh, l1_lookup.L1LookupConfig(slots=(1, 32), iterations=200, rounds=1))
        self.require(
            all(run.counted for run in uniform.runs),
            f"the host kernel {host.name} does not count its memslot search: build it with "
            "images/kvm-memslots/0001 (images/kvm-memslots/README.md)",
        )
        misses = [c for run in uniform.runs for c in run.checks if c.kind == "miss"]
        for check in misses:
            self.log.info("%d slots, %s: %s", check.slots, check.structure, check.note)
        self.assertEqual(len(misses), 2, "a slot count without a counted miss")
        self.assertEqual(uniform.findings(), [], "the kernel's counts differ from the model's")
        self.assertTrue(all(c.verdict == l1_lookup.AGREES for c in misses), [c.note for c in misses])

        # Seed 000's guest on seed 000's host (its private slots at 32-34).
        seed = seed_layout.load()
        on_host = kvm2011.on_host(seed.layout, kvm2011.DEFAULT_HOST)
        lookup = l1_layout.LayoutLookup(on_host, seed.miss_gfn, iterations=200, host_2011=kvm2011.DEFAULT_HOST.name)
        on_seed = l1_layout.run(vm.host_ssh, lookup)
        self.log.info("seed 000's guest: %s", [c.note for c in on_seed.run.checks])
        self.assertEqual([c.verdict for c in on_seed.run.checks if c.kind == "miss"], [l1_lookup.AGREES])

    def counted_by_slot(self, measure: Callable[[], Counted], host: str) -> Counted:
        """``measure()``, or a skip where the host kernel does not count its
        searches by slot (a kernel without 0001's ``memslot_slots``)."""
        try:
            return measure()
        except GuestError as exc:
            self.require("memslot_slots" not in str(exc), f"the host kernel {host} does not count by slot: {exc}")
            raise

    def test_a_guests_faults_counted_by_kind_and_each_hit_as_the_model_walks(self) -> None:
        """Seed 000's guest faults in fresh pages under shadow paging: every
        fault searches the slots, so RAM hits must dominate the window, and
        each hit slot's nodes (on an uncached search) must be the model's."""
        host = self.host_under_test()
        self.require(host is not None, "no host under test: run with --host-kernel (MEMQUAL_HOST_KERNEL)")
        assert host is not None
        shadow = host.with_boot_knobs(*l1_faults.CONDITIONS["2011-shadow"])
        config = l1_faults.GUEST.machine_config()
        vm = self.boot(config, host=shadow)
        boot = self.counted_by_slot(lambda: l1_faults.measure(vm, "2011-shadow", touch_mib=16, runs=1), host.name)
        self.log.info("%s: %s", boot.structure, " | ".join(l1_faults.render([boot], host.name, vm.clock.label)))
        # 4096 pages touched, each a shadow page fault that searches.
        self.assertGreater(boot.kinds.ram_hits, 4096, "fewer RAM hits than pages faulted in under shadow paging")
        self.assertGreater(boot.kinds.ram_hits, boot.kinds.misses)
        self.assertEqual(boot.kinds.unattributed, 0, "searches that found a slot no longer listed")
        self.assertEqual(boot.findings(), [], "a slot's nodes per hit differ from the model's")

    def test_tcp_rr_over_the_rtl8139_misses_on_every_transaction(self) -> None:
        """Seed 000's netperf under 2011's MMIO path: the guest's rtl8139
        (8139cp, its memory BAR) and xAPIC are emulated, so every
        transaction must miss every slot at least once, and the emulator's
        reads of guest memory hit its RAM slots."""
        host = self.host_under_test()
        self.require(host is not None, "no host under test: run with --host-kernel (MEMQUAL_HOST_KERNEL)")
        assert host is not None
        npt = host.with_boot_knobs(*l1_faults.CONDITIONS["2011-npt"])
        vm = self.boot(l1_netperf.GUEST.machine_config(), host=npt)
        boot = self.counted_by_slot(lambda: l1_netperf.measure(vm, "2011-npt", transactions=200, runs=1), host.name)
        self.log.info("%s: %s", boot.structure, " | ".join(l1_netperf.render([boot], host.name, vm.clock.label)))
        self.assertGreater(boot.per_transaction("miss"), 1.0, "a transaction without a complete miss")
        self.assertGreater(boot.kinds.ram_hits, 0, "the emulator read no guest memory")
        self.assertEqual(boot.kinds.unattributed, 0, "searches that found a slot no longer listed")
        self.assertEqual(boot.findings(), [], "a slot's nodes per hit differ from the model's")


class MemslotsKvmInL1(GuestTest):
    """
    The slot operations of test_memslots_kvm's ``MemslotsKvm`` in the
    host under test: the same VMs, probes and guest passes by
    guest/kvm_slots.c on L1's /dev/kvm, its guest stopped, timed on L1's
    clock (host/memslots/l1_slots.py).  It records memslots.kvm_l1, so an
    A/B of host kernels decides the host's slot updates; on this machine
    ``MemslotsKvm`` runs them, and this test is cancelled.

    :avocado: enable
    :avocado: tags=memslots,kvm-slots,host-under-test
    """

    # The guest L1 must run (its rc.host starts one): the smallest, stopped.
    GUEST_MIB = 256

    def test_errnos_and_slot_operation_times(self) -> None:
        """Invalid regions fail with the errno the kernel documents, a
        guest touches every slot and exits on every gap frame, and setup,
        move and delete of 1, 32, 509 slots take a positive time on L1's
        clock, in L1.

        :avocado: tags=ab
        """
        self.require(
            self.host_under_test() is not None,
            "it runs the slot operations in a host under test's L1: give --host-kernel (MemslotsKvm runs them here)",
        )
        vm = self.boot(MachineConfig(memory_mib=self.GUEST_MIB, cpus=1))
        # Nothing of the guest runs in L1 while its KVM is measured.
        vm.qmp("stop")
        config = l1_slots.L1SlotsConfig(kvm_bench.BenchConfig(slots=SLOT_COUNTS, repeats=3))
        result = l1_slots.run(vm.host_ssh, config, self.environment())
        doc = kvm_results.summarize(result)
        for record in kvm_results.records(result):
            self.record(record)
        self.log.info("summary: %s", {k: v for k, v in doc.items() if k != "runs"})
        for probe in doc["probes"]:
            self.assertEqual(probe["observed"], probe["expected"], probe["description"])
        self.assertIsNone(result.vcpu_error, "L1's KVM did not run the flat protected-mode guest")
        self.assertEqual([r["slots"] for r in doc["runs"]], list(SLOT_COUNTS))
        for run in doc["runs"]:
            n = run["slots"]
            checks = run["vcpu_checks"]
            self.assertEqual(checks["touched_ok"], [n] * 3, f"{n} slots: a write landed in another slot")
            self.assertEqual(checks["mmio_exits"], [n] * 3, f"{n} slots: a gap frame did not exit")
            self.assertEqual(checks["mmio_mismatches"], [0] * 3, f"{n} slots: an MMIO exit at the wrong place")
            for key in ("setup_s_per_slot", "move_s_per_slot", "delete_s_per_slot"):
                self.assertTrue(math.isfinite(run[key]) and run[key] > 0, f"{n} slots: {key} = {run[key]}")

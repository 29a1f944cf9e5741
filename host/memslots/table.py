"""The memslots' rows in the scenario table (host/core/scenario.py): the
/dev/kvm lookup bench's sizes per profile, the host-only negative controls
and the MMIO trace's primary."""

from __future__ import annotations

import dataclasses

from memqual.host.core import host_code
from memqual.host.core.primary import (
    COUNT,
    GUEST_CLOCK,
    MID_MARGIN,
    TIGHT_MARGIN,
    WALL_612,
    WIDE_MARGIN,
    Measured,
    Primary,
    Spread,
)
from memqual.host.core.profiles import AB, FULL, QUICK
from memqual.host.core.scenario import Scenario


@dataclasses.dataclass(frozen=True)
class LookupSizes:
    """The /dev/kvm lookup bench in one profile."""

    replicates: int  # fresh VMs per slot count
    all_slots: bool  # the full slot-count curve, not the quick points


LOOKUP = {
    QUICK: LookupSizes(replicates=3, all_slots=False),
    FULL: LookupSizes(replicates=6, all_slots=True),
    AB: LookupSizes(replicates=1, all_slots=False),
}

# The /dev/kvm benchmarks run on the host alone, no guest kernel in them:
# negative controls (Scenario.control).  Their host code is KVM's memslot
# updates and search (Scenario.host_paths), on this machine's /dev/kvm: under
# a host under test they are skipped (KVM_L1 below runs the slot
# operations there; memqual memslots kvm --lookup --host-kernel is the
# lookup benchmark's way into L1).
KVM: Scenario[object] = Scenario(
    "memslots.kvm",
    ("memslots", "kvm", "ab"),
    e2e="test_memslots_kvm:MemslotsKvm.test_errnos_and_slot_operation_times",
    control=True,
    host_paths=host_code.KVM,
    off_a_host_under_test="it drives this machine's /dev/kvm from memqual's Python; in L1 memslots.kvm_l1 runs the "
    "same slot operations",
)
KVM_LOOKUP = Scenario(
    "memslots.kvm_lookup",
    ("memslots", "kvm", "ab"),
    LOOKUP,
    e2e="test_memslots_kvm:MemslotsKvm.test_lookup_cost_by_slot_count",
    control=True,
    host_paths=host_code.KVM,
    off_a_host_under_test="it drives this machine's /dev/kvm; in L1 it is `memqual memslots kvm --lookup "
    "--host-kernel KERNEL`",
)
# The memslot tests' own icount A/A (quiet host, 36 runs PASS).
ICOUNT_AA = Measured(
    "A/A 6.1.0-57, icount:4, memslots, 6 blocks",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock icount --only memslots "
    "--rounds 6",
    "2026-12-04",
    'docs/ab-calibration.md, "The icount A/A of KSM"',
)
# The guest code the hotplugged dimms run (Scenario.kernel_paths); the
# controls run none (host-only /dev/kvm: KVM's code is the host's).  The
# trace's count names no host code: QEMU's trace events replayed through
# memqual's model, which no host kernel computes.
MEMORY_HOTPLUG_PATHS = (
    "mm/memory_hotplug.c",
    "include/linux/memory_hotplug.h",
    "drivers/base/memory.c",
    "include/linux/memory.h",
    "drivers/acpi/acpi_memhotplug.c",
)
TRACE_MMIO: Scenario[object] = Scenario(
    "memslots.trace_mmio",
    ("memslots", "qemu", "ab"),
    primaries=(
        Primary(
            "nodes_per_lookup",
            "the guest's MMIO trace through today's memslot tree (rbtree); the other structures replay the "
            "same trace, so they move only when this does",
            variant=(("structure", "rbtree"),),
            instrument=COUNT,
            spread_wall=Spread(0.0, 2, WALL_612),
            spread_icount=Spread(0.0, 6, ICOUNT_AA),
            margin=TIGHT_MARGIN,
        ),
    ),
    e2e="test_memslots_qemu:MemslotsQemu.test_layout_applied_checked_probed_and_traced",
    kernel_paths=MEMORY_HOTPLUG_PATHS,
    off_a_host_under_test="its count is QEMU's trace replayed through memqual's model, which no host kernel "
    "computes; the memslot search kernels measure L1's own (memqual memslots kvm --faults --host-kernel)",
)

# The slot operations of KVM in the host under test (guest/kvm_slots.c in
# L1, on L1's clock): there the host is the subject, so the row decides
# an A/B of host kernels where KVM's is a control.
# 6.1 against 6.12 as hosts under test, 10 blocks in 2 min 42 s: 6.1's
# figures repeat from block to block (the paired A/A of 6.1 spread 0.056 %
# a block: A and B of a block boot from the same inputs), 6.12's setup
# moves with each block's boot inputs by 0.82 %, so their ratio did too.
L1_612_SLOTS = Measured(
    "6.1.0-57 against 6.12.111 as hosts under test (L1 on icount:0), 10 blocks: the slot operations in L1",
    "memqual run --host-kernel 6.1.0-57-amd64 --host-kernel 6.12.111+deb12-amd64 --clock icount --only kvm-slots "
    "--until-decided --output OUT",
    "2026-12-07",
    'docs/memslots-kvm.md, "The slot operations in L1"',
)
AT_509 = (("slots", 509),)


def slot_primary(metric: str, why: str, spread: Spread) -> Primary:
    """A figure of the slot operations at 509 slots (the most a 2011 host's
    guest could not have; 32764 costs a minute of L1 a block) as L1's clock
    reads it in L1: its spread there and the margin that spread allows."""
    return Primary(
        metric,
        why,
        AT_509,
        # L1 reads it on its own clock, which is icount's: its guest's
        # clock, the instrument a host under test's figures are read with.
        instrument=GUEST_CLOCK,
        spread_host_under_test=spread,
        margin=WIDE_MARGIN,
        margin_host_under_test=MID_MARGIN,
    )


KVM_L1: Scenario[object] = Scenario(
    "memslots.kvm_l1",
    ("memslots", "kvm-slots", "ab"),
    primaries=(
        slot_primary(
            "setup_s_per_slot",
            "a memslot added to a VM of 509 (KVM_SET_USER_MEMORY_REGION): what a guest's boot and every hotplug pay "
            "in KVM's slot update, which the memslot structure decides (its move, delete, fault and MMIO exit are "
            "beside it, exploratory)",
            Spread(
                0.0082,
                10,
                L1_612_SLOTS,
                how="the sd of log(B/A) over the 10 blocks, all of it 6.12's: the paired A/A of 6.1 spread 0.056 % "
                "(memqual run --host-kernel 6.1.0-57-amd64 --host-kernel 6.1.0-57-amd64 --clock icount --only "
                "kvm-slots --rounds 6), which boots A and B of a block from the same inputs and so hides what moves "
                "with them",
            ),
        ),
    ),
    e2e="test_memslots_l1:MemslotsKvmInL1.test_errnos_and_slot_operation_times",
    host_paths=host_code.KVM,
    on_a_host_under_test=True,
)

SCENARIOS = (KVM, KVM_LOOKUP, KVM_L1, TRACE_MMIO)

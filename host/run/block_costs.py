"""What one run of each scenario's e2e test costs in wall time in an A/B's
blocks (the ab profile), on the wall clock and on icount: measured
estimates, keyed by the test the scenario rows name (``Scenario.e2e``),
beside the checks' and the jobs' costs (host/run/blocks.py).
``memqual run --until-decided`` reads them before it starts
(host/run/budget.py); once running, it times its own blocks instead.

Why it is built so: docs/architecture.md, "Module notes", host/run/block_costs.py.
"""

from __future__ import annotations

import dataclasses

# Where each figure comes from: the command, the date, what was read.
ICOUNT_RUN = (
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.12.111+deb12-amd64 --clock icount "
    "--until-decided --budget 15, 2026-12-04 09:33-10:04, QEMU 10.0.2, load 0.5-3.2"
)
AUTO_RUN = (
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.12.111+deb12-amd64 --clock auto "
    "--until-decided --budget 35, 2026-12-04 10:05-10:37 (its wall-clock tests)"
)
BALLOON_WALL = (
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.12.111+deb12-amd64 --only balloon-timing "
    "--rounds 5, 2026-12-02 (about 44 s a run at 3 cycles a guest, docs/balloon.md)"
)
FAULT_WALL = (
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 --clock wall --only fault "
    "--rounds 6, 2026-12-04 (1 min 48 s for 12 runs with the job's overhead, docs/ab-calibration.md)"
)
# The negative controls: host-only /dev/kvm benchmarks, no guest kernel in
# them, the same on either clock (host/run/ab_run.py MIN_CONTROL_BLOCKS).
CONTROLS = (
    "the blocks of 2026-12-03, 0.7 and 9.0 s an arm on either clock (docs/ab-calibration.md, 'Negative controls')"
)
MEASURED = (ICOUNT_RUN, AUTO_RUN, BALLOON_WALL, FAULT_WALL, CONTROLS)
MEASURED_ON = "2026-12-02 to 2026-12-04"
# Under a host under test every guest's L1 boots first and its host work
# runs under TCG's SVM: KSM's tests took 4.5-18 times their plain icount
# time there (test_guest_ksm 60-77 s, test_merge 130-162 s,
# test_volatile_scan_4k 510-567 s; memqual run --host-kernel 6.1.0-57-amd64
# --host-kernel 6.12.111+deb12-amd64 --clock icount --only ksm
# --until-decided --budget 35, 2026-12-06).  The least of them: an
# estimate that errs short, as one that refuses a run must.
HOST_UNDER_TEST_FACTOR = 4.0


@dataclasses.dataclass(frozen=True)
class Cost:
    """One run of a test (one arm of one block), in seconds, on each clock;
    None where it was not measured."""

    wall_s: float | None
    icount_s: float | None

    def on(self, icount: bool) -> float | None:
        return self.icount_s if icount else self.wall_s


COSTS: dict[str, Cost] = {
    "test_balloon:BalloonTiming.test_inflate_deflate_1g": Cost(44.0, 54.2),
    "test_balloon_driver:BalloonDriver.test_request_size": Cost(None, 73.2),
    "test_fault:FaultTest.test_anon": Cost(8.0, 8.6),
    "test_balloon:BalloonFloor.test_floor": Cost(12.1, 28.4),
    "test_balloon:BalloonFreePageReporting.test_reporting_on": Cost(15.9, 32.0),
    "test_hugetlbfs:HugetlbfsTest.test_balloon": Cost(8.4, 22.1),
    "test_ksm:KsmTest.test_merge": Cost(8.8, 24.5),
    "test_ksm:KsmTest.test_volatile_scan_4k": Cost(12.0, 30.0),
    "test_ksm:KsmTest.test_guest_ksm": Cost(6.5, 15.3),
    "test_ksm:KsmTest.test_many_guests": Cost(16.8, 34.2),
    "test_memslots_qemu:MemslotsQemu.test_layout_applied_checked_probed_and_traced": Cost(10.8, 20.9),
    "test_memslots_kvm:MemslotsKvm.test_errnos_and_slot_operation_times": Cost(0.7, 0.7),
    "test_memslots_kvm:MemslotsKvm.test_lookup_cost_by_slot_count": Cost(9.0, 9.0),
    # It runs only on a host under test: 13.7 s there (its L1's boot, 9 VMs
    # and the probes; avocado run with MEMQUAL_HOST_KERNEL=6.1.0-57-amd64
    # on icount:0, 2026-12-07), which HOST_UNDER_TEST_FACTOR gives back.
    "test_memslots_l1:MemslotsKvmInL1.test_errnos_and_slot_operation_times": Cost(3.4, 3.4),
}


def run_s(reference: str, icount: bool) -> float | None:
    """One run of the test ``reference`` (``test_file_stem:Class.method``)
    on the wall clock or icount; None when not measured there."""
    cost = COSTS.get(reference)
    return cost.on(icount) if cost is not None else None

"""The guest kernel's anonymous page fault, timed in the guest
(host/fault/anon.py, docs/fault.md)."""

from __future__ import annotations

from memqual.e2e.base import GuestTest
from memqual.host.core import clock
from memqual.host.core.qemu import MachineConfig
from memqual.host.fault import anon
from memqual.host.fault.table import ANON

# Each page faults once: the probe's own minor faults around a run are its
# pages and at most a few more (measured here: 16384 pages, 16384-16386
# faults, on either clock).  A huge page (THP) would give 1/512 of the
# pages, a reused mapping none.
FAULTS_PER_PAGE = (1.0, 1.001)


class FaultTest(GuestTest):
    """
    :avocado: enable
    :avocado: tags=fault
    """

    def test_anon(self) -> None:
        """First touches of fresh anonymous 4 KiB pages, one fresh guest a
        replicate; each page faults once.  A guest's runs are not asserted
        to agree: on icount they repeat across boots to 0.01 %, but the
        first run of a process differs from the next by the kernel's own
        doing (6.12's first is 2.2 % slower, 6.1's 0.1 %).

        :avocado: tags=ab
        """
        sizes = ANON.sizes_for()
        the_clock = clock.current()
        config = MachineConfig(memory_mib=anon.GUEST_MIB, cpus=anon.VCPUS, warm=False)
        guests = []
        for _ in range(sizes.guests):
            vm = self.boot(config)
            guests.append(anon.measure_guest(vm, sizes.mib, sizes.runs, the_clock.icount))
            vm.shutdown()
        for guest in guests:
            self.log.info(
                "fault.anon on %s, kernel %s: %s ns a page (faults a page %s)",
                the_clock.label,
                guest.kernel,
                [round(run.ns_per_page, 2) for run in guest.runs],
                [round(run.faults_per_page, 4) for run in guest.runs],
            )
        self.record(anon.record(guests, sizes.mib, the_clock))
        for guest in guests:
            for run in guest.runs:
                low, high = FAULTS_PER_PAGE
                self.assertTrue(
                    low <= run.faults_per_page <= high,
                    f"run {run.index}: {run.faults} faults for {run.pages} pages: the timed path was not one "
                    "fault a page",
                )

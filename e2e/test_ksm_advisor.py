"""The KSM advisor end to end: a real guest's pages, the host's real ksmd
(this machine's, or a host under test's in L1) with advisor_mode
scan-time (Linux 6.8+; a skip with its reason where the knob is absent).
The procedure is host/ksm/advisor.py; this file boots the guest, holds the
agent's pages while ksmd scans them, records and asserts the direction.
docs/ksm.md, "The KSM advisor"."""

from __future__ import annotations

from collections.abc import Callable

from memqual.e2e.host_ksm import HostKsmTest
from memqual.host.core import nested
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig
from memqual.host.ksm import advisor, table
from memqual.host.ksm.agent import AGENT, StressAgent, StressArgs
from memqual.host.ksm.l1_ksm import L1Ksm

AGENT_WAIT_S = 120.0  # the agent's start and fill under TCG on a loaded host


class KsmAdvisorTest(HostKsmTest):
    """
    :avocado: enable
    :avocado: tags=ksm,ksm-advisor
    """

    # The host KSM lock may be a sibling's for minutes; a host under test
    # runs everything under TCG, L1's ksmd included.
    timeout = 600 * (nested.BOOT_TIMEOUT_FACTOR if nested.from_environment() is not None else 1)

    def test_advisor(self) -> None:
        """A full scan slower than the target: the advisor raises
        pages_to_scan until one takes the target or less.  Under a host
        under test L1's ksmd, watched in L1 on L1's clock."""
        sizes = table.ADVISOR.sizes_for()
        args = StressArgs(mib=sizes.fill_mib, phases=["fill", f"hold:{sizes.timeout_s + AGENT_WAIT_S:.0f}"])
        if self.host_under_test() is not None:
            vm = self.boot(MachineConfig(memory_mib=sizes.guest_mib))
            ksm = L1Ksm.of(vm.host_ssh, vm.pid)
            self.require(ksm.fs.exists(), f"the host under test's kernel has no {ksm.fs.root}")
            with self.scenario():
                advisor.check(ksm.fs)
                run = self.while_held(
                    vm,
                    args,
                    AGENT_WAIT_S * nested.BOOT_TIMEOUT_FACTOR,
                    lambda: advisor.run_advisor_whole(ksm, sizes, args.pages, advisor.L1_SCANS),
                )
        else:
            with self.host_ksm() as host_ksm:
                advisor.check(host_ksm.fs)
                vm = self.boot(MachineConfig(memory_mib=sizes.guest_mib))
                run = self.while_held(
                    vm, args, AGENT_WAIT_S, lambda: advisor.run_advisor(host_ksm, sizes, args.pages, note=self.log.info)
                )
        for measurement in run.records():
            self.record(measurement)
        reached = run.reached
        assert reached is not None  # run_advisor fails before it returns without one
        self.log.info(
            "advisor: target %d s, pages_to_scan %d -> first step %d -> %d at the target after %.1f s "
            "(%d full scans; peak %d, x%.1f); scans %s",
            run.target_s,
            run.start_pages,
            run.readings[0].pages_to_scan,
            reached.reading.pages_to_scan,
            reached.reading.at_s,
            reached.reading.full_scans,
            run.peak_pages,
            run.rise,
            ", ".join(f"{s.seconds:.2f} s" for s in run.scans),
        )
        # Its sizes make the first scan slow where the guest's RAM is there
        # (host/ksm/table.py); a host that scans it faster shows no rise.
        self.require(
            run.slow_start,
            f"the first full scan took {run.scans[0].seconds:.2f} s at pages_to_scan {run.start_pages}, within the "
            f"{run.target_s} s target: this host scans the guest faster than the sizes expect, nothing to show",
        )
        self.assertGreater(
            run.peak_pages,
            run.start_pages,
            f"scans slower than the target, yet pages_to_scan never rose above its start {run.start_pages}: "
            f"{run.readings}",
        )

    def while_held(
        self, vm: Machine, args: StressArgs, wait_s: float, watch: Callable[[], advisor.AdvisorRun]
    ) -> advisor.AdvisorRun:
        """``watch`` while the agent holds its filled pages; the agent ends
        cleanly after it."""
        with StressAgent(vm.ssh, vm.deploy(AGENT), args) as agent:
            agent.wait_event("fill_done", wait_s)
            run = watch()
            agent.advance()
            self.assertEqual(agent.finish(wait_s), 0)
        return run

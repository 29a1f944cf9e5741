"""The anonymous fault scenario: a fresh guest settles, then guest/fault_probe.c
writes one byte to each 4 KiB page of a fresh anonymous mapping, timed in
the guest; the guest's figure is the least of its runs, and each guest is
one replicate.  What it measures is the guest kernel's first-touch path
(the fault, the zeroing of the page, the page table update), which every
guest workload runs and a patch to the fault path or the page allocator
moves.  docs/fault.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from memqual.host.core import clock as clocks
from memqual.host.core import fault_probe
from memqual.host.core.record import Measurement
from memqual.host.core.shell import Shell

SCENARIO = "fault.anon"
GUEST_MIB = 512
# One vCPU: nothing else the guest runs takes turns with the timed loop
# (under icount every vCPU takes turns in one host thread, and a second
# one's timers would land in the window).
VCPUS = 1
# Guest seconds of quiet before the timed runs: the boot's and the agent
# push's deferred work (writeback, workqueues) runs first.  Without it the
# first run over fresh boots spread 16 % on icount; with 20 s, 0.011 %
# (docs/ab-calibration.md, "The instrument").  Under icount an idle
# guest's clock jumps to its next timer, so 20 guest seconds cost the host
# well under a second; on the wall clock they would cost 20, where the
# host's load moves the figure far more than the boot's leftovers do.
SETTLE_S = {True: 20, False: 2}
# The least of a guest's runs is its figure: a host-timed packet (an SSH
# channel's close, a delayed ACK) that lands in a run costs it 1-4 ms of
# guest time once (docs/ab-calibration.md, "The instrument").
SUMMARY = "least of the guest's runs"


class Guest(Protocol):
    """A booted guest: host/core/machine.py's Machine, or a fake."""

    @property
    def ssh(self) -> Shell: ...
    def deploy(self, agent: str) -> str: ...


@dataclasses.dataclass(frozen=True)
class AnonGuest:
    """One fresh guest's runs."""

    runs: tuple[fault_probe.FaultRun, ...]
    settle_s: int
    kernel: str

    @property
    def least(self) -> fault_probe.FaultRun:
        return min(self.runs, key=lambda run: run.ns_per_page)


def measure_guest(vm: Guest, mib: int, runs: int, icount: bool) -> AnonGuest:
    """Settle the guest, then time ``runs`` first touches of ``mib`` MiB."""
    path = vm.deploy(fault_probe.AGENT)
    settle = SETTLE_S[icount]
    vm.ssh.run(["sh", "-c", f"sync; sleep {settle}"], timeout=clocks.deadline_s(settle + 60))
    bound = clocks.deadline_s(fault_probe.RUN_BOUND_S * runs * max(1, mib // 64))
    out = vm.ssh.run([path, str(mib), str(runs)], timeout=bound).stdout
    kernel = str(vm.ssh.run(["uname", "-r"]).stdout).strip()
    return AnonGuest(fault_probe.parse_runs(str(out), runs), settle, kernel)


def record(guests: Sequence[AnonGuest], mib: int, clock: clocks.Clock) -> Measurement:
    """fault.anon's ns_per_page: one sample a guest, the least of its runs."""
    if not guests:
        raise ValueError("no guest measured")
    samples = [guest.least.ns_per_page for guest in guests]
    return Measurement(
        scenario=SCENARIO,
        metric="ns_per_page",
        unit="ns",
        better="lower",
        samples=samples,
        replicates=[[sample] for sample in samples],
        variant={"pages": "4k"},
        settings={
            "guest_mib": GUEST_MIB,
            "vcpus": VCPUS,
            "touched_mib": mib,
            "runs_a_guest": len(guests[0].runs),
            "settle_guest_s": guests[0].settle_s,
            "summary": SUMMARY,
            "pages": "4 KiB (MADV_NOHUGEPAGE)",
        },
        extra={
            "timed": "in the guest (CLOCK_MONOTONIC) around one write to each page of a fresh mapping",
            "reads": clock.reads(),
            "runs_ns_per_page": [[run.ns_per_page for run in guest.runs] for guest in guests],
            "faults_per_page": [[round(run.faults_per_page, 4) for run in guest.runs] for guest in guests],
            "guest_kernels": sorted({guest.kernel for guest in guests}),
        },
    )

"""The merge and integrity scenarios (1 and 2 of e2e/test_ksm.py): the
agent's identical pages merge under host KSM; then broken by distinct
tails, unmerged and verified.

Warm-started guests come from one snapshot, so their memory already holds
pages identical across guests (and zero pages): both count only what grows
after a baseline taken before the agent fills.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import time
from collections.abc import Callable, Iterator

from memqual.host.core.polling import poll
from memqual.host.core.record import Measurement
from memqual.host.ksm.agent import AGENT, StressAgent, StressArgs
from memqual.host.ksm.procfs import ProcessKsm
from memqual.host.ksm.scenarios import (
    MERGE_KNOBS,
    SCAN_TIMEOUT_S,
    Guest,
    KsmHost,
    ScenarioFailed,
    base_settings,
    merged_fraction,
)
from memqual.host.ksm.sysfs import KsmCounters

MERGE_MIB = 256  # merge, integrity: 65536 pages
CONTROL_MIB = 16  # host-side mergeable region of the mem-merge=off control
MERGE_POLL_S = 0.02  # poll period of the merge counters
INTEGRITY_TAIL_BYTES = 96


def watch_merge(
    ksm: KsmHost,
    pid: int,
    baseline: int,
    target: int,
    scans: int,
    timeout_s: float = SCAN_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, float | None]:
    """Poll QEMU's merged pages until `scans` more full scans have ended;
    return the growth over baseline and when it first reached target."""
    start = clock()
    end_scans = ksm.fs.read_int("full_scans") + scans
    reached: float | None = None

    def scanned() -> bool:
        nonlocal reached
        grown = ksm.process(pid).merging_pages - baseline
        if reached is None and grown >= target:
            reached = clock() - start
        return ksm.fs.read_int("full_scans") >= end_scans

    poll(
        scanned,
        timeout_s,
        MERGE_POLL_S,
        what=f"{scans} full scans",
        clock=clock,
        sleep=sleep,
        on_timeout=lambda _: ScenarioFailed(f"ksmd did not finish {scans} full scans within {timeout_s:.0f} s"),
    )
    return ksm.process(pid).merging_pages - baseline, reached


@contextlib.contextmanager
def host_mergeable(mib: int) -> Iterator[mmap.mmap]:
    """Identical MADV_MERGEABLE pages in this (host) process.  ksmd sleeps
    while no process has mergeable memory, so a mem-merge=off guest alone
    would leave full_scans still: this region keeps ksmd scanning, and its
    merging is the control's proof that ksmd did work meanwhile."""
    region = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.write(b"\xa5" * (mib << 20))
        region.madvise(mmap.MADV_MERGEABLE)
        yield region
    finally:
        region.close()


# -- merge ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MergeRun:
    """The agent's one-byte fill under host KSM: what grew past the
    baseline within 3 full scans, and how much of it was the agent's."""

    pages: int
    baseline: int
    grown: int
    seconds_to_90pct: float | None
    agent_merged: int
    process: ProcessKsm  # QEMU's ksm counters after the 3 scans
    counters: KsmCounters
    bad_pages: int
    verify: dict[str, str]
    agent_status: int

    def record(self, mem_merge: bool) -> Measurement:
        return merged_fraction(
            "ksm.merge",
            self.agent_merged / self.pages,
            base_settings(agent_mib=MERGE_MIB, **MERGE_KNOBS, full_scans=3),
            {
                "baseline_pages": self.baseline,
                "grown_pages": self.grown,
                "seconds_to_90pct": self.seconds_to_90pct,
                "agent_merged_pages": self.agent_merged,
                "qemu_ksm_stat": self.process.stat,
                "counters": self.counters.to_json(),
            },
            variant={"mem_merge": mem_merge},
        )


def run_merge(
    ksm: KsmHost, vm: Guest, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
) -> MergeRun:
    """Fill MERGE_MIB with one byte, watch 3 full scans, then make every
    page unique and watch 2 more: what left the count was the agent's."""
    pages = MERGE_MIB * 256
    path = vm.deploy(AGENT)
    ksm.set(**MERGE_KNOBS, run=1)
    # Baseline: what of the booted (or snapshot-restored) guest merges
    # anyway; the agent's pages are what grows past it.
    ksm.wait_full_scans(2, SCAN_TIMEOUT_S)
    baseline = ksm.process(vm.pid).merging_pages
    args = StressArgs(
        mib=MERGE_MIB, byte=0x5A, phases=["fill", "hold:300", "tail", "hold:300", "verify"], timeout_s=500
    )
    with StressAgent(vm.ssh, path, args) as agent:
        agent.wait_event("fill_done", 120)
        grown, seconds = watch_merge(ksm, vm.pid, baseline, int(0.9 * pages), scans=3, clock=clock, sleep=sleep)
        proc = ksm.process(vm.pid)
        counters = ksm.counters()
        # Attribution: the growth may hold other guest pages that merged
        # meanwhile.  The agent's own merged pages are those that leave the
        # count once the agent makes each page unique (ksmd drops a broken
        # page at its next visit).
        agent.advance()
        agent.wait_event("tail_done", 120)
        after_tail, _ = watch_merge(ksm, vm.pid, baseline, pages, scans=2, clock=clock, sleep=sleep)
        agent.advance()
        verify = agent.wait_event("verify_done", 120)
        status = agent.finish(30)
    return MergeRun(
        pages=pages,
        baseline=baseline,
        grown=grown,
        seconds_to_90pct=seconds,
        agent_merged=grown - after_tail,
        process=proc,
        counters=counters,
        bad_pages=int(verify["bad_pages"]),
        verify=verify,
        agent_status=status,
    )


# -- integrity --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class IntegrityRun:
    """Merged pages broken by distinct tails, run=2, every page verified;
    then 5 pages corrupted on purpose and verified again (the control)."""

    pages: int
    baseline: int
    merged: int  # before the tails
    after_tail: int
    unmerged: int  # QEMU's merged pages after run=2
    verify: dict[str, str]
    control: dict[str, str]
    agent_status: int

    @property
    def bad_pages(self) -> int:
        return int(self.verify["bad_pages"])

    @property
    def control_bad_pages(self) -> int:
        return int(self.control["bad_pages"])

    def record(self) -> Measurement:
        return Measurement(
            scenario="ksm.integrity",
            metric="bad_pages",
            unit="pages",
            better="lower",
            samples=[float(self.bad_pages)],
            settings=base_settings(agent_mib=MERGE_MIB, **MERGE_KNOBS, tail_bytes=INTEGRITY_TAIL_BYTES),
            extra={
                "merged_before_tail": self.merged,
                "merged_after_tail": self.after_tail,
                "merged_after_unmerge": self.unmerged,
                "baseline_pages": self.baseline,
            },
        )


def run_integrity(
    ksm: KsmHost, vm: Guest, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
) -> IntegrityRun:
    """Merge, break with distinct tails, unmerge (run=2), verify; fails
    (ScenarioFailed) when the identical pages did not merge first."""
    pages = MERGE_MIB * 256
    phases = ["fill", "hold:300", "tail", "hold:300", "verify", "corrupt:5", "verify"]
    path = vm.deploy(AGENT)
    ksm.set(**MERGE_KNOBS, run=1)
    ksm.wait_full_scans(2, SCAN_TIMEOUT_S)
    baseline = ksm.process(vm.pid).merging_pages
    with StressAgent(vm.ssh, path, StressArgs(mib=MERGE_MIB, byte=0xA5, phases=phases, timeout_s=500)) as agent:
        agent.wait_event("fill_done", 120)
        merged, _ = watch_merge(ksm, vm.pid, baseline, int(0.9 * pages), scans=3, clock=clock, sleep=sleep)
        if merged < 0.9 * pages:
            raise ScenarioFailed("the identical pages did not merge first")
        agent.advance()  # every merged page now takes a copy-on-write fault
        agent.wait_event("tail_done", 120)
        after_tail, _ = watch_merge(ksm, vm.pid, baseline, pages, scans=3, clock=clock, sleep=sleep)
        ksm.unmerge()
        unmerged = ksm.process(vm.pid).merging_pages
        agent.advance()
        verify = agent.wait_event("verify_done", 120)
        control = agent.wait_event("verify_done", 120, occurrence=2)
        status = agent.finish(30)
    return IntegrityRun(pages, baseline, merged, after_tail, unmerged, verify, control, status)

"""The KSM scenarios' measurement procedures (e2e/test_ksm.py boots the
guests, calls these, records and asserts; docs/ksm.md says why each is built
the way it is).

Each procedure drives host KSM through ``KsmHost`` and a guest through
``Guest``: the real ``KsmController`` and ``Machine``, or scripted fakes in
the unit tests.  They measure and return typed results; a result's
``records`` gives the Measurements the scenario writes.  Verdicts stay with
the scenario, except where a run cannot go on: ScenarioFailed (a deadline
missed, a precondition the measurement found false) or CapabilityMissing
(a host that turned out not to offer what the scenario needs).

Warm-started guests come from one snapshot, so their memory already holds
pages identical across guests (and zero pages): merge and integrity count
only what grows after a baseline taken before the agent fills; many guests
is about exactly those pages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from memqual.host.core import settings as host_settings
from memqual.host.core import stats
from memqual.host.core.errors import CapabilityMissing, GuestError
from memqual.host.core.record import Measurement
from memqual.host.core.shell import Shell
from memqual.host.ksm.agent import AGENT, StressAgent, StressArgs
from memqual.host.ksm.procfs import ProcessKsm
from memqual.host.ksm.scancost import ScanWindow, alternate_smart_scan
from memqual.host.ksm.sharing import SharingModel, SharingPoint, settle
from memqual.host.ksm.sysfs import KsmCounters
from memqual.host.ksm.volatile import VolatileGuest

log = logging.getLogger(__name__)

GUEST_MIB = 1024
MERGE_MIB = 256  # merge, integrity: 65536 pages
CONTROL_MIB = 16  # host-side mergeable region of the mem-merge=off control
# ksmd fast enough that 3 full scans of a 1 GiB guest take seconds under
# TCG; the kernel default (100 pages / 20 ms) would take minutes.
MERGE_PAGES_TO_SCAN = 20000
MERGE_SLEEP_MS = 10
# The scan knobs as each scenario sets them on the host and as its records'
# settings say, from one place.
MERGE_KNOBS: dict[str, int | str] = {"pages_to_scan": MERGE_PAGES_TO_SCAN, "sleep_millisecs": MERGE_SLEEP_MS}
SCAN_TIMEOUT_S = 120.0  # per wait for full scans: generous for a busy host
MERGE_POLL_S = 0.02  # poll period of the merge counters
INTEGRITY_TAIL_BYTES = 96

# Volatile scan cost, sized on this 2-core TCG host (docs/ksm.md).  A window
# is 9 whole full scans: smart scan lets a page that keeps failing be
# skipped 8 times, then looked at once, so its steady state has a period of
# 9 scans; a window of another length holds 0 or 1 of those looks per page
# and the cost per scan comes out bimodal (seen with 6: CI +-29 %).
VOLATILE_MIB = 256
# MEMQUAL_KSM_PAGES_TO_SCAN overrides it: how a run with a deliberately
# slowed ksmd is made, for `memqual compare` to flag.
VOLATILE_PAGES_TO_SCAN = host_settings.ksm_pages_to_scan(20000)
VOLATILE_SLEEP_MS = 10
VOLATILE_KNOBS: dict[str, int | str] = {"pages_to_scan": VOLATILE_PAGES_TO_SCAN, "sleep_millisecs": VOLATILE_SLEEP_MS}
# The independent unit is a fresh guest (a warm start, under 1 s): windows
# inside one guest are nested in it.  Each guest costs about 6 s beyond its
# windows here (start, deploy, 256 MiB fill, settle), and the guests differ
# more than the windows of one guest do, so the quick profile spends its
# time on guests: 4 guests x 1 window a variant.  Measured in one session
# (docs/ksm.md): 38-57 s (THP) and 45-120 s (4 KiB, the slowest on a busy
# host) against 37 s and 53-55 s for 1 guest x 8 windows; 4 x 2 took 79-91
# s.  The order alternates between guests (0 1, 1 0, 1 0, 0 1); with 2
# windows also inside each.  Guests (replicates per variant) and windows per
# variant per guest: the profile's row (host/core/profiles.py).
SCANS_PER_WINDOW = 9
WARMUP_SCANS = 3  # after each switch of smart_scan
# Settle each fresh guest: smart scan skips a page first after 3 looks and
# its skip budget grows 1, 2, 4, 8: the 8-skip steady state starts at the
# 14th smart scan of a new page.
INITIAL_WARMUP_SCANS = 12
# Windows thrown away because other guests' pages came or went under them
# (each costs a re-settle): at most this many per scenario, then disturbed
# windows are kept and counted.
DISTURBED_RETRIES = 3

GUEST_KSM_MIB = 64
GUEST_KSM_ROOT = "/sys/kernel/mm/ksm"
GUEST_KSM_KNOBS = {"pages_to_scan": 5000, "sleep_millisecs": 10}
GUEST_KSM_POLL_S = 0.2  # poll period; each read is an SSH round trip

# Many guests.  512 MiB guests hold about 150 MiB resident after a warm start.
# The guest count and the timed re-merges: the profile's row.
MANY_GUEST_MIB = 512
REMERGE_SHARE = 0.9  # a re-merge is timed to this share of the settled saving
# Settled = pages_sharing still for this many full scans (about 0.4 s here):
# a page merges only once its content was the same on two visits, so a
# guest still settling after its start merges over several scans.
SETTLE_QUIET_SCANS = 10


class KsmFiles(Protocol):
    """What the scenarios read of host KSM's sysfs directory directly."""

    def read_int(self, name: str) -> int: ...
    def read_int_or_none(self, name: str) -> int | None: ...
    def has(self, name: str) -> bool: ...


class KsmHost(Protocol):
    """Host KSM as the scenarios drive it: ``KsmController``, or a
    scripted fake in tests."""

    @property
    def fs(self) -> KsmFiles: ...
    def set(self, **knobs: int | str) -> None: ...
    def set_thp(self, **knobs: str) -> None: ...
    def unmerge(self) -> None: ...
    def counters(self) -> KsmCounters: ...
    def process(self, pid: int) -> ProcessKsm: ...
    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = ...) -> KsmCounters: ...
    def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = ...) -> None: ...


class Guest(Protocol):
    """A booted guest: host/core/machine.py's Machine, or a fake."""

    @property
    def pid(self) -> int: ...
    @property
    def ssh(self) -> Shell: ...
    @property
    def started_warm(self) -> bool: ...
    @property
    def boot_to_ssh_s(self) -> float: ...
    def deploy(self, agent: str) -> str: ...


class ScenarioFailed(GuestError):
    """What the scenario fails on, found while it still runs: ksmd too slow
    for a deadline, pages that did not merge, the agent's bad status."""


def base_settings(**extra: object) -> dict[str, object]:
    """A KSM record's settings: the guest's size and what the scenario adds."""
    return {"guest_mib": GUEST_MIB, **extra}


def merged_fraction(
    scenario: str,
    fraction: float,
    settings: dict[str, object],
    extra: dict[str, object],
    variant: dict[str, object] | None = None,
) -> Measurement:
    """The share of the agent's pages that merged: host KSM's and the
    guest's own scenarios record it alike."""
    return Measurement(
        scenario=scenario,
        metric="merged_fraction",
        unit="1",
        better="higher",
        samples=[fraction],
        variant=variant or {},
        settings=settings,
        extra=extra,
    )


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
    deadline = start + timeout_s
    while True:
        grown = ksm.process(pid).merging_pages - baseline
        if reached is None and grown >= target:
            reached = clock() - start
        if ksm.fs.read_int("full_scans") >= end_scans:
            return ksm.process(pid).merging_pages - baseline, reached
        if clock() > deadline:
            raise ScenarioFailed(f"ksmd did not finish {scans} full scans within {timeout_s:.0f} s")
        sleep(MERGE_POLL_S)


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


# -- volatile scan cost -----------------------------------------------------
def prepare_volatile(ksm: KsmHost, pages: str) -> None:
    """Host THP and KSM knobs for the volatile scenario, before its first
    guest: ksmd stopped, smart_scan on, the advisor off."""
    # Guest RAM is faulted in after this: never -> 4 KiB pages; madvise ->
    # huge pages, since QEMU madvises guest RAM MADV_HUGEPAGE.
    if pages == "4k":
        ksm.set_thp(enabled="never")
    else:
        ksm.set_thp(enabled="madvise", defrag="madvise")
    knobs: dict[str, int | str] = {**VOLATILE_KNOBS, "smart_scan": 1, "run": 0}
    if ksm.fs.has("advisor_mode"):
        knobs["advisor_mode"] = "none"  # the advisor would retune pages_to_scan
    ksm.set(**knobs)


def volatile_settings(windows: int, guests: int, reference_scans: int) -> dict[str, object]:
    """The volatile records' settings, the profile's sizes among them."""
    return base_settings(
        agent_mib=VOLATILE_MIB,
        **VOLATILE_KNOBS,
        repeats=windows,
        guests=guests,
        scans_per_window=SCANS_PER_WINDOW,
        reference_scans=reference_scans,
        warmup_scans=WARMUP_SCANS,
    )


def retries_left(guests: Sequence[VolatileGuest]) -> int:
    """One budget of re-measured windows for the whole scenario, as with one
    guest: a host busy with other guests then costs at most that much more
    time, however many guests there are."""
    return max(0, DISTURBED_RETRIES - sum(len(g.run.discarded) for g in guests))


def volatile_guest(
    ksm: KsmHost,
    vm: Guest,
    pages: str,
    first: int,
    retries: int,
    windows: int,
    reference_scans: int,
    on_window: Callable[[ScanWindow], None] = lambda w: None,
) -> VolatileGuest:
    """One replicate on a freshly booted guest: it runs the seed's workload,
    ksmd settles on it, smart_scan 0 and 1 are measured in ABBA order
    starting with ``first``.  CapabilityMissing when host THP did not back
    the guest's RAM (``pages`` "thp"); ScenarioFailed when THP did with
    enabled=never ("4k") or the agent failed."""
    path = vm.deploy(AGENT)
    args = StressArgs(mib=VOLATILE_MIB, phases=["fill", "dirty:600"], timeout_s=700)
    with StressAgent(vm.ssh, path, args) as agent:
        agent.wait_event("dirty_start", 180)
        huge_kib = ksm.process(vm.pid).anon_huge_kib or 0
        if pages == "thp":
            if huge_kib < VOLATILE_MIB * 1024 // 2:
                raise CapabilityMissing(f"host THP did not back guest RAM (AnonHugePages {huge_kib} kB of QEMU)")
        elif huge_kib > VOLATILE_MIB * 1024 // 20:
            raise ScenarioFailed(f"THP backs guest RAM with enabled=never (AnonHugePages {huge_kib} kB of QEMU)")
        ksm.set(run=1)
        try:
            run = alternate_smart_scan(
                ksm,
                windows,
                SCANS_PER_WINDOW,
                WARMUP_SCANS,
                SCAN_TIMEOUT_S,
                settle_scans=INITIAL_WARMUP_SCANS,
                max_retries=retries,
                first=first,
                own_pages=lambda: ksm.process(vm.pid).stat_int("ksm_rmap_items"),
                reference_scans=reference_scans,
                on_window=on_window,
            )
        finally:
            # ksmd idles while the next guest starts and fills, as it did
            # before the first one: every guest is settled from the same state.
            ksm.set(run=0)
        huge_kib_end = ksm.process(vm.pid).anon_huge_kib or 0
        agent.advance()
        dirty = agent.wait_event("dirty_done", 60)
        status = agent.finish(60)
    if status != 0:
        raise ScenarioFailed(f"ksm_stress ended with status {status}")
    return VolatileGuest(
        run=run,
        first_smart_scan=first,
        started_warm=vm.started_warm,
        boot_to_ssh_s=vm.boot_to_ssh_s,
        anon_huge_kib=(huge_kib, huge_kib_end),
        dirty_passes=int(dirty["passes"]),
        dirty_s=float(dirty["duration_s"]),
    )


# -- guest-side KSM ---------------------------------------------------------
class GuestKsm:
    """The guest kernel's own KSM knobs and counters, over SSH."""

    def __init__(self, ssh: Shell, root: str = GUEST_KSM_ROOT) -> None:
        self.ssh, self.root = ssh, root

    def writable(self) -> bool:
        return bool(self.ssh.run(["test", "-w", f"{self.root}/run"], check=False).status == 0)

    def write(self, name: str, value: int) -> None:
        self.ssh.run(["sh", "-c", 'echo "$1" > "$2"', "knob", str(value), f"{self.root}/{name}"])

    def read(self, name: str) -> int:
        return int(self.ssh.run(["cat", f"{self.root}/{name}"]).stdout)

    def merging_pages(self, pid: int) -> int:
        return int(self.ssh.run(["cat", f"/proc/{pid}/ksm_merging_pages"]).stdout)


@dataclasses.dataclass(frozen=True)
class GuestKsmRun:
    pages: int
    merged: int
    pages_sharing: int
    seconds_for_3_scans: float
    after_unmerge: int
    verify: dict[str, str]
    agent_status: int
    guest_kernel: str

    @property
    def bad_pages(self) -> int:
        return int(self.verify["bad_pages"])

    def record(self) -> Measurement:
        return merged_fraction(
            "ksm.guest_merge",
            self.merged / self.pages,
            base_settings(agent_mib=GUEST_KSM_MIB, **GUEST_KSM_KNOBS, full_scans=3),
            {
                "merged_pages": self.merged,
                "pages_sharing": self.pages_sharing,
                "seconds_for_3_scans": self.seconds_for_3_scans,
                "after_unmerge": self.after_unmerge,
                "guest_kernel": self.guest_kernel,
            },
        )


def run_guest_ksm(
    vm: Guest, path: str, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
) -> GuestKsmRun:
    """The guest's ksmd merges the agent's MADV_MERGEABLE pages within 3
    full scans, then run=2 unmerges them; ``path`` is the deployed agent."""
    pages = GUEST_KSM_MIB * 256
    guest = GuestKsm(vm.ssh)
    for name, value in GUEST_KSM_KNOBS.items():
        guest.write(name, value)
    guest.write("run", 1)
    args = StressArgs(
        mib=GUEST_KSM_MIB, byte=0x3C, mergeable=True, phases=["fill", "hold:300", "verify"], timeout_s=400
    )
    with StressAgent(vm.ssh, path, args) as agent:
        pid = agent.pid
        agent.wait_event("fill_done", 120)
        t0 = clock()
        target = guest.read("full_scans") + 3
        while guest.read("full_scans") < target:
            if clock() - t0 > SCAN_TIMEOUT_S:
                raise ScenarioFailed(f"the guest's ksmd did not finish 3 full scans in {SCAN_TIMEOUT_S:.0f} s")
            sleep(GUEST_KSM_POLL_S)
        seconds = clock() - t0
        merged = guest.merging_pages(pid)
        sharing = guest.read("pages_sharing")
        guest.write("run", 2)
        after_unmerge = guest.merging_pages(pid)
        agent.advance()
        verify = agent.wait_event("verify_done", 120)
        status = agent.finish(30)
    kernel = str(vm.ssh.run(["uname", "-r"]).stdout).strip()
    return GuestKsmRun(pages, merged, sharing, seconds, after_unmerge, verify, status, kernel)


# -- many guests ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ManyGuestsRun:
    """Identical guests added one by one: each count's settled point, then
    timed re-merges of them all from nothing."""

    points: list[SharingPoint]
    remerge_s: list[float]
    remerge_cpu_s: list[float]
    saved_mib: list[float]  # the settled saving, then after each re-merge
    started_warm: list[bool]
    smart_scan: int | None

    @property
    def guests(self) -> int:
        return len(self.points)

    @property
    def settled(self) -> SharingPoint:
        return self.points[-1]

    @property
    def model(self) -> SharingModel:
        return SharingModel.fit(self.points[0], self.points[1])

    @property
    def predicted(self) -> float:
        return self.model.saved_pages(self.guests)

    @property
    def alone(self) -> int:
        """What the first guest merged alone."""
        return self.points[0].merging[0]

    @property
    def per_guest(self) -> float:
        """What each guest merged, the median, with all of them."""
        return stats.median(list(self.settled.merging))

    @property
    def foreign(self) -> float:
        """The largest share of the merged pages that were not these guests'."""
        return max(abs(p.foreign_pages) / max(1, p.pages_shared + p.pages_sharing) for p in self.points)

    def records(self) -> list[Measurement]:
        settings = base_settings(
            guest_mib=MANY_GUEST_MIB,
            guests=self.guests,
            **MERGE_KNOBS,
            smart_scan=self.smart_scan,
            settle_quiet_scans=SETTLE_QUIET_SCANS,
        )
        extra = {
            "points": [p.to_json() for p in self.points],
            "model": self.model.to_json()
            | {"predicted_saved_pages": self.predicted, "measured_saved_pages": self.settled.pages_sharing},
            "merged_per_guest_alone": self.alone,
            "merged_per_guest_many": self.per_guest,
            "started_warm": self.started_warm,
            "foreign_share": self.foreign,
        }
        # The saving with all the guests (every sample); each smaller
        # count's saving once (its point) and the re-merge times differ from
        # it only in what the fields below say (replicates=[]: regrouped
        # from their own samples, not copied from the saving's).
        saved = Measurement(
            scenario="ksm.many_guests",
            metric="saved_mib",
            unit="MiB",
            better="higher",
            samples=self.saved_mib,
            variant={"guests": self.guests},
            settings=settings,
            extra=extra,
        )
        points_saved = [
            dataclasses.replace(
                saved, samples=[point.saved_mib], replicates=[], variant={"guests": n}, extra=point.to_json()
            )
            for n, point in enumerate(self.points[:-1], start=1)
        ]
        remerge = dataclasses.replace(
            saved,
            metric="remerge_s",
            unit="s",
            better="lower",
            samples=self.remerge_s,
            replicates=[],
            settings=settings | {"share": REMERGE_SHARE},
            extra={"ksmd_cpu_s": self.remerge_cpu_s, "summary": stats.summarize(self.remerge_s).to_json()},
        )
        return [*points_saved, saved, remerge]


def run_many_guests(
    ksm: KsmHost, boot: Callable[[], Guest], guests: int, remerges: int, note: Callable[[str], None] = log.info
) -> ManyGuestsRun:
    """Boot ``guests`` guests one by one (``boot`` gives the next), settle
    host KSM after each, then unmerge everything and time ``remerges``
    merges from nothing to REMERGE_SHARE of the settled saving."""
    points: list[SharingPoint] = []
    vms: list[Guest] = []

    def merging() -> list[int]:
        return [ksm.process(vm.pid).merging_pages for vm in vms]

    # smart_scan off: with it, a page that found no twin while its guest ran
    # alone is skipped on most later scans, and so is the later guest's twin
    # once it fails a few times; the two are rarely looked at in the same
    # scan, and the 2-guest point settled at 11.9-16.0 k merged pages per
    # guest instead of the 18.7 k that a third, fresh guest then brought
    # (docs/ksm.md).
    smart_scan = {"smart_scan": 0} if ksm.fs.read_int_or_none("smart_scan") is not None else {}
    ksm.set(**MERGE_KNOBS, **smart_scan, run=1)
    for n in range(1, guests + 1):
        vms.append(boot())
        points.append(settle(ksm, merging, n, SCAN_TIMEOUT_S, quiet_scans=SETTLE_QUIET_SCANS))
        note(f"{n} guests: {points[-1].to_json()}")
    settled = points[-1]
    remerge_s: list[float] = []
    remerge_cpu_s: list[float] = []
    saved_mib = [settled.saved_mib]
    target = REMERGE_SHARE * settled.pages_sharing
    for repeat in range(remerges):
        ksm.set(run=2)  # unmerge everything, then time a merge from nothing
        ksm.wait_until(lambda: sum(merging()) == 0, SCAN_TIMEOUT_S, "unmerging the guests")
        ksm.set(run=0)
        before = ksm.counters()
        ksm.set(run=1)
        ksm.wait_until(
            lambda: ksm.counters().pages_sharing >= target,
            SCAN_TIMEOUT_S,
            f"a re-merge to {REMERGE_SHARE:.0%} of {settled.pages_sharing} pages",
            poll_s=0.005,
        )
        after = ksm.counters()
        remerge_s.append(after.taken_s - before.taken_s)
        if before.ksmd_cpu_s is not None and after.ksmd_cpu_s is not None:
            remerge_cpu_s.append(after.ksmd_cpu_s - before.ksmd_cpu_s)
        again = settle(ksm, merging, len(vms), SCAN_TIMEOUT_S, quiet_scans=SETTLE_QUIET_SCANS)
        saved_mib.append(again.saved_mib)
        note(
            f"re-merge {repeat + 1}/{remerges}: {remerge_s[-1]:.2f} s to {100 * REMERGE_SHARE:.0f}%, "
            f"settled at {again.saved_mib:.1f} MiB saved"
        )
    return ManyGuestsRun(
        points=points,
        remerge_s=remerge_s,
        remerge_cpu_s=remerge_cpu_s,
        saved_mib=saved_mib,
        started_warm=[bool(vm.started_warm) for vm in vms],
        smart_scan=ksm.fs.read_int_or_none("smart_scan"),
    )

"""A guest's page faults on the host under test, its memslot searches
counted by kind: seed 002's kernbench, scaled to what L2's time allows.
Seed 000's guest (pc, 10 GiB, cirrus, rtl8139) runs as L2 under a host
kernel built with images/kvm-memslots/; guest/fault_probe.c touches fresh
pages, timed by the guest (under icount L1's instructions: the guest's
fault and the host's), while L1 counts the searches (l1_kinds.py).
docs/memslots-kvm.md, "A guest's page faults in the host under test".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memqual.host.core import clock as clocks
from memqual.host.core import fault_probe
from memqual.host.core.environment import Environment
from memqual.host.core.errors import GuestError
from memqual.host.core.record import Measurement
from memqual.host.core.shell import Shell
from memqual.host.memslots import l1_kinds, lookup_kinds, structures
from memqual.host.memslots.guest_layouts import SEED_000_GUEST
from memqual.host.memslots.layout import Layout, Slot

SCENARIO = "memslots.l1_faults"
# The kinds' frequencies as memslots.lookup_kinds' records, under a name of
# their own: counted by the searching kernel in the host under test, not by
# tracefs on a host where a Linux guest boots under KVM.
KINDS_SCENARIO = "memslots.l1_lookup_kinds"
GUEST = SEED_000_GUEST
# The kinds' records name their window: the priorities claim is judged on
# seed 000's netperf (l1_netperf.py), this one is listed beside it.
WORKLOAD = "fault_probe"
TOUCH_MIB = 64
RUNS = 3
# Guest seconds of quiet before the window, as the fault scenario waits
# (host/fault/anon.py SETTLE_S): the boot's deferred work runs first.  An
# idle guest's clock jumps to its next timer under icount: cheap for L1.
SETTLE_S = 20
# KVM's parameters that recreate 2011: no MMIO cache (every MMIO access
# searches the slots again), with shadow paging (ept=0, seed 002's
# kernbench: every guest page fault searches) or nested paging (Avi's
# premise for his priorities: a RAM page searched once, then the hardware
# serves it); today's defaults beside them.
CONDITIONS: dict[str, tuple[str, ...]] = {
    "2011-shadow": ("kvm_amd.npt=0", "kvm.mmio_caching=0"),
    "2011-npt": ("kvm.mmio_caching=0",),
    "today": (),
}
# The searches without a cache in front: every hit of one slot compares
# the same nodes, which the model gives for the slot list L1 printed.
UNCACHED = frozenset({"linear", "tree2011", "reorder"})
UNIT = "a boot of the host under test"
# The MMIO round trips, seed 000's netperf path: the guest reads a register
# of its rtl8139's memory BAR (BAR 1), each read a complete miss.
MMIO_AGENT = "mmio_pingpong"
NIC = ("0x10ec", "0x8139", "1")
MMIO_READS = 2000
MMIO_RUNS = 3
# A run's wall-clock bound, before the clock's and L1's stretch.
MMIO_RUN_BOUND_S = 30.0

MMIO_SETTING = f"{MMIO_AGENT} {' '.join(NIC)} {MMIO_READS} x {MMIO_RUNS}"
GUEST_CLOCK = "the guest's CLOCK_MONOTONIC (L2's)"

_MMIO_RUN = re.compile(r"event=run index=(\d+) reads=(\d+) duration_s=([0-9.]+) ns_per_read=([0-9.]+)")


class Guest(Protocol):
    """A booted guest under a host under test (host/core/machine.py)."""

    @property
    def ssh(self) -> Shell: ...
    @property
    def host_ssh(self) -> Shell: ...
    @property
    def clock(self) -> clocks.Clock: ...
    def deploy(self, agent: str) -> str: ...


@dataclass(frozen=True)
class SlotCheck:
    """One slot's nodes per hit, counted and as the model has them."""

    slot_id: int
    hits: int
    counted: float
    model: int | None  # None: the structure has a cache, no fixed count a hit

    @property
    def agrees(self) -> bool:
        return self.model is None or self.counted == self.model


@dataclass(frozen=True)
class MmioWindow:
    """The guest's register reads of its NIC: seconds a run, and the
    searches L1 counted over them."""

    reads: int  # a run
    seconds: tuple[float, ...]
    kinds: l1_kinds.KindCounts

    @property
    def round_trips_per_s(self) -> float:
        return self.reads * len(self.seconds) / sum(self.seconds)

    @property
    def misses_per_read(self) -> float:
        return self.kinds.misses / (self.reads * len(self.seconds))


def parse_mmio(text: str, runs: int) -> tuple[int, tuple[float, ...]]:
    """mmio_pingpong's reads a run and each run's seconds; GuestError
    unless it printed ``runs`` runs and its end."""
    found = [(int(m.group(2)), float(m.group(3))) for m in _MMIO_RUN.finditer(text)]
    if len(found) != runs or "event=done" not in text or any(sec <= 0 for _reads, sec in found):
        raise GuestError(f"{MMIO_AGENT} printed {len(found)} of {runs} runs: {text.strip()[-300:]!r}")
    return found[0][0], tuple(sec for _reads, sec in found)


@dataclass(frozen=True)
class FaultsBoot:
    """One boot of L1: the guest's fault runs and the window's searches."""

    structure: str
    conditions: str
    runs: tuple[fault_probe.FaultRun, ...]
    kinds: l1_kinds.KindCounts
    checks: tuple[SlotCheck, ...]
    mmio: MmioWindow | None = None

    @property
    def pages(self) -> int:
        return sum(run.pages for run in self.runs)

    @property
    def ns_per_page(self) -> float:
        """The guest's time per page over all runs (on icount, L1's
        instructions for the guest's fault and the host's)."""
        return sum(run.seconds for run in self.runs) * 1e9 / self.pages

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)

    def findings(self) -> list[str]:
        return slot_findings(self.structure, self.checks)


def slot_findings(structure: str, checks: Sequence[SlotCheck]) -> list[str]:
    """Each hit slot whose counted nodes a hit differ from the model's."""
    return [
        f"slot {c.slot_id}: {c.counted:g} nodes a hit counted, the model's {structure} has {c.model}"
        for c in checks
        if not c.agrees
    ]


def slot_checks(reading: l1_kinds.Reading, pid: int | None = None) -> tuple[SlotCheck, ...]:
    """Each hit slot's nodes per hit beside the model's for the same slots
    (address space 0, registered in id order: QEMU gives each new slot the
    lowest free id)."""
    slots = [s for s in reading.slots if s.as_id == 0 and (pid is None or s.pid == pid)]
    model = None
    if reading.search in UNCACHED and slots:
        layout = Layout(tuple(Slot(s.slot_id, s.base_gfn, s.npages) for s in sorted(slots, key=lambda s: s.slot_id)))
        model = structures.build(reading.search, layout)
    out = []
    for s in slots:
        if s.hits:
            expected = model.lookup(s.base_gfn)[1] if model is not None else None
            out.append(SlotCheck(s.slot_id, s.hits, s.hit_nodes / s.hits, expected))
    return tuple(out)


def measure(vm: Guest, conditions: str, touch_mib: int = TOUCH_MIB, runs: int = RUNS) -> FaultsBoot:
    """Settle the guest, reset L1's counts, time ``runs`` first touches of
    ``touch_mib`` MiB in the guest, read L1's counts."""
    path = vm.deploy(fault_probe.AGENT)

    def deadline(seconds: float) -> float:
        # Sized for a guest on this machine's wall clock, stretched for the
        # guest's clock (icount: 10x, which covers L1 underneath it too: a
        # shadow-paging window took 11 s of this machine's time).  A guest
        # that stops (one of ten shadow-paging boots here stopped at 6 s of
        # its clock, SSH open) is caught in minutes, not an hour.
        return clocks.deadline_s(seconds, vm.clock)

    vm.ssh.run(["sh", "-c", f"sync; sleep {SETTLE_S}"], timeout=deadline(SETTLE_S + 60))
    ram = l1_kinds.system_ram(str(vm.ssh.run(["cat", "/proc/iomem"]).stdout))
    vm.host_ssh.run(["sh", "-c", l1_kinds.RESET_SCRIPT])
    bound = deadline(fault_probe.RUN_BOUND_S * runs * max(1, touch_mib // 64))
    out = str(vm.ssh.run([path, str(touch_mib), str(runs)], timeout=bound).stdout)
    reading = l1_kinds.parse_reading(str(vm.host_ssh.run(["sh", "-c", l1_kinds.READ_SCRIPT]).stdout))
    if not reading.search:
        raise GuestError("L1's kvm names no memslot_search: not a kernel built with images/kvm-memslots/")
    faults = fault_probe.parse_runs(out, runs)
    kinds, checks = l1_kinds.sort_kinds(reading, ram), slot_checks(reading)
    mmio_path = vm.deploy(MMIO_AGENT)
    vm.host_ssh.run(["sh", "-c", l1_kinds.RESET_SCRIPT])
    out = str(
        vm.ssh.run(
            [mmio_path, *NIC, str(MMIO_READS), str(MMIO_RUNS)], timeout=deadline(MMIO_RUN_BOUND_S * MMIO_RUNS)
        ).stdout
    )
    after = l1_kinds.parse_reading(str(vm.host_ssh.run(["sh", "-c", l1_kinds.READ_SCRIPT]).stdout))
    reads, seconds = parse_mmio(out, MMIO_RUNS)
    mmio = MmioWindow(reads, seconds, l1_kinds.sort_kinds(after, ram))
    return FaultsBoot(reading.search, conditions, faults, kinds, checks, mmio)


def settings(touch_mib: int, runs: int) -> dict[str, Any]:
    return {
        "guest": GUEST.name,
        **GUEST.settings(),
        "workload": f"{fault_probe.AGENT} {touch_mib} MiB x {runs}",
        "touch_mib": touch_mib,
        "runs": runs,
    }


@dataclass(frozen=True)
class Where:
    """What every record of one kernel and conditions shares."""

    variant: dict[str, Any]
    settings: dict[str, Any]
    environment: dict[str, Any]

    def record(self, metric: str, unit: str, better: str, values: Sequence[float], **extra: str) -> Measurement:
        """One replicate a boot of ``values``."""
        return Measurement(
            scenario=SCENARIO,
            metric=metric,
            unit=unit,
            better=better,
            samples=[],
            replicates=[[float(v)] for v in values],
            variant=self.variant,
            settings=self.settings,
            environment=self.environment,
            extra={"unit_of_replication": UNIT, **extra},
        )


def records(
    boots: Sequence[FaultsBoot], environment: Environment, touch_mib: int = TOUCH_MIB, runs: int = RUNS
) -> list[Measurement]:
    """Per structure and conditions: ``fault_ns`` (the guest's ns a page,
    read on its clock), ``ram_hit_nodes`` (nodes per RAM hit, counted),
    and memslots.l1_lookup_kinds' searches per second of each kind, one
    replicate a boot.  Records of two kernels pair by their settings."""
    groups: dict[tuple[str, str], list[FaultsBoot]] = {}
    for boot in boots:
        groups.setdefault((boot.structure, boot.conditions), []).append(boot)
    setting, env = settings(touch_mib, runs), environment.to_json()
    out = []
    for (structure, conditions), group in groups.items():
        variant = {"structure": structure, "conditions": conditions}
        where = Where(variant, setting, env)
        out.append(where.record("fault_ns", "ns", "lower", [b.ns_per_page for b in group], clock_reads=GUEST_CLOCK))
        per_hit = [b.kinds.nodes_per("ram_hit") for b in group]
        if all(n is not None for n in per_hit):
            nodes = [n for n in per_hit if n is not None]
            out.append(where.record("ram_hit_nodes", "nodes", "lower", nodes, counted_by="the kernel's memslot_slots"))
        windows = [b.mmio for b in group]
        if all(w is not None for w in windows):
            mmio = Where(variant, {**setting, "mmio": MMIO_SETTING}, env)
            out += mmio_records([w for w in windows if w is not None], mmio)
        counts = [lookup_kinds.Counts({k: b.kinds.count(k) for k in l1_kinds.KINDS}, b.seconds) for b in group]
        for rec in lookup_kinds.records(counts, {**setting, "accel": "kvm"}):
            if rec.variant["kind"] in l1_kinds.KINDS:
                out.append(
                    dataclasses.replace(
                        rec,
                        scenario=KINDS_SCENARIO,
                        variant={**rec.variant, **variant, "workload": WORKLOAD},
                        environment=env,
                    )
                )
    return out


def mmio_records(windows: Sequence[MmioWindow], where: Where) -> list[Measurement]:
    """The NIC's register round trips a second (on the guest's clock) and
    the nodes a miss compared over them (counted), one replicate a boot."""
    rates = [w.round_trips_per_s for w in windows]
    out = [where.record("mmio_round_trips_per_s", "1/s", "higher", rates, clock_reads=GUEST_CLOCK)]
    walks = [w.kinds.nodes_per("miss") for w in windows]
    if all(n is not None for n in walks):
        counted = "memslot_miss_nodes over memslot_misses"
        out.append(
            where.record("mmio_miss_nodes", "nodes", "lower", [n for n in walks if n is not None], counted_by=counted)
        )
    return out


def conditions_of(params: Sequence[str]) -> str:
    """The name of the conditions a host's KVM parameters make (CONDITIONS),
    else the parameters themselves."""
    for name, words in CONDITIONS.items():
        if sorted(params) == sorted(words):
            return name
    return " ".join(params)


def to_json(boot: FaultsBoot) -> dict[str, Any]:
    return {
        "structure": boot.structure,
        "conditions": boot.conditions,
        "ns_per_page": boot.ns_per_page,
        "runs": [dataclasses.asdict(run) for run in boot.runs],
        "kinds": dataclasses.asdict(boot.kinds),
        "order": boot.kinds.order(),
        "slots": [dataclasses.asdict(c) for c in boot.checks],
        "findings": boot.findings(),
        "mmio": dataclasses.asdict(boot.mmio) if boot.mmio is not None else None,
    }


def render(boots: Sequence[FaultsBoot], host: str, clock_label: str) -> list[str]:
    """One line a boot: the guest's ns a page, each kind's searches and
    nodes per search, the order; then any slot whose count differs."""
    lines = [
        f"host: {host}, clock {clock_label}; guest {GUEST.name}, {fault_probe.AGENT} {TOUCH_MIB} MiB x {RUNS}",
        f"{'boot':>4} {'search':9} {'ns/page':>9} {'misses':>9} {'nodes':>6} {'RAM hits':>10} {'nodes':>6} "
        f"{'other hits':>10} {'nodes':>6}  order",
    ]
    for index, b in enumerate(boots, 1):
        k = b.kinds
        shown = k.nodes_shown()
        lines.append(
            f"{index:>4} {b.structure:9} {b.ns_per_page:>9.1f} {k.misses:>9} {shown['miss']:>6} {k.ram_hits:>10} "
            f"{shown['ram_hit']:>6} {k.other_hits:>10} {shown['other_hit']:>6}  {' > '.join(b.kinds.order())}"
        )
        if b.mmio is not None:
            walk = b.mmio.kinds.nodes_per("miss")
            lines.append(
                f"     NIC register reads: {b.mmio.round_trips_per_s:.1f} a second, "
                f"{b.mmio.misses_per_read:.2f} misses a read, "
                f"{'-' if walk is None else f'{walk:.2f}'} nodes a miss"
            )
        lines += [f"     differs: {finding}" for finding in b.findings()]
    return lines

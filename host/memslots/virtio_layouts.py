"""A virtio-mem guest of today: its memslot layouts as blocks are plugged,
through the reference structures and the real /dev/kvm.

Each plugged state (QEMU's ``dynamic-memslots=on``) is one layout record;
``today_rows`` gives, per state, the nodes a miss examines in each
reference structure (computed from the layout) and a miss's cost through
/dev/kvm at that slot count.  Listed on the memslot-miss card, never
deciding it.  docs/memslots-model.md, "virtio-mem layouts as records".
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.flatview import FlatRange
from memqual.host.core.record import Measurement
from memqual.host.memslots import model
from memqual.host.memslots.layout import layout_from_json
from memqual.host.memslots.qemu_layout import layout_from_flatview

SCENARIO = "virtio_mem.memslot_layout"
METRIC = "slots"
KVM_SCENARIO = "memslots.kvm_lookup"
KVM_METRIC = "access_ns"
READ_FROM = (
    "QEMU flat view of address space 'memory' (info mtree -f) with the device's blocks plugged: each ram/rom/romd "
    "range is one KVM memslot, the device's own are the ranges of its memory backend"
)


def device_slot_count(ranges: Sequence[FlatRange], memdev: str) -> int:
    """The memslots the device's memory backend occupies in the flat view."""
    return sum(1 for r in ranges if r.kind == "ram" and r.name == memdev)


def state_record(
    step: int, plugged_mib: int, ranges: Sequence[FlatRange], memdev: str, settings: dict[str, Any]
) -> Measurement:
    """The record of one plugged state of a real virtio-mem guest.  The
    layout is round-tripped through ``layout_from_json`` first, so a record
    always holds a layout the loader accepts."""
    name = f"virtio-mem step {step}: {plugged_mib} MiB plugged"
    layout = layout_from_flatview(ranges, name=name)
    data = layout.to_json()
    checked = layout_from_json(data, name)
    return Measurement(
        scenario=SCENARIO,
        metric=METRIC,
        unit="slots",
        better="lower",
        samples=[float(len(checked))],
        variant={"step": step, "plugged_mib": plugged_mib},
        settings=dict(settings),
        extra={"layout": data, "device_slots": device_slot_count(ranges, memdev), "read_from": READ_FROM},
    )


@dataclasses.dataclass(frozen=True)
class StructureNodes:
    """Nodes one reference structure examines on a complete miss: the
    exact mean over every gap of the layout, and the most any gap takes."""

    structure: str
    mean: float
    worst: int


@dataclasses.dataclass(frozen=True)
class KvmMiss:
    """A complete miss through /dev/kvm at one slot count: the median of
    the fresh VMs' median ns per access, and the lowest and highest VM."""

    slots: int
    median_ns: float
    low_ns: float
    high_ns: float
    vms: int
    samples: int


@dataclasses.dataclass(frozen=True)
class TodayRow:
    """One plugged state of a virtio-mem guest of today, as a card lists it."""

    step: int
    plugged_mib: int
    slots: int  # every memslot of the guest in this state
    device_slots: int  # the device's own
    nodes: tuple[StructureNodes, ...]
    kvm: KvmMiss | None  # None: /dev/kvm was not measured at this count in the run

    def nodes_of(self, structure: str) -> StructureNodes | None:
        return next((n for n in self.nodes if n.structure == structure), None)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def kvm_miss(records: Sequence[Measurement], slots: int, scenario: str = KVM_SCENARIO) -> KvmMiss | None:
    """The /dev/kvm miss cost at ``slots`` from the run's records: of the
    records at that count, the one with the most fresh VMs."""
    found = [
        r
        for r in records
        if r.scenario == scenario
        and r.metric == KVM_METRIC
        and r.variant.get("kind") == "miss"
        and r.variant.get("slots") == slots
        and r.samples
    ]
    if not found:
        return None
    rec = max(found, key=lambda r: (r.n_replicates, len(r.samples)))
    per_vm = [statistics.median(group) for group in rec.replicates]
    return KvmMiss(
        slots=slots,
        median_ns=statistics.median(per_vm),
        low_ns=min(per_vm),
        high_ns=max(per_vm),
        vms=len(per_vm),
        samples=len(rec.samples),
    )


def state_nodes(data: Any, name: str, structures: Sequence[str], workload: str = "miss") -> tuple[StructureNodes, ...]:
    """The model's nodes per structure on the layout a record holds."""
    layout = layout_from_json(data, name)
    table = model.model_table(layout, workload)
    out = []
    for structure in structures:
        stats = table.structures.get(structure)
        if stats is None:
            raise BadInput(f"{name}: the memslot model has no structure {structure!r}")
        out.append(StructureNodes(structure, stats.mean_nodes, stats.max_nodes))
    return tuple(out)


def today_rows(
    records: Sequence[Measurement],
    structures: Sequence[str],
    *,
    scenario: str = SCENARIO,
    kvm_scenario: str = KVM_SCENARIO,
    workload: str = "miss",
) -> list[TodayRow]:
    """One row per plugged state recorded in the run (the first record of
    a step wins: a later round of the same state has the same layout), in
    step order."""
    rows: dict[int, TodayRow] = {}
    for rec in records:
        if rec.scenario != scenario or "layout" not in rec.extra:
            continue
        step = int(rec.variant.get("step", len(rows)))
        if step in rows:
            continue
        plugged = int(rec.variant.get("plugged_mib", 0))
        name = f"{scenario} record of step {step}"
        nodes = state_nodes(rec.extra["layout"], name, structures, workload)
        slots = len(rec.extra["layout"]["slots"])
        rows[step] = TodayRow(
            step=step,
            plugged_mib=plugged,
            slots=slots,
            device_slots=int(rec.extra.get("device_slots", 0)),
            nodes=nodes,
            kvm=kvm_miss(records, slots, kvm_scenario),
        )
    return [rows[k] for k in sorted(rows)]


def slot_counts(records: Sequence[Measurement], scenario: str = SCENARIO) -> tuple[int, ...]:
    """The distinct slot counts of the recorded states, ascending: where
    /dev/kvm is measured."""
    return tuple(sorted({len(r.extra["layout"]["slots"]) for r in records if r.scenario == scenario}))

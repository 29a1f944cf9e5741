"""Replay a recorded trace of guest frames through the memslot model.

A trace is the guest frames a real guest touched (guest/mem_probe.c's
pages, or QEMU's MMIO trace events), replayed against the memslots that
guest really had; ``replay`` gives the model's nodes per structure and
``records`` the measurement records.  docs/memslots-qemu.md, "Traces" and
"host/memslots/trace.py in short", has the details and the file format.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.record import Measurement
from memqual.host.memslots.layout import Layout, from_json
from memqual.host.memslots.model import ModelTable, oracle, table_for_frames
from memqual.host.memslots.structures import STRUCTURES, build

MMIO_EVENTS = ("memory_region_ops_read", "memory_region_ops_write")
# An event of QEMU's "log" trace backend, e.g.
#   memory_region_ops_write cpu 0 mr 0x55.. addr 0xfee000b0 value 0x0 size 4 name 'apic-msi'
_MMIO_LINE = re.compile(
    r"memory_region_ops_(?:read|write) cpu -?\d+ mr 0x[0-9a-f]+ addr (0x[0-9a-f]+) .*? name '([^']*)'"
)
SCENARIO = "memslots.trace"
CLAIM = "memslot-hit"
# MMIO frames are all misses: the other claim of seeds 000/002.
MMIO_SCENARIO = "memslots.trace_mmio"
MMIO_CLAIM = "memslot-miss"
METRIC = "nodes_per_lookup"


@dataclasses.dataclass(frozen=True)
class TraceResult:
    table: ModelTable
    segment_means: dict[str, list[float]]  # structure -> mean nodes per trace segment

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table.to_json(), "segment_means": self.segment_means}


def replay(layout: Layout, frames: Sequence[int], segments: int = 10) -> TraceResult:
    """The model's table for ``frames`` looked up in order in ``layout``,
    and each structure's mean nodes per segment of the trace."""
    frames = list(frames)
    if not frames:
        raise BadInput("no frames to replay: the trace is empty")
    if segments < 1:
        raise BadInput(f"{segments} segments: give at least 1")
    table = table_for_frames(layout, frames, workload="trace")
    segments = min(segments, len(frames))
    bounds = [len(frames) * i // segments for i in range(segments + 1)]
    expected = oracle(layout, frames)
    per: dict[str, list[float]] = {}
    for name in STRUCTURES:
        index = build(name, layout)
        nodes = []
        for gfn, want in zip(frames, expected, strict=True):
            got, count = index.lookup(gfn)
            assert got == want, f"{name} answered {got} for {gfn:#x}, the layout says {want}"
            nodes.append(count)
        per[name] = [sum(nodes[a:b]) / (b - a) for a, b in itertools.pairwise(bounds)]
    return TraceResult(table, per)


def records(
    result: TraceResult,
    settings: dict[str, Any],
    started: str | None = None,
    duration_s: float = 0.0,
    scenario: str = SCENARIO,
    claim: str = CLAIM,
) -> list[Measurement]:
    """One record per structure: samples are the segment means."""
    out = []
    for name, stats in result.table.structures.items():
        extra = {
            "mean_nodes": stats.mean_nodes,
            "max_nodes": stats.max_nodes,
            "min_nodes": stats.min_nodes,
            "bound_nodes": stats.bound_nodes,
            "lookups": result.table.lookups,
            "hit_fraction": result.table.hit_fraction,
            "slots": result.table.slots,
        }
        record = Measurement(
            scenario=scenario,
            claim=claim,
            metric=METRIC,
            unit="nodes",
            better="lower",
            samples=result.segment_means[name],
            variant={"structure": name},
            settings=dict(settings),
            extra=extra,
            duration_s=duration_s,
        )
        if started:
            record.started = started
        out.append(record)
    return out


def save_trace(path: Path | str, layout: Layout, frames: Sequence[int], source: str = "") -> None:
    text = json.dumps({"layout": layout.to_json(), "frames": list(frames), "source": source}) + "\n"
    write_private_atomic(Path(path), text.encode(), 0o644)


def load_trace(path: Path | str) -> tuple[Layout, list[int]]:
    """A saved trace: its layout (validated) and frames."""
    path = Path(path)
    data = read_json(path, "trace file", "give a file written by save_trace")
    if not isinstance(data, dict) or "layout" not in data or not isinstance(data.get("frames"), list):
        raise BadInput(f'trace file {path}: expected {{"layout": {{...}}, "frames": [...]}}')
    frames = data["frames"]
    if not all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in frames):
        raise BadInput(f"trace file {path}: frames must be non-negative integers")
    return from_json(data["layout"], name=str(path), source=f"trace {path}"), frames


def mmio_trace_args(log_path: Path | str) -> tuple[str, ...]:
    """QEMU arguments that send trace events to ``log_path``.  Enabling an
    event that never fires under TCG (kvm_set_user_memory; under KVM it
    logs the real slot registrations) turns the log backend on; the MMIO
    events are switched on later, only around what is recorded."""
    return ("-D", str(log_path), "-trace", "enable=kvm_set_user_memory")


def set_mmio_tracing(vm: Any, enable: bool) -> None:
    for event in MMIO_EVENTS:
        vm.qmp("trace-event-set-state", name=event, enable=enable)


def parse_mmio_log(text: str, flatview: Sequence[Any]) -> list[int]:
    """Frames of the guest's MMIO accesses in a QEMU trace log, in order:
    accesses whose address lies in an i/o range of the same name in the
    "memory" flat view (``qemu_layout.FlatRange``)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for range_ in flatview:
        if range_.kind == "i/o":
            ranges.setdefault(range_.name, []).append((range_.start, range_.end))
    frames = []
    for match in _MMIO_LINE.finditer(text):
        addr, name = int(match.group(1), 16), match.group(2)
        if any(start <= addr <= end for start, end in ranges.get(name, ())):
            frames.append(addr >> 12)
    return frames

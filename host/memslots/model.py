"""The model table: nodes examined per lookup, per structure, for one layout
and one workload, with the seed's published figures next to it.

``model_table(layout, workload, lookups, seed)`` builds every structure,
looks up the workload's frames, checks every answer against the layout and
returns the mean and worst counts; nothing is timed.  The ``miss`` workload
is exact (one frame per gap).  docs/memslots-model.md, "host/memslots/model.py"."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import Layout
from memqual.host.memslots.structures import STRUCTURES, build
from memqual.host.memslots.workloads import generate, holes

# Seed 000 (Alex Williamson, 2011-02-23), the claim "memslot-miss": on a
# complete miss the weight-balanced tree walks 6-7 nodes where the 32-entry
# array walks all 32.  The figures apply to misses on a 32-slot array; the
# tree they are about is modelled as ``tree2011`` (``hbtree`` is memqual's
# own design, so the seed's figures say nothing about it).
PUBLISHED: dict[str, Any] = {
    "claim": "memslot-miss",
    "source": "seed 000: Alex Williamson, LKML, 2011-02-23",
    "quote": "we're only traversing 6-7 tree nodes until we don't find a match, "
    "versus the full 32 entries of the original memslot array",
    "applies_to": {"workload": "miss", "slots": 32},
    "structures": {
        "linear": {"nodes": "32", "min_nodes": 32, "max_nodes": 32},
        "tree2011": {"nodes": "6-7", "min_nodes": 6, "max_nodes": 7},
    },
}


@dataclasses.dataclass(frozen=True)
class StructureStats:
    """Nodes examined by one structure over the workload."""

    mean_nodes: float
    max_nodes: int
    min_nodes: int
    bound_nodes: int | None  # worst case guaranteed by construction for this slot count

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ModelTable:
    layout: str
    workload: str
    slots: int
    lookups: int
    seed: int
    hit_fraction: float  # share of the workload's frames that fell in a slot
    structures: dict[str, StructureStats]

    @property
    def published_applies(self) -> bool:
        """Whether the seed's figures are about this very case."""
        return self.workload == PUBLISHED["applies_to"]["workload"] and self.slots == PUBLISHED["applies_to"]["slots"]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``json.dumps`` it): the CLI's ``--json`` shape."""
        return {**dataclasses.asdict(self), "published": dict(PUBLISHED, applies=self.published_applies)}


class ModelDisagreement(AssertionError):
    """A structure answered differently from the layout: a bug in the model."""


def oracle(layout: Layout, gfns: list[int]) -> list[int | None]:
    """The slot holding each gfn, straight from the layout (bisect on the
    gfn-sorted slots: independent of every structure under test)."""
    ordered = layout.by_gfn()
    bases = [s.base_gfn for s in ordered]
    answers: list[int | None] = []
    for gfn in gfns:
        i = bisect.bisect_right(bases, gfn) - 1
        answers.append(ordered[i].id if i >= 0 and ordered[i].contains(gfn) else None)
    return answers


def run_structure(name: str, layout: Layout, gfns: list[int], expected: list[int | None]) -> StructureStats:
    index = build(name, layout)
    lookup = index.lookup
    total = 0
    worst = 0
    least = None
    for gfn, want in zip(gfns, expected, strict=True):
        got, nodes = lookup(gfn)
        if got != want:
            raise ModelDisagreement(f"{name} found slot {got} for gfn {gfn:#x}, the layout says {want}")
        total += nodes
        worst = max(worst, nodes)
        least = nodes if least is None else min(least, nodes)
    return StructureStats(
        mean_nodes=total / len(gfns),
        max_nodes=worst,
        min_nodes=least or 0,
        bound_nodes=index.bound(len(layout)),
    )


def model_table(layout: Layout, workload: str, lookups: int = 10000, seed: int = 0) -> ModelTable:
    """Mean and worst nodes per structure for ``lookups`` frames of
    ``workload`` (seeded) over ``layout``.  Raises BadInput for an unknown
    workload or a workload the layout cannot serve (e.g. small-hits on a
    layout without small slots).  ``miss`` is exact: one frame per gap
    (``lookups`` and ``seed`` do not enter)."""
    if workload == "miss":
        gaps = holes(layout)
        if not gaps:
            raise BadInput(f"layout {layout.name!r} fills the whole gfn space: no frame can miss")
        return table_for_frames(layout, [start for start, _ in gaps], workload=workload, seed=seed)
    gfns = generate(layout, workload, lookups, seed)
    return table_for_frames(layout, gfns, workload=workload, seed=seed)


def nodes_at(layout: Layout, structure: str, gfn: int) -> int:
    """Nodes ``structure`` examines looking ``gfn`` up in ``layout`` (one
    lookup on a fresh structure): the cost of one named path, such as a
    miss at an emulated device's MMIO BAR."""
    return run_structure(structure, layout, [gfn], oracle(layout, [gfn])).max_nodes


def table_for_frames(layout: Layout, gfns: list[int], workload: str = "trace", seed: int = 0) -> ModelTable:
    """The same table for frames given by the caller, in order: a trace of
    the frames a real guest touched, replayed through every structure
    (binsearch-lru sees the trace's locality).  ``workload`` only labels it."""
    if not gfns:
        raise BadInput("no frames to look up: the trace is empty")
    expected = oracle(layout, gfns)
    stats = {name: run_structure(name, layout, gfns, expected) for name in STRUCTURES}
    hits = sum(1 for e in expected if e is not None)
    return ModelTable(
        layout=layout.name,
        workload=workload,
        slots=len(layout),
        lookups=len(gfns),
        seed=seed,
        hit_fraction=hits / len(gfns),
        structures=stats,
    )

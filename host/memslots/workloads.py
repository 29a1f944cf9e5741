"""Workloads: seeded streams of guest frame numbers to look up.

Seed 002's three kinds of lookup: ``miss`` (a hole picked uniformly, then a
frame in it), ``ram-hits`` (slots weighted by size), ``other-hits`` (alias
``small-hits``: the small slots, each equally likely) and ``mixed`` (70 /
25 / 5 %: an assumption, not a published figure).  The same layout,
workload, count and seed give the same frames.  docs/memslots-model.md,
"The workloads".
"""

from __future__ import annotations

import bisect
import itertools
import random

from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import GFN_LIMIT, Layout, Slot

WORKLOADS = ("miss", "ram-hits", "other-hits", "small-hits", "mixed")
# Names that are the same workload (same frames for the same seed).
ALIASES = {"other-hits": "small-hits"}
SMALL_SLOT_PAGES = 4096  # 16 MiB: the largest BAR or ROM we call "small"
ABOVE_TOP_PAGES = 1 << 18  # 1 GiB of MMIO space modelled above the last slot
MIXED_SHARES = (("miss", 0.70), ("ram-hits", 0.25), ("small-hits", 0.05))


def holes(layout: Layout) -> list[tuple[int, int]]:
    """Gfn ranges [start, end) in no slot, in gfn order (the last one is the
    modelled MMIO space above the highest slot)."""
    result = []
    cursor = 0
    for slot in layout.by_gfn():
        if slot.base_gfn > cursor:
            result.append((cursor, slot.base_gfn))
        cursor = slot.end_gfn
    top = min(cursor + ABOVE_TOP_PAGES, GFN_LIMIT)
    if top > cursor:
        result.append((cursor, top))
    return result


def small_slots(layout: Layout) -> list[Slot]:
    return [s for s in layout.slots if s.npages <= SMALL_SLOT_PAGES]


class _Sampler:
    """Draws frames of each kind from one random generator."""

    def __init__(self, layout: Layout, rng: random.Random) -> None:
        self.rng = rng
        self.layout = layout
        self._holes = holes(layout)
        self._slots = list(layout.slots)
        self._cumulative = list(itertools.accumulate(s.npages for s in self._slots))
        self._small = small_slots(layout)

    def miss(self) -> int:
        if not self._holes:
            raise BadInput(f"layout {self.layout.name!r} fills the whole gfn space: no frame can miss")
        start, end = self._holes[self.rng.randrange(len(self._holes))]
        return self.rng.randrange(start, end)

    def ram_hit(self) -> int:
        if not self._slots:
            raise BadInput(f"layout {self.layout.name!r} has no slots: nothing to hit")
        page = self.rng.randrange(self._cumulative[-1])
        index = bisect.bisect_right(self._cumulative, page)
        before = self._cumulative[index - 1] if index else 0
        return self._slots[index].base_gfn + (page - before)

    def small_hit(self) -> int:
        if not self._small:
            raise BadInput(
                f"layout {self.layout.name!r} has no slot of at most {SMALL_SLOT_PAGES} pages (16 MiB): "
                "other-hits (small-hits) and mixed need one; use miss or ram-hits"
            )
        slot = self._small[self.rng.randrange(len(self._small))]
        return slot.base_gfn + self.rng.randrange(slot.npages)


def generate(layout: Layout, workload: str, count: int, seed: int = 0) -> list[int]:
    """``count`` frames of ``workload`` over ``layout``, reproducible by seed."""
    if workload not in WORKLOADS:
        raise BadInput(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")
    if count < 1:
        raise BadInput(f"lookup count {count} is too small: give at least 1")
    workload = ALIASES.get(workload, workload)
    # The workload name is part of the seed so that "miss" and "ram-hits"
    # with the same --seed are independent streams.
    sampler = _Sampler(layout, random.Random(f"{seed}:{workload}"))
    if workload == "miss":
        return [sampler.miss() for _ in range(count)]
    if workload == "ram-hits":
        return [sampler.ram_hit() for _ in range(count)]
    if workload == "small-hits":
        return [sampler.small_hit() for _ in range(count)]
    draw = {"miss": sampler.miss, "ram-hits": sampler.ram_hit, "small-hits": sampler.small_hit}
    kinds = [k for k, _ in MIXED_SHARES]
    weights = [w for _, w in MIXED_SHARES]
    chosen = sampler.rng.choices(kinds, weights=weights, k=count)
    return [draw[kind]() for kind in chosen]

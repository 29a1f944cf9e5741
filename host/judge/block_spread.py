"""The block spread of an A/B run's metrics: for each metric both arms
recorded in blocks, the sd of the blocks' log(B/A), each block's value
being the median of its arm's samples in that block.  On an A/A run (one
kernel against itself) this is the instrument's noise from block to block,
which host/judge/primaries.py keeps per primary and clock, and which sets
how many blocks an equivalence margin needs.  Pure: no guest, no file
beyond the two results.json it is given.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from memqual.host.judge.primaries import primary_of
from memqual.host.judge.results import MetricEntry, Results


@dataclasses.dataclass(frozen=True)
class BlockSpread:
    key: str  # results.json's metric key
    scenario: str
    metric: str
    variant: dict[str, Any]
    primary: bool  # a primary on the clock of the run
    clock: str
    log_ratios: tuple[float, ...]  # one a block, in block order

    @property
    def blocks(self) -> int:
        return len(self.log_ratios)

    @property
    def sd(self) -> float:
        """The sd of the blocks' log(B/A); nan with fewer than 2 blocks."""
        return statistics.stdev(self.log_ratios) if self.blocks >= 2 else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "primary": self.primary,
            "clock": self.clock,
            "blocks": self.blocks,
            "sd_log_ratio": None if math.isnan(self.sd) else round(self.sd, 6),
            "log_ratios": [round(x, 6) for x in self.log_ratios],
        }


def per_block(entry: MetricEntry) -> dict[int, float]:
    """The median of each block's samples of one results.json metric entry
    (empty when the entry has no blocks)."""
    blocks = entry.blocks or []
    replicates = entry.replicates or []
    grouped: dict[int, list[float]] = {}
    for block, samples in zip(blocks, replicates, strict=False):
        grouped.setdefault(int(block), []).extend(float(x) for x in samples)
    return {block: statistics.median(values) for block, values in grouped.items() if values}


def block_spreads(a: Results | Mapping[str, Any], b: Results | Mapping[str, Any]) -> list[BlockSpread]:
    """Every metric of ``a`` and ``b`` (two results.json, as loaded) that
    both recorded in the same blocks, with positive values in each."""
    a, b = Results.from_json(a), Results.from_json(b)
    clock = str((a.environment or {}).get("clock") or "wall")
    by_key = {m.key: m for m in b.metrics}
    out = []
    for ma in a.metrics:
        mb = by_key.get(ma.key)
        if mb is None:
            continue
        # Under a plan (--clock auto) each metric names its own clock.
        read_with = ma.clock or clock
        va, vb = per_block(ma), per_block(mb)
        common = sorted(set(va) & set(vb))
        if not common or any(va[k] <= 0 or vb[k] <= 0 for k in common):
            continue
        out.append(
            BlockSpread(
                key=ma.key,
                scenario=ma.scenario,
                metric=ma.metric,
                variant=dict(ma.variant or {}),
                primary=primary_of(ma.scenario, ma.metric, ma.variant, read_with) is not None,
                clock=read_with,
                log_ratios=tuple(math.log(vb[k] / va[k]) for k in common),
            )
        )
    return out


def table(spreads: Sequence[BlockSpread]) -> list[str]:
    """Lines of a plain table: primaries first, then by spread."""
    rows = sorted(spreads, key=lambda s: (not s.primary, -s.sd if not math.isnan(s.sd) else 0.0, s.key))
    lines = [f"{'role':<11} {'blocks':>6} {'sd log(B/A)':>12} {'clock':<9} metric"]
    for s in rows:
        sd = "-" if math.isnan(s.sd) else f"{s.sd:.5f}"
        lines.append(f"{'primary' if s.primary else 'other':<11} {s.blocks:>6} {sd:>12} {s.clock:<9} {s.key}")
    return lines

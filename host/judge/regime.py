"""The conditions some metrics hold under: runs compare only where they match.

A metric whose regime (its scenario row's ``regime``; today: KSM's
dirtying rate per full scan) differs
between the sides beyond the tolerance is ``not comparable`` in ``memqual
compare`` and ``memqual history``: no decision, no exit status.  The rule
and why: docs/verdicts.md, "Not comparable: regimes".  No numpy here:
``memqual --help`` loads the comparison module.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memqual.host.core import scenario
from memqual.host.core.primary import Regime
from memqual.host.judge.results import MetricEntry

NOT_COMPARABLE = "not comparable"


def condition_of(scenario_name: str, metric: str) -> Regime | None:
    """The regime a metric is compared under (its row's,
    host/core/primary.py); None for a metric with none, and for the metric
    that records the regime."""
    row = scenario.find(scenario_name)
    condition = row.regime if row is not None else None
    if condition is None or metric == condition.metric:
        return None
    return condition


@dataclasses.dataclass(frozen=True)
class RegimeCheck:
    """The regime of each side (a run, or an arm) of one comparison."""

    condition: Regime
    names: tuple[str, ...]  # "A", "B", or the runs of a series
    rates: tuple[float | None, ...]  # geometric mean a side; None where not recorded

    @property
    def spread(self) -> float | None:
        """The largest rate over the smallest; None when a side has none."""
        if any(r is None for r in self.rates) or not self.rates:
            return None
        known = [r for r in self.rates if r is not None]
        return max(known) / min(known)

    @property
    def matches(self) -> bool:
        spread = self.spread
        return spread is not None and spread <= self.condition.tolerance

    def reason(self) -> str:
        """One line: why the metric is not compared (or that it matched)."""
        c = self.condition
        missing = [n for n, r in zip(self.names, self.rates, strict=True) if r is None]
        if missing:
            return f"{NOT_COMPARABLE}: {c.label} not recorded in {', '.join(missing)}"
        known = [r for r in self.rates if r is not None]
        if len(known) == 2:
            sides = f"{self.names[0]} {known[0]:.3g} vs {self.names[1]} {known[1]:.3g} {c.unit}"
        else:
            sides = f"from {min(known):.3g} to {max(known):.3g} {c.unit} over {len(known)} runs"
        if self.matches:
            return f"{c.label} {sides}: they match (within x{c.tolerance:g})"
        return f"{NOT_COMPARABLE}: {c.label} {sides} (x{self.spread:.2f} apart; runs compare within x{c.tolerance:g})"

    def to_json(self) -> dict[str, Any]:
        return {
            "condition": self.condition.metric,
            "label": self.condition.label,
            "unit": self.condition.unit,
            "tolerance": self.condition.tolerance,
            "rates": dict(zip(self.names, self.rates, strict=True)),
            "spread": self.spread,
            "matches": self.matches,
            "reason": self.reason(),
        }


def _within(rate_variant: Mapping[str, Any], variant: Mapping[str, Any], free: Iterable[str]) -> bool:
    fixed = {k: v for k, v in variant.items() if k not in free}
    return dict(rate_variant) == fixed


def side_rate(
    entries: Sequence[MetricEntry],
    condition: Regime,
    variant: Mapping[str, Any],
    settings: Mapping[str, Any],
) -> float | None:
    """The geometric mean over a run's units of the condition's metric,
    from the entry of the same variant (less the free keys) and settings;
    None when the run did not record it or recorded no positive value.
    ``entries`` are results.json metric entries."""
    values: list[float] = []
    for e in entries:
        if (
            e.scenario != condition.scenario
            or e.metric != condition.metric
            or not _within(e.variant or {}, variant, condition.free_keys)
            or dict(e.settings or {}) != dict(settings)
        ):
            continue
        reps = e.replicates or [e.samples or []]
        values += [float(statistics.median(r)) for r in reps if r]
    positive = [v for v in values if math.isfinite(v) and v > 0.0]
    if not positive:
        return None
    return math.exp(math.fsum(math.log(v) for v in positive) / len(positive))


def check(
    condition: Regime,
    sides: Sequence[tuple[str, Sequence[MetricEntry], Mapping[str, Any], Mapping[str, Any]]],
) -> RegimeCheck:
    """The regime check of one metric over its sides: (name, that side's
    metric entries, the metric's variant there, its settings there)."""
    return RegimeCheck(
        condition,
        tuple(name for name, _, _, _ in sides),
        tuple(side_rate(entries, condition, variant, settings) for _, entries, variant, settings in sides),
    )

"""One A/B's decisions, apart from reading files: each family (primaries
and controls by Holm, the exploratory metrics by Benjamini-Hochberg at a
quarter of alpha) corrected on its own, for a difference and for
equivalence at each metric's margin, and the verdict each test earns
(``decide``; ``decide_one`` for a bisect's one metric).  The calibration
runs these on synthetic tests (docs/ab-calibration.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from memqual.host.judge.primaries import CONTROL, EXPLORATORY, PRIMARY, is_control
from memqual.host.judge.results import MetricEntry
from memqual.host.judge.verdicts import (
    CHANGED,
    EQUIVALENT,
    EXPLORATORY_ALPHA_SHARE,
    FASTER,
    ROLES,
    SLOWER,
    UNDECIDED,
    MetricStats,
)

if TYPE_CHECKING:
    from memqual.host.judge.stats import ab_tests


@dataclasses.dataclass(frozen=True)
class FamilyDecision:
    """One test's corrected p-values in its family and the levels they faced."""

    p_adjusted: float
    p_equivalence_adjusted: float
    alpha_difference: float
    alpha_equivalence: float


def _levels(pvalues: Sequence[float], adjusted: Sequence[float], alpha: float, holm: bool) -> list[float]:
    """The level each raw p faced: Holm's alpha / (m - k) at its step when
    rejected, and the level where the step-down stopped otherwise;
    Benjamini-Hochberg's alpha k / m likewise."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    step = {i: k for k, i in enumerate(order)}
    rejected = sum(1 for p in adjusted if p < alpha)
    out = []
    for i in range(m):
        k = step[i] if adjusted[i] < alpha else rejected
        out.append(alpha / (m - k) if holm else alpha * (k + 1) / m)
    return out


# A look's p-values in place of the tests' own: (difference, equivalence)
# per test, None where the test's own stand.
Sequential = Sequence[tuple[float, float] | None]
# Where a look's p-values come from: a metric's key, its test and its
# equivalence margin give them (None: the test's own).
SequentialOf = Callable[[str, "ab_tests.RatioTest", float], tuple[float, float] | None]


def decide_family(
    tests: Sequence[ab_tests.RatioTest],
    *,
    threshold: float,
    alpha: float,
    holm: bool = True,
    sequential: Sequential | None = None,
    margins: Sequence[float] | None = None,
) -> list[FamilyDecision]:
    """Holm (or Benjamini-Hochberg) over one family, for the p of a
    difference and, separately, for the TOST p of equivalence (at each
    test's margin, ``threshold`` where ``margins`` is not given); on the
    ``sequential`` p-values where given (a look of --until-decided)."""
    from memqual.host.judge.stats import ab_tests, permutation

    if not tests:
        return []
    correct = permutation.holm if holm else ab_tests.benjamini_hochberg
    given = list(sequential) if sequential is not None else [None] * len(tests)
    bands = list(margins) if margins is not None else [threshold] * len(tests)
    p = [t.p_difference() if g is None else g[0] for t, g in zip(tests, given, strict=True)]
    q = [t.p_equivalence(m) if g is None else g[1] for t, g, m in zip(tests, given, bands, strict=True)]
    pa, qa = correct(p), correct(q)
    la, lq = _levels(p, pa, alpha, holm), _levels(q, qa, alpha, holm)
    return [FamilyDecision(pa[i], qa[i], la[i], lq[i]) for i in range(len(tests))]


def verdict_of(
    test: ab_tests.RatioTest, decision: FamilyDecision, *, better: str, threshold: float, alpha: float
) -> str:
    """``slower``/``faster``: the test of no change rejected (corrected p
    below the family's level) and the estimate beyond the margin -- what
    the words mean, and not a test against 1 + margin (a change shown to
    exceed the margin would need the interval beyond it);
    ``equivalent``: the TOST rejected (the interval inside the band);
    ``changed``: no change rejected, the estimate inside the margin, no
    equivalence shown; ``undecided``: neither test rejected."""
    ratio = test.ratio_of(test.estimate)
    if decision.p_adjusted < alpha and math.isfinite(ratio):
        if abs(ratio - 1.0) >= threshold:
            return FASTER if (ratio > 1.0) == (better == "higher") else SLOWER
        return EQUIVALENT if decision.p_equivalence_adjusted < alpha else CHANGED
    if decision.p_equivalence_adjusted < alpha:
        return EQUIVALENT
    return UNDECIDED


def family_alpha(role: str, alpha: float) -> float:
    return alpha * EXPLORATORY_ALPHA_SHARE if role == EXPLORATORY else alpha


def roles_of(pairs: Sequence[tuple[MetricEntry, MetricEntry]]) -> list[str]:
    """Each pair's family: a control by its scenario; a primary when either
    side marks it so, or when neither file marks any metric at all."""
    marked = any(m.primary is not None for pair in pairs for m in pair)
    out = []
    for ma, mb in pairs:
        if is_control(ma.scenario):
            out.append(CONTROL)
        elif not marked or ma.primary or mb.primary:
            out.append(PRIMARY)
        else:
            out.append(EXPLORATORY)
    return out


def decide(
    tests: Sequence[ab_tests.RatioTest],
    roles: Sequence[str],
    better: Sequence[str],
    *,
    threshold: float,
    alpha: float,
    sequential: Sequential | None = None,
    margins: Sequence[float] | None = None,
) -> tuple[list[FamilyDecision], list[str]]:
    """Every test's family decision and verdict, each family corrected on
    its own: what compare_runs decides, apart from reading files (the
    calibration runs this on synthetic tests).  ``sequential``: a look's
    p-values in place of the tests' own (``decide_family``); ``margins``:
    each test's equivalence margin, the band its change is judged against
    (``threshold`` for every test where not given)."""
    bands = list(margins) if margins is not None else [threshold] * len(tests)
    decisions: dict[int, FamilyDecision] = {}
    for role in ROLES:
        members = [i for i, r in enumerate(roles) if r == role]
        found = decide_family(
            [tests[i] for i in members],
            threshold=threshold,
            alpha=family_alpha(role, alpha),
            holm=role != EXPLORATORY,
            sequential=[sequential[i] for i in members] if sequential is not None else None,
            margins=[bands[i] for i in members],
        )
        decisions.update(zip(members, found, strict=True))
    ordered = [decisions[i] for i in range(len(tests))]
    verdicts = [
        verdict_of(t, d, better=bt, threshold=m, alpha=family_alpha(r, alpha))
        for t, d, bt, r, m in zip(tests, ordered, better, roles, bands, strict=True)
    ]
    return ordered, verdicts


def metric_stats(
    test: ab_tests.RatioTest,
    a_reps: Sequence[Sequence[float]],
    b_reps: Sequence[Sequence[float]],
    decision: FamilyDecision | None,
    verdict: str,
    *,
    threshold: float,
    sequential: tuple[float, float] | None = None,
    unit_kind: str = "replicate",
) -> MetricStats:
    """What a metric's test and its family decision found, with the units
    an undecided one would need at the levels it faced.  ``decision`` is
    None for a metric left out of every family (not comparable): no
    adjusted p-values, no levels, no units to ask for."""
    from memqual.host.core import descriptive
    from memqual.host.judge.stats import intervals

    low, high = test.interval()
    return MetricStats(
        a=descriptive.summarize([x for r in a_reps for x in r]),
        b=descriptive.summarize([x for r in b_reps for x in r]),
        ratio=test.ratio_of(test.estimate),
        ci_low=low,
        ci_high=high,
        confidence=intervals.CONFIDENCE,
        p_value=test.p_difference(),
        p_equivalence=test.p_equivalence(threshold),
        n_replicates_a=len(a_reps),
        n_replicates_b=len(b_reps),
        n_blocks=test.n_blocks,
        p_method=test.method,
        p_adjusted=decision.p_adjusted if decision else None,
        p_equivalence_adjusted=decision.p_equivalence_adjusted if decision else None,
        alpha_difference=decision.alpha_difference if decision else 0.0,
        alpha_equivalence=decision.alpha_equivalence if decision else 0.0,
        blocks_needed=(
            test.units_needed(threshold, decision.alpha_difference, decision.alpha_equivalence)
            if decision and verdict == UNDECIDED
            else None
        ),
        p_sequential=sequential[0] if sequential else None,
        p_equivalence_sequential=sequential[1] if sequential else None,
        margin=threshold,
        unit_kind="block" if test.paired else unit_kind,
    )


def decide_one(
    a_reps: Sequence[Sequence[float]],
    b_reps: Sequence[Sequence[float]],
    a_blocks: Sequence[int] | None = None,
    b_blocks: Sequence[int] | None = None,
    *,
    better: str,
    threshold: float,
    alpha: float,
) -> tuple[MetricStats, str]:
    """One metric decided on its own, a primary family of one, exactly as
    compare_runs decides each metric: the bisect's question about its
    one metric.  ValueError when a side has no samples."""
    from memqual.host.judge.stats import ab_tests

    test = ab_tests.ratio_test(a_reps, b_reps, a_blocks or None, b_blocks or None)
    decisions, verdicts = decide([test], [PRIMARY], [better], threshold=threshold, alpha=alpha)
    return metric_stats(test, a_reps, b_reps, decisions[0], verdicts[0], threshold=threshold), verdicts[0]


def run_medians(runs: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """One unit a run: each run's median of its replicate medians, as a
    replicate of one sample (what ``ab_tests.ratio_test`` then tests with
    the runs as the units)."""
    import statistics

    out = []
    for reps in runs:
        medians = [statistics.median(r) for r in reps if len(r)]
        if medians:
            out.append([float(statistics.median(medians))])
    return out

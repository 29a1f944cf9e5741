"""Run B against run A, metric by metric, on independent replicates: the
verdicts (slower, faster, equivalent, undecided; not comparable across
regimes) per family (primaries and controls by Holm, the rest by
Benjamini-Hochberg), and whether the host drifted.  The computation behind
memqual compare, comparison.html, --until-decided and the history's
families; docs/claims-and-report.md ("memqual compare") is the manual.
Draws nothing and prints nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memqual.host.core.clock import check_same as check_same_clock
from memqual.host.core.errors import BadInput
from memqual.host.judge.primaries import CONTROL, EXPLORATORY, PRIMARY, is_control
from memqual.host.judge.primaries import margin as margin_of
from memqual.host.judge.regime import NOT_COMPARABLE, RegimeCheck, condition_of
from memqual.host.judge.regime import check as check_regime
from memqual.host.judge.results import MetricEntry, Results, variant_label

if TYPE_CHECKING:
    from memqual.host.judge import stats
    from memqual.host.judge.stats import ab_tests

# Defaults (memqual.host.judge.stats has the same values; not imported here so that
# `memqual --help` does not load numpy and scipy).
DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
CORRECTION = {PRIMARY: "holm", CONTROL: "holm", EXPLORATORY: "benjamini-hochberg at alpha/4"}
# The share of alpha the exploratory family gets (see the module docstring).
EXPLORATORY_ALPHA_SHARE = 0.25

FASTER = "faster"
SLOWER = "slower"
EQUIVALENT = "equivalent"
# Shown to differ from A (the test of no change rejected at its level) with
# an estimate inside the margin, and not shown inside it: a decision (under
# --until-decided the metric crossed its boundary and is frozen there), not
# a regression.
CHANGED = "changed"
UNDECIDED = "undecided"
# Two runs of one side each, not in blocks: the test of their replicates
# says whether the two runs differ, which is a description, not a decision
# about the kernels (run-to-run variance is not in it).
RUNS_DIFFER = "runs differ"
# NOT_COMPARABLE is listed with the verdicts but is none: no decision was made.
VERDICTS = (SLOWER, FASTER, EQUIVALENT, CHANGED, UNDECIDED, RUNS_DIFFER, NOT_COMPARABLE)
ROLES = (PRIMARY, CONTROL, EXPLORATORY)


@dataclasses.dataclass(frozen=True)
class MetricStats:
    """What the test of one metric found: the pooled samples' summaries,
    the ratio B / A the test estimates (a geometric mean ratio of
    replicate medians, per block when paired) with its 95 % t-interval, the
    raw and corrected p of a difference and of equivalence, and the levels
    those corrected p faced."""

    a: stats.Summary
    b: stats.Summary
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    p_equivalence: float
    n_replicates_a: int
    n_replicates_b: int
    n_blocks: int  # 0 when unpaired
    p_method: str
    p_adjusted: float | None = None
    p_equivalence_adjusted: float | None = None
    alpha_difference: float = 0.0  # the level the raw p faced in its family
    alpha_equivalence: float = 0.0
    blocks_needed: int | None = None  # units a side that would decide it (undecided only)
    # The increment-scale p of a look in a sequence (--until-decided), what
    # the family's correction ran on; None for a single comparison.
    p_sequential: float | None = None
    p_equivalence_sequential: float | None = None
    # The threshold band's half-width, shown with every verdict.
    margin: float = 0.0
    # What the test's units are: "block" (paired), "run" (several runs a
    # side, one value a run), "replicate" (a replicate a unit: a bisect
    # probe outside blocks), "descriptive" (one run a side outside blocks:
    # the runs' replicates, which say whether the two runs differ, not
    # whether the kernels do).
    unit_kind: str = "replicate"

    @property
    def paired(self) -> bool:
        return self.n_blocks > 0

    @property
    def units(self) -> int:
        """The independent units a side the test rests on (blocks when paired)."""
        return self.n_blocks if self.paired else min(self.n_replicates_a, self.n_replicates_b)

    def to_json(self) -> dict[str, Any]:
        def finite(x: float | None) -> float | None:
            return x if x is not None and math.isfinite(x) else None

        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "ratio": finite(self.ratio),
            "ci": [finite(self.ci_low), finite(self.ci_high)],
            "confidence": self.confidence,
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "p_equivalence": self.p_equivalence,
            "p_equivalence_adjusted": self.p_equivalence_adjusted,
            "alpha_difference": self.alpha_difference,
            "alpha_equivalence": self.alpha_equivalence,
            "n_replicates_a": self.n_replicates_a,
            "n_replicates_b": self.n_replicates_b,
            "n_blocks": self.n_blocks,
            "paired": self.paired,
            "p_method": self.p_method,
            "blocks_needed": self.blocks_needed,
            "margin": self.margin,
            "unit_kind": self.unit_kind,
            **(
                {"p_sequential": self.p_sequential, "p_equivalence_sequential": self.p_equivalence_sequential}
                if self.p_sequential is not None
                else {}
            ),
        }


@dataclasses.dataclass(frozen=True)
class MetricComparison:
    key: str
    scenario: str
    metric: str
    unit: str
    better: str
    comparison: MetricStats
    verdict: str
    role: str = PRIMARY
    settings_changed: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    variant: dict[str, Any] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # A's
    # Each side's regime, for a metric that holds only under one (host/judge/regime.py).
    regime: RegimeCheck | None = None

    @property
    def flagged(self) -> bool:
        return self.verdict in (SLOWER, FASTER)

    @property
    def comparable(self) -> bool:
        return self.verdict != NOT_COMPARABLE

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "settings_changed": {k: {"a": va, "b": vb} for k, (va, vb) in self.settings_changed.items()},
            "scenario": self.scenario,
            "metric": self.metric,
            "unit": self.unit,
            "better": self.better,
            "role": self.role,
            "primary": self.role == PRIMARY,
            "verdict": self.verdict,
            "verdict_text": verdict_text(self),
            "verdict_meaning": verdict_meaning(self.verdict, self.comparison),
            "regime": self.regime.to_json() if self.regime else None,
            **self.comparison.to_json(),
        }


@dataclasses.dataclass(frozen=True)
class RunComparison:
    metrics: list[MetricComparison]
    claims: list[dict[str, Any]]  # id, verdict in A, verdict in B
    environment: dict[str, tuple[Any, Any]]  # keys whose values differ
    threshold: float
    alpha: float
    only_in_a: list[str] = dataclasses.field(default_factory=list)  # metric keys
    only_in_b: list[str] = dataclasses.field(default_factory=list)
    all_metrics: bool = False  # every metric sets the exit status, not only the primaries
    clock: str = "wall"  # the clock both runs' guest timings were read with (memqual.host.core.clock)
    runs_a: int = 1  # results files a side
    runs_b: int = 1

    @property
    def descriptive(self) -> list[MetricComparison]:
        """Metrics compared on one run a side outside blocks: described, not decided."""
        return [m for m in self.metrics if m.comparison.unit_kind == "descriptive"]

    @property
    def decisive(self) -> list[MetricComparison]:
        """The metrics whose verdicts set the exit status."""
        return [m for m in self.metrics if m.role == PRIMARY or (self.all_metrics and m.role == EXPLORATORY)]

    @property
    def regressions(self) -> list[MetricComparison]:
        return [m for m in self.decisive if m.verdict == SLOWER]

    @property
    def undecided(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == UNDECIDED]

    @property
    def not_comparable(self) -> list[MetricComparison]:
        """Metrics whose regimes differ between A and B: listed, not decided."""
        return [m for m in self.metrics if not m.comparable]

    @property
    def controls_flagged(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.role == CONTROL and m.flagged]

    @property
    def host_drifted(self) -> bool:
        """A metric no guest kernel can move moved: what else moved may be
        the host too."""
        return bool(self.controls_flagged)

    def exit_status(self) -> int:
        """3 when the host drifted (a control flagged: the decisions are not
        to be trusted, whatever they say), 1 when a decisive metric is
        slower, 0 otherwise."""
        if self.host_drifted:
            return 3
        return 1 if self.regressions else 0

    def counts(self, role: str | None = None) -> dict[str, int]:
        return {v: sum(1 for m in self.metrics if m.verdict == v and role in (None, m.role)) for v in VERDICTS}

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "alpha": self.alpha,
            "clock": self.clock,
            "correction": CORRECTION,
            "all_metrics": self.all_metrics,
            # The metrics each family's correction ran over: the comparable ones.
            "families": {role: sum(1 for m in self.metrics if m.role == role and m.comparable) for role in ROLES},
            "verdicts": {role: self.counts(role) for role in ROLES},
            "regressions": len(self.regressions),
            "undecided": len(self.undecided),
            "not_comparable": [m.key for m in self.not_comparable],
            "host_drifted": self.host_drifted,
            "controls_flagged": [m.key for m in self.controls_flagged],
            "exit_status": self.exit_status(),
            "metrics": [m.to_json() for m in self.metrics],
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "runs": {"a": self.runs_a, "b": self.runs_b},
            "descriptive": [m.key for m in self.descriptive],
            "claims": self.claims,
            "environment_differences": {k: {"a": a, "b": b} for k, (a, b) in self.environment.items()},
        }


def check_comparable(
    a: Results | Mapping[str, Any], b: Results | Mapping[str, Any], a_name: str = "A", b_name: str = "B"
) -> None:
    """BadInput, in one line, when two results cannot be compared at all.
    Metrics (or whole scenarios) present on one side only are not a reason:
    ``compare_results`` lists them and compares the rest."""
    a, b = Results.from_json(a), Results.from_json(b)
    if a.get("memqual_version") != b.get("memqual_version"):
        raise BadInput(
            f"{a_name} was written by memqual {a.get('memqual_version')}, {b_name} by "
            f"{b.get('memqual_version')}: re-run both with the same version"
        )
    if not a.metrics and not b.metrics:
        raise BadInput(f"{a_name} and {b_name} hold no metrics: nothing to compare")
    # Guest timings on icount count instructions, on wall they are time.
    check_same_clock({a_name: (a.environment or {}).get("clock", ""), b_name: (b.environment or {}).get("clock", "")})
    pairs, only_a, only_b = pair_metrics(a.metrics, b.metrics)
    if not pairs:
        sa, sb = set(a.scenarios), set(b.scenarios)
        first = (only_a or only_b or ["-"])[0]
        raise BadInput(
            f"no metric is in both: {len(only_a)} only in {a_name}, {len(only_b)} only in {b_name} "
            f"(scenarios only in {a_name}: {', '.join(sorted(sa - sb)) or '-'}; only in {b_name}: "
            f"{', '.join(sorted(sb - sa)) or '-'}; first metric: {first}): compare runs of the same scenarios"
        )
    for ma, mb in pairs:
        if (ma["unit"], ma["better"]) != (mb["unit"], mb["better"]):
            raise BadInput(f"metric {ma['key']}: unit or direction differ between {a_name} and {b_name}")


def _loose_key(m: Mapping[str, Any]) -> str:
    """A metric without its settings: scenario, metric, variant."""

    return f"{m.get('scenario')} {m.get('metric')} [{variant_label(m.get('variant') or {})}]"


def pair_metrics(
    a: Sequence[MetricEntry | Mapping[str, Any]], b: Sequence[MetricEntry | Mapping[str, Any]]
) -> tuple[list[tuple[MetricEntry, MetricEntry]], list[str], list[str]]:
    """Pairs of the same metric in two runs: by full key (settings
    included), then, for what is left, by scenario, metric and variant when
    that is unambiguous on both sides -- a run with a changed setting (say a
    smaller pages_to_scan) is what a comparison is for; the settings that
    differ are reported with the pair.  Returns pairs and the unpaired keys."""
    ka = {m.key: m for m in map(MetricEntry.from_json, a)}
    kb = {m.key: m for m in map(MetricEntry.from_json, b)}
    pairs = [(ka[k], kb[k]) for k in sorted(ka.keys() & kb.keys())]
    rest_a = [ka[k] for k in sorted(ka.keys() - kb.keys())]
    rest_b = [kb[k] for k in sorted(kb.keys() - ka.keys())]
    loose_a: dict[str, list[MetricEntry]] = {}
    loose_b: dict[str, list[MetricEntry]] = {}
    for m in rest_a:
        loose_a.setdefault(_loose_key(m), []).append(m)
    for m in rest_b:
        loose_b.setdefault(_loose_key(m), []).append(m)
    only_a, only_b = [], []
    for key in sorted(loose_a.keys() | loose_b.keys()):
        la, lb = loose_a.get(key, []), loose_b.get(key, [])
        if len(la) == 1 and len(lb) == 1:
            pairs.append((la[0], lb[0]))
        else:
            only_a += [m["key"] for m in la]
            only_b += [m["key"] for m in lb]
    return pairs, only_a, only_b


def _settings_diff(ma: Mapping[str, Any], mb: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    sa, sb = ma.get("settings") or {}, mb.get("settings") or {}
    return {k: (sa.get(k), sb.get(k)) for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)}


def replicates_of(m: Mapping[str, Any]) -> list[list[float]]:
    """A results.json metric entry's replicates; an entry written before
    replicates existed is one replicate (the conservative reading)."""
    given = m.get("replicates")
    if given is None:
        return [list(m["samples"])]
    if not isinstance(given, list) or not all(
        isinstance(r, list) and all(isinstance(x, (int, float)) for x in r) for r in given
    ):
        raise BadInput(f"metric {m.get('key')}: 'replicates' is not a list of lists of numbers: hand-edited?")
    reps = [list(r) for r in given if r]
    return reps or [list(m["samples"])]


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
    from memqual.host.judge import stats
    from memqual.host.judge.stats import ab_tests

    if not tests:
        return []
    correct = stats.holm if holm else ab_tests.benjamini_hochberg
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
    its own: what compare_results decides, apart from reading files (the
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
    from memqual.host.judge import stats

    low, high = test.interval()
    return MetricStats(
        a=stats.summarize([x for r in a_reps for x in r]),
        b=stats.summarize([x for r in b_reps for x in r]),
        ratio=test.ratio_of(test.estimate),
        ci_low=low,
        ci_high=high,
        confidence=stats.CONFIDENCE,
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
    compare_results decides each metric: the bisect's question about its
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


def compare_results(
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    a_name: str = "A",
    b_name: str = "B",
    all_metrics: bool = False,
    sequential: SequentialOf | None = None,
) -> RunComparison:
    """B against A, metric by metric: ``compare_runs`` of one run a side."""
    return compare_runs(
        [a],
        [b],
        threshold=threshold,
        alpha=alpha,
        a_name=a_name,
        b_name=b_name,
        all_metrics=all_metrics,
        sequential=sequential,
    )


def compare_runs(
    a_runs: Sequence[Results | Mapping[str, Any]],
    b_runs: Sequence[Results | Mapping[str, Any]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    a_name: str = "A",
    b_name: str = "B",
    all_metrics: bool = False,
    sequential: SequentialOf | None = None,
) -> RunComparison:
    """B against A, metric by metric, with the right unit:

    - one run a side whose metric names its blocks on both sides (an
      interleaved A/B): the blocks, paired;
    - several runs a side (each a results.json): the run, one value a run
      (its median), Welch's t over the runs, so the run-to-run variance is
      in the test;
    - one run a side outside blocks: the replicates of two runs say
      whether the two runs differ, not whether the kernels do (the host
      moves between runs, and every replicate of a run shares that):
      such a metric is ``runs differ`` or ``undecided``, described, never
      a decision, and sets no exit status.

    The first file of each side names the pairs, the claims, the
    environment and the regimes.  ``sequential`` (a look of
    --until-decided): a metric's p-values of a difference and of
    equivalence for its key and test, or None for the test's own; called
    for the comparable metrics only, and the families are corrected on
    what it gives.  A primary is judged against its own equivalence margin
    (host/judge/primaries.py, on the runs' clock), every other metric
    against ``threshold``."""
    from memqual.host.judge.stats import ab_tests

    if not a_runs or not b_runs:
        raise BadInput(f"no results file for {a_name if not a_runs else b_name}")
    a_all = [Results.from_json(r) for r in a_runs]
    b_all = [Results.from_json(r) for r in b_runs]
    for i, other in enumerate(a_all[1:], 2):
        check_comparable(a_all[0], other, a_name, f"{a_name} run {i}")
    for i, other in enumerate(b_all[1:], 2):
        check_comparable(b_all[0], other, b_name, f"{b_name} run {i}")
    a, b = a_all[0], b_all[0]
    check_comparable(a, b, a_name, b_name)
    pairs, only_a, only_b = pair_metrics(a.metrics, b.metrics)
    pairs = sorted(pairs, key=lambda p: p[0].key)
    several = len(a_all) > 1 and len(b_all) > 1

    def side(runs: list[Results], key: str, first: MetricEntry) -> list[list[list[float]]]:
        found = [first] + [m for r in runs[1:] for m in map(MetricEntry.from_json, r.metrics) if m.key == key]
        return [replicates_of(m) for m in found]

    reps = []
    tests = []
    kinds = []
    for ma, mb in pairs:
        if several:
            ra_runs, rb_runs = side(a_all, ma.key, ma), side(b_all, mb.key, mb)
            ra, rb = [r for run in ra_runs for r in run], [r for run in rb_runs for r in run]
            tests.append(ab_tests.ratio_test(run_medians(ra_runs), run_medians(rb_runs)))
            kinds.append("run")
        else:
            ra, rb = replicates_of(ma), replicates_of(mb)
            test = ab_tests.ratio_test(ra, rb, ma.blocks or None, mb.blocks or None)
            tests.append(test)
            kinds.append("block" if test.paired else "descriptive")
        reps.append((ra, rb))
    roles = roles_of(pairs)
    env_a, env_b = a.environment or {}, b.environment or {}
    clock = check_same_clock({a_name: env_a.get("clock", ""), b_name: env_b.get("clock", "")})
    bands = [
        margin_of(ma.scenario, ma.metric, ma.variant, clock, threshold) if role == PRIMARY else threshold
        for (ma, _), role in zip(pairs, roles, strict=True)
    ]
    regimes = [regime_of(ma, mb, a.metrics, b.metrics, a_name, b_name) for ma, mb in pairs]
    # Only metrics whose regimes match are decided, and only they make up
    # the families their corrections run over.
    kept = [i for i, r in enumerate(regimes) if r is None or r.matches]
    given = {i: sequential(pairs[i][0].key, tests[i], bands[i]) for i in kept} if sequential is not None else {}
    kept_decisions, kept_verdicts = decide(
        [tests[i] for i in kept],
        [roles[i] for i in kept],
        [pairs[i][0].better for i in kept],
        threshold=threshold,
        alpha=alpha,
        sequential=[given.get(i) for i in kept] if sequential is not None else None,
        margins=[bands[i] for i in kept],
    )
    decisions: dict[int, FamilyDecision] = dict(zip(kept, kept_decisions, strict=True))
    verdicts = dict(zip(kept, kept_verdicts, strict=True))
    metrics = []
    for i, ((ma, mb), (ra, rb), test) in enumerate(zip(pairs, reps, tests, strict=True)):
        d = decisions.get(i)
        verdict = verdicts.get(i, NOT_COMPARABLE)
        if kinds[i] == "descriptive" and verdict != NOT_COMPARABLE:
            verdict = RUNS_DIFFER if verdict in (SLOWER, FASTER, CHANGED) else UNDECIDED
        stats_i = metric_stats(
            test, ra, rb, d, verdict, threshold=bands[i], sequential=given.get(i), unit_kind=kinds[i]
        )
        if kinds[i] == "run":
            stats_i = dataclasses.replace(stats_i, n_replicates_a=test.n_a, n_replicates_b=test.n_b)
        metrics.append(
            MetricComparison(
                key=ma.key,
                scenario=ma.scenario,
                metric=ma.metric,
                unit=ma.unit,
                better=ma.better,
                comparison=stats_i,
                verdict=verdict,
                role=roles[i],
                settings_changed=_settings_diff(ma, mb),
                variant=ma.variant or {},
                settings=ma.settings or {},
                regime=regimes[i],
            )
        )
    claims_b = {c.id: c for c in b.claims}
    claims = [
        {"id": c["id"], "a": c.get("verdict"), "b": claims_b[c.id].get("verdict") if c.id in claims_b else None}
        for c in a.claims
    ]
    env = {
        k: (env_a.get(k), env_b.get(k))
        for k in sorted(set(env_a) | set(env_b))
        if k != "environment_sources" and env_a.get(k) != env_b.get(k)
    }
    return RunComparison(
        metrics=metrics,
        claims=claims,
        environment=env,
        threshold=threshold,
        alpha=alpha,
        clock=clock,
        only_in_a=sorted(only_a),
        only_in_b=sorted(only_b),
        all_metrics=all_metrics,
        runs_a=len(a_all),
        runs_b=len(b_all),
    )


def regime_of(
    ma: MetricEntry,
    mb: MetricEntry,
    a_metrics: Sequence[MetricEntry],
    b_metrics: Sequence[MetricEntry],
    a_name: str = "A",
    b_name: str = "B",
) -> RegimeCheck | None:
    """Both sides' regimes for a metric that holds under one (host/judge/regime.py); None for the rest."""
    condition = condition_of(ma.scenario, ma.metric)
    if condition is None:
        return None
    return check_regime(
        condition,
        [
            (a_name, a_metrics, ma.variant or {}, ma.settings or {}),
            (b_name, b_metrics, mb.variant or {}, mb.settings or {}),
        ],
    )


def short_labels(metrics: list[MetricComparison]) -> dict[str, str]:
    """Row labels: scenario, metric, variant, and only those settings that
    tell two rows of the same metric apart (the full key is in --json)."""

    by_metric: dict[tuple[str, str], list[MetricComparison]] = {}
    for m in metrics:
        by_metric.setdefault((m.scenario, m.metric), []).append(m)
    labels = {}
    for (scenario, metric), group in by_metric.items():
        keys = sorted({k for m in group for k in m.settings})
        varying = [k for k in keys if len({json.dumps(m.settings.get(k), sort_keys=True) for m in group}) > 1]
        for m in group:
            label = f"{scenario} {metric}"
            if m.variant:
                label += f" [{variant_label(m.variant)}]"
            if varying:
                # Two settings are enough to tell rows apart on a terminal.
                label += " " + ", ".join(f"{k}={m.settings.get(k)}" for k in varying[:2])
            if m.key.endswith(tuple(f" #{i}" for i in range(2, 10))):
                label += " " + m.key.rsplit(" ", 1)[1]
            labels[m.key] = label
    return labels


def verdict_text(m: MetricComparison) -> str:
    """The verdict, with what an undecided metric would need, or why a
    metric was not compared."""
    if m.verdict == NOT_COMPARABLE and m.regime is not None:
        return m.regime.reason()
    return stats_verdict_text(m.verdict, m.comparison)


def stats_verdict_text(verdict: str, c: MetricStats) -> str:
    """A verdict with its margin (a table's cell); for ``undecided`` about
    how many units would decide it.  ``verdict_meaning`` says in full what
    the test showed."""
    band = f"±{c.margin * 100:.3g}%"
    if verdict in (SLOWER, FASTER, EQUIVALENT, CHANGED):
        return f"{verdict} ({band})"
    if verdict == RUNS_DIFFER:
        return f"{verdict} (descriptive)"
    if verdict != UNDECIDED:
        return verdict
    unit = "blocks" if c.paired else ("runs a side" if c.unit_kind == "run" else "a side")
    if c.unit_kind == "descriptive":
        return f"{UNDECIDED} (one run a side: descriptive)"
    if min(c.n_replicates_a, c.n_replicates_b) < 2 and not c.paired:
        return f"{UNDECIDED} (no spread yet: needs 2 or more {unit})"
    if c.blocks_needed is None:
        return f"{UNDECIDED} (on the threshold's edge: more than 200 {unit})"
    return f"{UNDECIDED} (needs about {c.blocks_needed} {unit})"


def verdict_meaning(verdict: str, c: MetricStats) -> str:
    """What a verdict's test showed, in words that do not overstate it:
    ``slower`` is a change shown against no change with an estimate
    beyond the margin, not a change shown to exceed the margin."""
    band = f"±{c.margin * 100:.3g} %"
    change = f"{(c.ratio - 1.0) * 100:+.1f} %" if math.isfinite(c.ratio) else "?"
    if verdict in (SLOWER, FASTER):
        return (
            f"{verdict}: shown to differ from A, estimate {change} beyond the {band} margin "
            "(not tested against the margin itself)"
        )
    if verdict == EQUIVALENT:
        return f"{verdict}: the interval shown inside the {band} margin"
    if verdict == CHANGED:
        return f"{verdict}: shown to differ from A, estimate {change} inside the {band} margin, not shown inside it"
    if verdict == RUNS_DIFFER:
        return (
            f"{verdict}: these two runs differ by {change} on their replicates; with one run a side outside "
            "blocks the run-to-run variance is not in the test, so this describes the runs and decides nothing"
        )
    if verdict == UNDECIDED and c.unit_kind == "descriptive":
        return f"{verdict}: one run a side outside blocks ({change}); several runs a side or an interleaved run decide"
    if verdict == UNDECIDED:
        return f"{verdict}: neither a change nor equivalence within the {band} margin shown"
    return verdict

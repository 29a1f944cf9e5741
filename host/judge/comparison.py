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
from collections.abc import Mapping, Sequence
from typing import Any

from memqual.host.core.clock import check_same as check_same_clock
from memqual.host.core.errors import BadInput
from memqual.host.judge.exit_status import ExitStatus, exit_rule
from memqual.host.judge.families import FamilyDecision, SequentialOf, decide, metric_stats, roles_of, run_medians
from memqual.host.judge.pairing import check_comparable, pair_metrics, regime_of, replicates_of, settings_diff
from memqual.host.judge.primaries import CONTROL, EXPLORATORY, PRIMARY
from memqual.host.judge.primaries import margin as margin_of
from memqual.host.judge.regime import NOT_COMPARABLE, RegimeCheck
from memqual.host.judge.results import MetricEntry, Results, variant_label
from memqual.host.judge.verdicts import (
    CHANGED,
    CORRECTION,
    DEFAULT_ALPHA,
    DEFAULT_THRESHOLD,
    FASTER,
    ROLES,
    RUNS_DIFFER,
    SLOWER,
    UNDECIDED,
    VERDICTS,
    MetricStats,
    stats_verdict_text,
    verdict_meaning,
)


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
    # The clock both sides' records were read with (a label; empty: the
    # comparison's, from files that name no clock per metric).
    clock: str = ""

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
            "clock": self.clock,
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

    def exit_status(self) -> ExitStatus:
        """The exit rule on this one comparison: the host drifted (a control
        flagged), a decisive metric slower, or neither."""
        return exit_rule(host_drifted=self.host_drifted, slower=bool(self.regressions))

    def families(self) -> dict[str, int]:
        """Each family's size: the metrics its correction ran over, the comparable ones."""
        return {role: sum(1 for m in self.metrics if m.role == role and m.comparable) for role in ROLES}

    def counts(self, role: str | None = None) -> dict[str, int]:
        return {v: sum(1 for m in self.metrics if m.verdict == v and role in (None, m.role)) for v in VERDICTS}

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "alpha": self.alpha,
            "clock": self.clock,
            "correction": CORRECTION,
            "all_metrics": self.all_metrics,
            "families": self.families(),
            "verdicts": {role: self.counts(role) for role in ROLES},
            "regressions": len(self.regressions),
            "undecided": len(self.undecided),
            "not_comparable": [m.key for m in self.not_comparable],
            "host_drifted": self.host_drifted,
            "controls_flagged": [m.key for m in self.controls_flagged],
            "exit_status": int(self.exit_status()),
            "metrics": [m.to_json() for m in self.metrics],
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "runs": {"a": self.runs_a, "b": self.runs_b},
            "descriptive": [m.key for m in self.descriptive],
            "claims": self.claims,
            "environment_differences": {k: {"a": a, "b": b} for k, (a, b) in self.environment.items()},
        }


def _compared(
    a_sides: Sequence[Sequence[MetricEntry]],
    b_sides: Sequence[Sequence[MetricEntry]],
    *,
    threshold: float,
    alpha: float,
    clock: str,
    a_name: str,
    b_name: str,
    sequential: SequentialOf | None,
    host_under_test: bool = False,
) -> tuple[list[MetricComparison], list[str], list[str]]:
    """Every paired metric decided (``compare_runs`` says how): the
    metrics of each run a side, the first run naming the pairs;
    ``host_under_test``: both sides ran on one, so a primary with a margin
    of its own there is judged at it."""
    from memqual.host.judge.stats import ab_tests

    pairs, only_a, only_b = pair_metrics(a_sides[0], b_sides[0])
    pairs = sorted(pairs, key=lambda p: p[0].key)
    several = len(a_sides) > 1 and len(b_sides) > 1

    def side(runs: Sequence[Sequence[MetricEntry]], key: str, first: MetricEntry) -> list[list[list[float]]]:
        found = [first] + [m for r in runs[1:] for m in r if m.key == key]
        return [replicates_of(m) for m in found]

    reps = []
    tests = []
    kinds = []
    for ma, mb in pairs:
        if several:
            ra_runs, rb_runs = side(a_sides, ma.key, ma), side(b_sides, mb.key, mb)
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
    # Each metric's own clock: one run's plan (--clock auto) reads some
    # scenarios on icount and others on wall, and A and B of a metric must
    # have been read alike.
    clocks = [
        check_same_clock({f"{a_name} {ma.key}": ma.clock or clock, f"{b_name} {mb.key}": mb.clock or clock})
        for ma, mb in pairs
    ]
    bands = [
        margin_of(ma.scenario, ma.metric, ma.variant, read_with, threshold, host_under_test)
        if role == PRIMARY
        else threshold
        for (ma, _), role, read_with in zip(pairs, roles, clocks, strict=True)
    ]
    regimes = [regime_of(ma, mb, a_sides[0], b_sides[0], a_name, b_name) for ma, mb in pairs]
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
                settings_changed=settings_diff(ma, mb),
                variant=ma.variant or {},
                settings=ma.settings or {},
                regime=regimes[i],
                clock=clocks[i],
            )
        )
    return metrics, only_a, only_b


def compare_metrics(
    a: Sequence[MetricEntry],
    b: Sequence[MetricEntry],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    clock: str = "",
    sequential: SequentialOf | None = None,
    host_under_test: bool = False,
) -> list[MetricComparison]:
    """One run a side's metrics, typed, compared as ``compare_runs``
    compares them (no results file, no claims, no environment): one look
    of --until-decided; ``host_under_test``: both sides ran on one (the
    records say so), so a primary's margin there applies.  BadInput when
    a metric's unit or direction differs between the sides."""
    for ma, mb in pair_metrics(a, b)[0]:
        if (ma.unit, ma.better) != (mb.unit, mb.better):
            raise BadInput(f"metric {ma.key}: unit or direction differ between A and B")
    found, _, _ = _compared(
        [a],
        [b],
        threshold=threshold,
        alpha=alpha,
        clock=clock,
        a_name="A",
        b_name="B",
        sequential=sequential,
        host_under_test=host_under_test,
    )
    return found


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
    across_hosts: bool = False,
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
    (host/judge/primaries.py, on the runs' clock, and on a host under test
    where both sides ran on one), every other metric
    against ``threshold``.  ``across_hosts``: A and B ran on different
    hosts on purpose (an A/B of host kernels); else that is refused."""

    if not a_runs or not b_runs:
        raise BadInput(f"no results file for {a_name if not a_runs else b_name}")
    a_all = [Results.from_json(r) for r in a_runs]
    b_all = [Results.from_json(r) for r in b_runs]
    for i, other in enumerate(a_all[1:], 2):
        check_comparable(a_all[0], other, a_name, f"{a_name} run {i}")
    for i, other in enumerate(b_all[1:], 2):
        check_comparable(b_all[0], other, b_name, f"{b_name} run {i}")
    a, b = a_all[0], b_all[0]
    check_comparable(a, b, a_name, b_name, across_hosts=across_hosts)
    env_a, env_b = a.environment or {}, b.environment or {}
    clock = check_same_clock({a_name: env_a.get("clock", ""), b_name: env_b.get("clock", "")})
    # A host under test on both sides (one kernel, or two A/B'd): its own
    # spread sets a primary's margin there.
    on_host_under_test = bool(env_a.get("host_under_test")) and bool(env_b.get("host_under_test"))
    metrics, only_a, only_b = _compared(
        [r.metrics for r in a_all],
        [r.metrics for r in b_all],
        threshold=threshold,
        alpha=alpha,
        clock=clock,
        a_name=a_name,
        b_name=b_name,
        sequential=sequential,
        host_under_test=on_host_under_test,
    )
    claims_b = {c.id: c for c in b.claims}
    claims = [{"id": c.id, "a": c.verdict, "b": claims_b[c.id].verdict if c.id in claims_b else None} for c in a.claims]
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


def short_labels(metrics: list[MetricComparison]) -> dict[str, str]:
    """Row labels: scenario, metric, variant, and only those settings that
    tell two rows of the same metric apart (the full key is in --json)."""

    by_metric: dict[tuple[str, str], list[MetricComparison]] = {}
    for m in metrics:
        by_metric.setdefault((m.scenario, m.metric), []).append(m)
    labels = {}
    # Where the metrics were read with more than one clock (a plan), each
    # row names its own.
    mixed = len({m.clock for m in metrics if m.clock}) > 1
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
            if mixed and m.clock:
                label += f" ({m.clock})"
            labels[m.key] = label
    return labels


def verdict_text(m: MetricComparison) -> str:
    """The verdict, with what an undecided metric would need, or why a
    metric was not compared."""
    if m.verdict == NOT_COMPARABLE and m.regime is not None:
        return m.regime.reason()
    return stats_verdict_text(m.verdict, m.comparison)

"""A claim of source "records" judged: A's and B's records of this run
paired by settings, B / A with its interval and exact test, the
mechanism's own bound on B / A (the ceiling), and what a verdict made
under the wrong accelerator does not speak for.
"""

from __future__ import annotations

import json
from typing import Any

from memqual.host.core import descriptive
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.model import (
    MIN_REPLICATES,
    NOT_REPRODUCED,
    UNDERPOWERED,
    CeilingResult,
    Claim,
    Measure,
    NoEvidence,
    Verdict,
    format_ratio,
)
from memqual.host.judge.claims.ran_on import ran_on
from memqual.host.judge.claims.rule import judge
from memqual.host.judge.stats import intervals, permutation, ratio_ci


def evaluate_records(claim: Claim, records: list[Measurement], *, alpha: float, seed: int) -> Verdict:
    m = claim.measure
    assert m.a is not None and m.b is not None  # the parser guarantees both sides
    rec_a, rec_b = _record_pair(claim, records)
    a_reps, b_reps = rec_a.replicates, rec_b.replicates
    n_a, n_b = len(a_reps), len(b_reps)
    paired = m.paired and n_a == n_b
    units = f"{n_a} units measured both A and B" if paired else f"{n_a}+{n_b} independent units"
    samples = f"({len(rec_a.samples)}+{len(rec_b.samples)} samples)"
    verdict = Verdict(
        claim=claim,
        verdict=NOT_REPRODUCED,
        reason="",
        evidence=claim.evidence.kind,
        a_replicates=[list(r) for r in a_reps],
        b_replicates=[list(r) for r in b_reps],
        settings=dict(rec_a.settings),
        accelerator=accelerator(rec_a, rec_b),
        ran_on=ran_on(rec_a, rec_b),
    )
    verdict.qualifier = _qualifier(claim, verdict.accelerator)
    if min(n_a, n_b) < MIN_REPLICATES:
        verdict.ratio = intervals.pooled_ratio(a_reps, b_reps)
        verdict.verdict = UNDERPOWERED
        verdict.replicates_needed = MIN_REPLICATES
        verdict.reason = (
            f"{m.scenario} {m.metric}: {m.b.label} / {m.a.label} = {format_ratio(verdict.ratio)}x "
            f"on {units} {samples}; "
            f"underpowered: a verdict needs at least {MIN_REPLICATES} independent units a side "
            "(fresh guests or rounds; samples inside one guest are nested in it)"
        )
        return _qualified(verdict)
    try:
        interval = ratio_ci.paired_log_ratio(a_reps, b_reps) if paired else ratio_ci.welch_log_ratio(a_reps, b_reps)
    except ValueError as undefined:
        verdict.reason = f"{m.scenario} {m.metric}: the ratio is undefined ({undefined})"
        return verdict
    ci = (interval.low, interval.high)
    if paired:
        p_value, floor = permutation.sign_flip_pvalue(a_reps, b_reps), 2.0 / 2**n_a
        test = "exact sign-flip test of the per-unit log ratios"
    else:
        p_value = permutation.replicate_permutation_test(a_reps, b_reps, seed=seed).p_value
        floor = permutation.min_attainable_p(n_a, n_b)
        test = "exact permutation test of the unit medians"
    verdict.ratio, verdict.ci, verdict.p_value, verdict.interval_method = interval.ratio, ci, p_value, interval.method
    head = (
        f"{m.scenario} {m.metric}: {m.b.label} / {m.a.label} = {format_ratio(interval.ratio)}x, "
        f"95% CI [{format_ratio(ci[0])}, {format_ratio(ci[1])}] ({interval.method}), "
        f"p={p_value:.3g} ({test}), {units} {samples}"
    )
    ceiling = _ceiling(claim, records)
    verdict.ceiling = ceiling
    verdict.verdict, why = judge(m, interval.ratio, ci, ceiling=ceiling)
    verdict.reason = f"{head}; {why}"
    # The card's one sentence: the ratio, its interval, on what, and the
    # judgement's first clause (the ceiling and the qualifier have lines of their own).
    verdict.headline = (
        f"{m.b.label} / {m.a.label} = {format_ratio(interval.ratio)}x, "
        f"95% CI [{format_ratio(ci[0])}, {format_ratio(ci[1])}], "
        f"on {units}: {why.split('. ')[0].rstrip('.')}."
    )
    if verdict.verdict == NOT_REPRODUCED and _points_asserted_way(m, interval.ratio) and ci[0] <= 1.0 <= ci[1]:
        needed = interval.units_needed()
        if needed is not None and needed > min(n_a, n_b):
            verdict.replicates_needed = needed
            verdict.reason += (
                f"; with the spread measured here about {needed} units a side would establish an effect this large"
            )
    if floor >= alpha:
        verdict.reason += (
            f" (the {test.split(' of ')[0].removeprefix('exact ')} cannot go below p = {floor:.3g} with {units}; "
            "the t-interval decides)"
        )
    return _qualified(verdict)


def accelerator(*recs: Measurement) -> str:
    """What the records' guests ran under, when every record says the same."""
    seen = {str(r.environment.get("accel") or "") for r in recs}
    return seen.pop() if len(seen) == 1 else ""


def _qualifier(claim: Claim, accel: str) -> str:
    """What a verdict made under the wrong accelerator does not speak for."""
    need = claim.evidence.accelerator
    if need is None or accel == need.needs:
        return ""
    where = f"under {accel.upper()} on this host" if accel else "on an accelerator the records do not name"
    return (
        f"{where}, saying nothing about {need.needs.upper()}: {need.otherwise}. "
        f"What would measure it: {need.would_measure}"
    )


def _qualified(verdict: Verdict) -> Verdict:
    if verdict.qualifier:
        verdict.reason += f"; {verdict.verdict} {verdict.qualifier}"
    return verdict


def _ceiling(claim: Claim, records: list[Measurement]) -> CeilingResult | None:
    """The mechanism's own bound on B / A from this run's records, when the
    claim names one and the run recorded it."""
    spec = claim.measure.ceiling
    if spec is None:
        return None
    usable = [r for r in records if r.claim in (None, claim.id) and r.samples]
    found = [r for r in usable if matches(r, spec.scenario, spec.metric, spec.variant)]
    if not found:
        return None
    rec = max(found, key=lambda r: r.n_replicates)
    units = intervals.replicate_medians(rec.replicates)
    limit = rec.extra.get("limit_any_workload")
    inputs = rec.extra.get(spec.input) if spec.input else None
    values = [float(x) for x in inputs if isinstance(x, (int, float))] if isinstance(inputs, list) else []
    return CeilingResult(
        label=spec.label or spec.metric,
        value=descriptive.median(units),
        low=min(units),
        high=max(units),
        units=len(units),
        formula=str(rec.extra.get("ceiling_formula", "")),
        limit_any_workload=float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None,
        limit_source=str(rec.extra.get("limit_source", "")),
        input_label=spec.input_label if values else "",
        input_value=descriptive.median(values) if values else None,
    )


def _points_asserted_way(m: Measure, ratio: float) -> bool:
    if m.direction == "less":
        return ratio < 1.0
    return ratio > 1.0


def matches(rec: Measurement, scenario: str, metric: str, variant: dict[str, Any]) -> bool:
    return (
        rec.scenario == scenario and rec.metric == metric and all(rec.variant.get(k) == v for k, v in variant.items())
    )


def _record_pair(claim: Claim, records: list[Measurement]) -> tuple[Measurement, Measurement]:
    """A's and B's records: of the scenario and metric, whose variant holds
    each side's key-values, paired by settings (an A/B pair shares them).
    Records tagged with this claim id come before untagged ones, and records
    tagged with another claim are not used."""
    m = claim.measure
    assert m.a is not None and m.b is not None
    usable = [r for r in records if r.claim in (None, claim.id)]
    ranked = sorted(usable, key=lambda r: r.claim != claim.id)
    pairs: dict[str, list[Measurement | None]] = {}
    for rec in ranked:
        settings_key = json.dumps(rec.settings, sort_keys=True)
        for index, side in enumerate((m.a, m.b)):
            if matches(rec, m.scenario, m.metric, side.variant):
                slot = pairs.setdefault(settings_key, [None, None])
                if slot[index] is None:
                    slot[index] = rec
    complete = [
        (v[0], v[1]) for v in pairs.values() if v[0] is not None and v[1] is not None and v[0].samples and v[1].samples
    ]
    if not complete:
        missing = [s.label for s, i in ((m.a, 0), (m.b, 1)) if not any(v[i] for v in pairs.values())]
        raise NoEvidence(
            f"no records of {m.scenario} {m.metric} for {' and '.join(missing) or 'a matched pair'} in this run"
            + (f"; needs {'; '.join(claim.needs)}" if claim.needs else "")
        )
    # The pair with the most independent replicates is the most informative.
    return max(complete, key=lambda pair: (min(pair[0].n_replicates, pair[1].n_replicates), len(pair[0].samples)))

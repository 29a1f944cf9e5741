"""The verdicts: each claim judged from this run's evidence (records A and B
by variant, or the memslot model on the layouts real guests reported),
with the reason a person can check.  The same rule serves the report and
the e2e tests (``judge_claim``).  Reads records, writes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.printable import format_number
from memqual.host.core.record import Measurement
from memqual.host.judge import stats
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import (
    DEFAULT_ALPHA,
    DIRECTION_ONLY,
    MIN_REPLICATES,
    MODEL,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    UNDERPOWERED,
    UNMEASURABLE,
    BesideResult,
    CeilingResult,
    Claim,
    LayoutResult,
    Measure,
    NoEvidence,
    Quantity,
    Skip,
    Verdict,
    format_ratio,
)
from memqual.host.judge.stats import ratio_ci
from memqual.host.memslots import guest_layouts, kvm2011, model, virtio_layouts
from memqual.host.memslots import layout as layout_mod


def evaluate(
    claims: Sequence[Claim],
    records: Iterable[Measurement],
    *,
    skips: Sequence[Skip] = (),
    only: Sequence[str] = (),
    alpha: float = DEFAULT_ALPHA,
    seed: int = stats.DEFAULT_SEED,
) -> list[Verdict]:
    """One verdict per claim, in the registry's order.  ``skips`` are the
    tests that ended without passing (their reasons explain missing
    records); ``only`` the tags a run was limited to (a claim whose tag is
    not among them was not selected, and its reason says so)."""
    records = list(records)
    verdicts = []
    for claim in claims:
        beside = _beside(claim, records, seed=seed)
        try:
            verdict = _evaluate_one(claim, records, alpha=alpha, seed=seed)
        except NoEvidence as why:
            reason = str(why)
            if only and claim.tag and claim.tag not in only and claim.measure.source != "none":
                reason = (
                    f"not selected in this run (--only {' '.join(only)}; "
                    f"this claim's tests are tagged {claim.tag!r}): {reason}"
                )
            related = _related_skips(claim, skips)
            if related:
                first = related[0]
                reason += f"; {first.test} ended {first.status}: {first.reason}"
            if claim.evidence.would_measure:
                reason += f". What would measure it: {claim.evidence.would_measure}"
            verdict = Verdict(
                claim=claim, verdict=NOT_MEASURABLE, reason=reason, evidence=UNMEASURABLE, headline=str(why)
            )
        verdict.beside = beside
        verdict.today = _today(claim, records)
        verdicts.append(verdict)
    return verdicts


def judge_claim(claim_id: str, records: Iterable[Measurement], *, claims_file: str | Path | None = None) -> Verdict:
    """The verdict of one claim on the given records: the rule the report
    uses, for e2e tests that check their own measurement."""
    for claim in load(claims_file):
        if claim.id == claim_id:
            return evaluate([claim], records)[0]
    raise BadInput(f"no claim {claim_id!r} in the registry")


def _related_skips(claim: Claim, skips: Sequence[Skip]) -> list[Skip]:
    """Tests of the claim's tag that did not pass, the ones named like its
    scenario first ("ksm.volatile_scan" -> a test with "volatile" in it)."""
    if not claim.tag:
        return []
    related = [s for s in skips if claim.tag in s.test.lower()]
    scenario_word = claim.measure.scenario.split(".")[-1].split("_")[0].lower()
    return sorted(related, key=lambda s: not (scenario_word and scenario_word in s.test.lower()))


def _evaluate_one(claim: Claim, records: list[Measurement], *, alpha: float, seed: int) -> Verdict:
    m = claim.measure
    if m.source == "none":
        raise NoEvidence(m.reason)
    if m.source == "memslots-layouts":
        return _evaluate_layouts(claim, records)
    if m.source == "order":
        return _evaluate_order(claim, records)
    return _evaluate_records(claim, records, alpha=alpha, seed=seed)


def _evaluate_records(claim: Claim, records: list[Measurement], *, alpha: float, seed: int) -> Verdict:
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
        accelerator=_accelerator(rec_a, rec_b),
    )
    verdict.qualifier = _qualifier(claim, verdict.accelerator)
    if min(n_a, n_b) < MIN_REPLICATES:
        verdict.ratio = stats.pooled_ratio(a_reps, b_reps)
        verdict.verdict = UNDERPOWERED
        verdict.replicates_needed = MIN_REPLICATES
        verdict.reason = (
            f"{m.scenario} {m.metric}: {m.b.label} / {m.a.label} = {_ratio(verdict.ratio)}x on {units} {samples}; "
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
        p_value, floor = stats.sign_flip_pvalue(a_reps, b_reps), 2.0 / 2**n_a
        test = "exact sign-flip test of the per-unit log ratios"
    else:
        p_value = stats.replicate_permutation_test(a_reps, b_reps, seed=seed).p_value
        floor = stats.min_attainable_p(n_a, n_b)
        test = "exact permutation test of the unit medians"
    verdict.ratio, verdict.ci, verdict.p_value, verdict.interval_method = interval.ratio, ci, p_value, interval.method
    head = (
        f"{m.scenario} {m.metric}: {m.b.label} / {m.a.label} = {_ratio(interval.ratio)}x, "
        f"95% CI [{_ratio(ci[0])}, {_ratio(ci[1])}] ({interval.method}), "
        f"p={p_value:.3g} ({test}), {units} {samples}"
    )
    ceiling = _ceiling(claim, records)
    verdict.ceiling = ceiling
    verdict.verdict, why = judge(m, interval.ratio, ci, ceiling=ceiling)
    verdict.reason = f"{head}; {why}"
    # The card's one sentence: the ratio, its interval, on what, and the
    # judgement's first clause (the ceiling and the qualifier have lines of their own).
    verdict.headline = (
        f"{m.b.label} / {m.a.label} = {_ratio(interval.ratio)}x, 95% CI [{_ratio(ci[0])}, {_ratio(ci[1])}], "
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


def _accelerator(*recs: Measurement) -> str:
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
    found = [r for r in usable if _matches(r, spec.scenario, spec.metric, spec.variant)]
    if not found:
        return None
    rec = max(found, key=lambda r: r.n_replicates)
    units = stats.replicate_medians(rec.replicates)
    limit = rec.extra.get("limit_any_workload")
    inputs = rec.extra.get(spec.input) if spec.input else None
    values = [float(x) for x in inputs if isinstance(x, (int, float))] if isinstance(inputs, list) else []
    return CeilingResult(
        label=spec.label or spec.metric,
        value=stats.median(units),
        low=min(units),
        high=max(units),
        units=len(units),
        formula=str(rec.extra.get("ceiling_formula", "")),
        limit_any_workload=float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None,
        limit_source=str(rec.extra.get("limit_source", "")),
        input_label=spec.input_label if values else "",
        input_value=stats.median(values) if values else None,
    )


def _points_asserted_way(m: Measure, ratio: float) -> bool:
    if m.direction == "less":
        return ratio < 1.0
    return ratio > 1.0


def _order_replicates(rec: Measurement) -> list[list[float]]:
    """A kind's rate per unit: from its counts and seconds with half an
    event added (a kind never seen in a boot is rarer than one seen once,
    and a ratio with it stays finite), else the recorded rates."""
    counts, seconds = rec.extra.get("counts"), rec.extra.get("seconds")
    if isinstance(counts, list) and isinstance(seconds, list) and len(counts) == len(seconds) == rec.n_replicates:
        return [[(float(c) + 0.5) / float(s)] for c, s in zip(counts, seconds, strict=True) if float(s) > 0]
    return [list(r) for r in rec.replicates]


def _evaluate_order(claim: Claim, records: list[Measurement]) -> Verdict:
    """An order of frequencies (seed 002's priorities: misses, then RAM
    hits, then other hits), judged pair by pair: each kind over the next
    one, per unit (every kind is counted in the same fresh guest, so the
    pairs are paired), with a 95 % t-interval of the per-unit log ratios.
    The order holds when every interval is wholly above 1."""
    m = claim.measure
    usable = [r for r in records if r.claim in (None, claim.id) and r.scenario == m.scenario and r.metric == m.metric]
    by_kind: dict[str, Measurement] = {}
    for rec in sorted(usable, key=lambda r: r.claim != claim.id):
        kind = str(rec.variant.get(m.order_key, ""))
        if kind in m.order and kind not in by_kind and rec.replicates:
            by_kind[kind] = rec
    missing = [k for k in m.order if k not in by_kind]
    if missing:
        raise NoEvidence(
            f"no records of {m.scenario} {m.metric} for {', '.join(missing)} in this run"
            + (f"; {m.reason}" if m.reason else "")
        )
    accel = _accelerator(*by_kind.values()) or str(next(iter(by_kind.values())).settings.get("accel") or "")
    if m.accelerator and accel != m.accelerator:
        raise NoEvidence(
            f"the {m.scenario} records were counted under {accel.upper() or 'an accelerator they do not name'}, "
            f"not {m.accelerator.upper()}: only {m.accelerator.upper()} looks memslots up on a guest's faults"
        )
    reps = {k: _order_replicates(by_kind[k]) for k in m.order}
    units = min(len(r) for r in reps.values())
    verdict = Verdict(claim=claim, verdict=NOT_REPRODUCED, reason="", evidence=claim.evidence.kind, accelerator=accel)
    if len({len(r) for r in reps.values()}) != 1:
        raise NoEvidence(f"the {m.scenario} records hold different numbers of units per kind: not one count a guest")
    if units < MIN_REPLICATES:
        verdict.verdict, verdict.replicates_needed = UNDERPOWERED, MIN_REPLICATES
        verdict.reason = verdict.headline = (
            f"{m.scenario}: {units} fresh guest(s) counted; underpowered: the order needs at least "
            f"{MIN_REPLICATES} independent units"
        )
        return verdict
    pairs = []
    for higher, lower in zip(m.order, m.order[1:], strict=False):
        interval = ratio_ci.paired_log_ratio(reps[lower], reps[higher])
        pairs.append((higher, lower, interval))
    details = [
        f"{hi} / {lo} = {_ratio(iv.ratio)}x, 95% CI [{_ratio(iv.low)}, {_ratio(iv.high)}] ({iv.method}, {units} guests)"
        for hi, lo, iv in pairs
    ]
    failing = [(hi, lo, iv) for hi, lo, iv in pairs if not iv.low > 1.0]
    weakest = min(pairs, key=lambda p: p[2].low)
    verdict.ratio, verdict.ci = weakest[2].ratio, (weakest[2].low, weakest[2].high)
    verdict.interval_method = weakest[2].method
    verdict.a_replicates, verdict.b_replicates = reps[weakest[1]], reps[weakest[0]]
    verdict.details = details
    if not failing:
        verdict.verdict = REPRODUCED
        why = f"every kind is more frequent than the next ({' > '.join(m.order)}), each interval wholly above 1"
    else:
        hi, lo, iv = failing[0]
        how = "the other way round" if iv.high < 1.0 else "not established (the interval reaches 1)"
        why = f"{hi} more frequent than {lo} is {how}: the order {' > '.join(m.order)} does not hold"
    verdict.headline = f"Counted under {accel.upper()} on {units} fresh guests: {why}."
    verdict.reason = f"{verdict.headline} {'; '.join(details)}"
    return verdict


def _evaluate_layouts(claim: Claim, records: list[Measurement]) -> Verdict:
    """The memslot model on the real layouts.  The guest built to the
    seed's description decides, by a miss at its emulated NIC BAR where it
    has one (seed 000's path: "the mmio faults for the NIC"), else by the
    mean over its gaps; the other layouts a 2011 host accepted give the
    range the magnitude takes on other guests, beside it."""
    m = claim.measure
    assert m.a is not None and m.b is not None
    results = layout_results(m.a, m.b, [r for r in records if r.scenario == m.scenario], seed=claim.seed)
    if not results:
        raise NoEvidence(
            f"no memslot layouts read from real guests in this run (records of {m.scenario})"
            + (f"; needs {'; '.join(claim.needs)}" if claim.needs else "")
        )
    details = [_layout_line(m, lr) for lr in results]
    others = [lr for lr in results if not lr.seed_guest and lr.runs_2011]
    at_nic = [lr for lr in others if lr.nic_ratio is not None]
    beside = at_nic or others
    values = [lr.nic_ratio if at_nic and lr.nic_ratio is not None else lr.ratio for lr in beside]
    spread = (min(values), max(values)) if values else None
    where = "at the NIC BAR" if at_nic else "over every gap"
    if spread is None:
        range_text = "no other layout a 2011 host accepted was read"
    else:
        span = _ratio(spread[0]) if spread[0] == spread[1] else f"{_ratio(spread[0])}-{_ratio(spread[1])}"
        names = ", ".join(lr.config + (" (newer than 2011)" if lr.newer else "") for lr in beside)
        range_text = f"the other layouts a 2011 host accepted give {span}x {where} ({names})"
    seed_guests = [lr for lr in results if lr.seed_guest and lr.runs_2011]
    if not seed_guests:
        # The layouts read are listed all the same: they are the run's evidence of nothing else.
        why = (
            f"no layout of the guest seed {claim.seed.split('_')[0]} describes was read in this run (a "
            f"{m.scenario} record built to {claim.seed}: e2e/test_memslots_qemu.py test_guest_layouts_recorded "
            f"boots it); {range_text}, which do not decide"
        )
        return Verdict(
            claim=claim,
            verdict=NOT_MEASURABLE,
            reason=why,
            headline=why,
            details=details,
            evidence=UNMEASURABLE,
            range_beside=spread,
            layouts=results,
        )
    lr = seed_guests[0]
    nic = lr.nic_ratio is not None
    ratio = lr.nic_ratio if nic and lr.nic_ratio is not None else lr.ratio
    a = lr.nic_a if nic and lr.nic_a is not None else lr.a
    b = lr.nic_b if nic and lr.nic_b is not None else lr.b
    verdict, why = judge(m, ratio, None)
    path = "a miss at its rtl8139's MMIO BAR (seed 000's path)" if nic else "the mean miss over its gaps"
    headline = (
        f"On {lr.config} ({lr.slots} user slots, a 2011 {kvm2011.DEFAULT_HOST.name} host) {path} walks "
        f"{format_number(a)} {m.a.structure} nodes against {format_number(b)} {m.b.structure} entries, "
        f"{_ratio(ratio)}x: {why}; {range_text}."
    )
    refused = [x for x in results if not x.runs_2011]
    reason = (
        f"{headline} Model of the 2011 structures on {len(results)} layouts read from real guests in this run "
        f"(the array walks nmemslots entries, the host's private slots included): "
        + "; ".join(details)
        + (
            f". Not counted: {', '.join(x.config for x in refused)} (more than {kvm2011.KVM_MEMORY_SLOTS} user slots)"
            if refused
            else ""
        )
    )
    return Verdict(
        claim=claim,
        verdict=verdict,
        reason=reason,
        headline=headline,
        details=details,
        evidence=MODEL,
        ratio=ratio,
        range_beside=spread,
        a_replicates=[[a]],
        b_replicates=[[b]],
        layouts=results,
        settings={
            "layouts": [x.config for x in results],
            "decided_on": lr.config,
            "host_2011": kvm2011.DEFAULT_HOST.name,
            "decided_by": "nic-bar-miss" if nic else "mean-over-gaps",
            "refused_by_2011_host": [x.config for x in refused],
            "newer_than_2011": {x.config: list(x.newer) for x in results if x.newer},
        },
    )


def _layout_line(m: Measure, lr: LayoutResult) -> str:
    """One layout's arithmetic, in words."""
    assert m.a is not None and m.b is not None
    text = f"{lr.config} ({lr.slots} user slots"
    text += ", built to the seed's description)" if lr.seed_guest else ")"
    if not lr.runs_2011:
        return (
            text + f": refused by a 2011 host (more than {kvm2011.KVM_MEMORY_SLOTS} user slots); on its slots alone "
            f"{m.a.structure} walks {format_number(lr.a)} nodes per miss, {m.b.structure} {format_number(lr.b)}"
        )
    text += f": mean over every gap {format_number(lr.b)} / {format_number(lr.a)} = {_ratio(lr.ratio)}x"
    if lr.nic_ratio is not None:
        text += f", at the NIC BAR {format_number(lr.nic_b)} / {format_number(lr.nic_a)} = {_ratio(lr.nic_ratio)}x"
    if lr.newer:
        text += f"; newer than the seed's kernel: {', '.join(lr.newer)}"
    return text


def layout_results(a: Quantity, b: Quantity, records: Sequence[Measurement], *, seed: str = "") -> list[LayoutResult]:
    """The memslot model on every layout record (a real guest's memslots in
    ``extra["layout"]``), one result per configuration, on the 2011 host
    where one could run the layout; a record whose settings say it was
    built to ``seed`` (``built_to``) is that seed's guest."""
    out: dict[str, LayoutResult] = {}
    for rec in records:
        data = rec.extra.get("layout")
        if data is None:
            continue
        config = str(rec.variant.get("config") or rec.metric)
        if config in out:
            continue  # a later round of the same configuration: the layout is the same
        guest = layout_mod.from_json(data, name=config, source=f"{rec.scenario} record {config}")
        runs = kvm2011.runs_on_2011(guest)
        layout = kvm2011.on_host(guest) if runs else guest
        values = []
        for q in (a, b):
            table = _plain(model.model_table(layout, q.workload))
            entry = _plain((table.get("structures") or {}).get(q.structure))
            value = entry.get(q.field) if isinstance(entry, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise NoEvidence(f"the memslot model gives no {q.structure}.{q.field} for {q.workload} on {config}")
            values.append(float(value))
        nic = guest_layouts.nic_of(rec)
        nic_nodes: list[float | None] = [None, None]
        if nic is not None and runs and a.workload == b.workload == "miss":
            nic_nodes = [float(model.nodes_at(layout, q.structure, nic.gfn)) for q in (a, b)]
        out[config] = LayoutResult(
            config=config,
            slots=len(guest),
            a=values[0],
            b=values[1],
            runs_2011=runs,
            nic_a=nic_nodes[0],
            nic_b=nic_nodes[1],
            newer=kvm2011.newer_than_2011(rec.settings, [str(n) for n in rec.extra.get("slot_names") or ()]),
            seed_guest=bool(seed) and rec.settings.get("built_to") == seed,
        )
    return sorted(out.values(), key=lambda lr: lr.config)


def _on_side(m: Measure, ratio: float) -> bool:
    if m.direction == "greater":
        return ratio > 1.0
    if m.direction == "less":
        return ratio < 1.0
    return ratio >= 1.0 - m.tolerance


def judge(
    m: Measure, ratio: float, ci: tuple[float, float] | None, *, ceiling: CeilingResult | None = None
) -> tuple[str, str]:
    """The verdict from B / A and its CI (None for a model's figure, which
    has no sampling spread).  ``ceiling``, the measured mechanism's own
    bound on B / A in this run, says whether the published magnitude was
    within its reach at all."""
    if not math.isfinite(ratio):
        return NOT_REPRODUCED, "the ratio is undefined (A is zero)"
    tol = m.tolerance
    if m.direction == "at_least":
        # "A is as good as or better than B": B / A (B's cost over A's) must
        # not fall below 1 - tolerance.  Only an interval wholly at or above
        # that floor establishes it; one reaching below it says nothing.
        floor = 1.0 - tol
        a_label = m.a.label if m.a else "A"
        b_label = m.b.label if m.b else "B"
        if (ci is not None and ci[1] < floor) or (ci is None and ratio < floor):
            where = f"CI wholly below {floor:.3g}" if ci is not None else f"below {floor:.3g}"
            return (
                NOT_REPRODUCED,
                f"{b_label} beats {a_label} by more than the {tol:.0%} slack of 'as good as' ({where}): "
                f"{a_label} is not as good",
            )
        if ci is not None and ci[0] < floor:
            return (
                NOT_REPRODUCED,
                f"the CI reaches below {floor:.3g}: the data cannot tell 'as good as' from "
                f"{b_label} being better by more than the {tol:.0%} slack; not established",
            )
        holds_why = f"B / A >= {floor:.3g}: {a_label} as good as {b_label} or better, as asserted"
    else:
        want_up = m.direction == "greater"
        side = "above" if want_up else "below"
        if ci is not None:
            if not (ci[0] > 1.0 if want_up else ci[1] < 1.0):
                pointing = (ratio > 1.0) == want_up and ratio != 1.0
                detail = "points the asserted way" if pointing else "points the other way"
                return NOT_REPRODUCED, f"the CI is not wholly {side} 1: the effect {detail} but is not established"
        elif not _on_side(m, ratio):
            return NOT_REPRODUCED, f"B / A is not {side} 1: the asserted direction does not hold"
        if abs(ratio - 1.0) < m.min_effect:
            # A real but negligible effect does not carry a claim of a speed-up.
            return NOT_REPRODUCED, (
                f"B / A is {side} 1 by only {abs(ratio - 1.0):.1%}, less than the {m.min_effect:.0%} "
                "minimum effect: no meaningful change"
            )
        holds_why = f"B / A is {side} 1 as asserted"
    if m.expected is None:
        return REPRODUCED, holds_why + " (the seed asserts only a direction)"
    off = ratio / m.expected - 1.0
    if abs(off) <= tol:
        return REPRODUCED, f"{holds_why}, within {tol:.0%} of the published {format_number(m.expected)}x"
    why = (
        f"{holds_why}, but {abs(off):.0%} {'above' if off > 0 else 'below'} the published "
        f"{format_number(m.expected)}x (tolerance {tol:.0%})"
    )
    band_low = m.expected * (1.0 - tol)
    if ceiling is not None and off < 0 and ceiling.value < band_low:
        limit = ceiling.limit_any_workload
        made_of = (
            f"{ceiling.input_label} {format_number(ceiling.input_value)}"
            if ceiling.input_value is not None
            else "what this run measured"
        )
        if limit is not None and limit < band_low:
            why += (
                f". Out of reach by design, not a near miss: the tolerance band starts at "
                f"{format_number(band_low)}x and whatever the workload it cannot pass {format_number(limit)}x "
                f"({ceiling.limit_source}); {ceiling.label} in this run is {format_number(ceiling.value)}x "
                f"(units {format_number(ceiling.low)}-{format_number(ceiling.high)}; {ceiling.formula})"
            )
        else:
            anywhere = f"; whatever the workload it can reach {format_number(limit)}x" if limit is not None else ""
            why += (
                f". Out of reach at this run's {made_of}, not by design: the tolerance band starts at "
                f"{format_number(band_low)}x, and {ceiling.label} at that share is {format_number(ceiling.value)}x "
                f"(units {format_number(ceiling.low)}-{format_number(ceiling.high)}; {ceiling.formula}){anywhere}"
            )
    elif ceiling is not None and off < 0:
        why += (
            f"; {ceiling.label} in this run, {format_number(ceiling.value)}x, leaves the band "
            f"(from {format_number(band_low)}x) within its reach"
        )
    return DIRECTION_ONLY, why


def _matches(rec: Measurement, scenario: str, metric: str, variant: dict[str, Any]) -> bool:
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
            if _matches(rec, m.scenario, m.metric, side.variant):
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


def _today(claim: Claim, records: list[Measurement]) -> list[virtio_layouts.TodayRow]:
    """The guest-of-today layouts the claim lists, from this run's records
    alone (never from the claim's figures)."""
    spec = claim.evidence.today
    if spec is None:
        return []
    return virtio_layouts.today_rows(
        records, spec.structures, scenario=spec.scenario, kvm_scenario=spec.kvm_scenario, workload=spec.workload
    )


def _beside(claim: Claim, records: list[Measurement], *, seed: int) -> list[BesideResult]:
    out = []
    for want in claim.evidence.beside:
        for rec in records:
            if not rec.samples or not _matches(rec, want.scenario, want.metric, want.variant):
                continue
            if rec.n_replicates >= 2:
                low, high = stats.median_ci(rec.replicates, seed=seed)
            else:
                low, high = min(rec.samples), max(rec.samples)
            out.append(
                BesideResult(
                    label=want.label,
                    variant=dict(rec.variant),
                    unit=rec.unit,
                    median=stats.median(rec.samples),
                    low=low,
                    high=high,
                    replicates=rec.n_replicates,
                    samples=len(rec.samples),
                )
            )
    return out


def _plain(obj: Any) -> Any:
    """A model result as plain dicts, whether it is a dict, a dataclass or an
    object with to_json()."""
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


_ratio = format_ratio

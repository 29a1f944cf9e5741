"""A claim of source "order" judged: an order of frequencies (misses, then
RAM hits, then other hits), each kind over the next, per fresh guest.
"""

from __future__ import annotations

from memqual.host.core.record import Measurement
from memqual.host.judge.claims.model import (
    MIN_REPLICATES,
    NOT_REPRODUCED,
    REPRODUCED,
    UNDERPOWERED,
    Claim,
    NoEvidence,
    Verdict,
    format_ratio,
)
from memqual.host.judge.claims.ran_on import ran_on
from memqual.host.judge.claims.records import accelerator
from memqual.host.judge.stats import ratio_ci


def _order_replicates(rec: Measurement) -> list[list[float]]:
    """A kind's rate per unit: from its counts and seconds with half an
    event added (a kind never seen in a boot is rarer than one seen once,
    and a ratio with it stays finite), else the recorded rates."""
    counts, seconds = rec.extra.get("counts"), rec.extra.get("seconds")
    if isinstance(counts, list) and isinstance(seconds, list) and len(counts) == len(seconds) == rec.n_replicates:
        return [[(float(c) + 0.5) / float(s)] for c, s in zip(counts, seconds, strict=True) if float(s) > 0]
    return [list(r) for r in rec.replicates]


def evaluate_order(claim: Claim, records: list[Measurement]) -> Verdict:
    """An order of frequencies (seed 002's priorities: misses, then RAM
    hits, then other hits), judged pair by pair: each kind over the next
    one, per unit (every kind is counted in the same fresh guest, so the
    pairs are paired), with a 95 % t-interval of the per-unit log ratios.
    The order holds when every interval is wholly above 1."""
    m = claim.measure
    usable = [
        r
        for r in records
        if r.claim in (None, claim.id)
        and r.scenario == m.scenario
        and r.metric == m.metric
        and all(r.variant.get(k) == v for k, v in m.where.items())
    ]
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
    accel = accelerator(*by_kind.values()) or str(next(iter(by_kind.values())).settings.get("accel") or "")
    if m.accelerator and accel != m.accelerator:
        raise NoEvidence(
            f"the {m.scenario} records were counted under {accel.upper() or 'an accelerator they do not name'}, "
            f"not {m.accelerator.upper()}: only {m.accelerator.upper()} looks memslots up on a guest's faults"
        )
    reps = {k: _order_replicates(by_kind[k]) for k in m.order}
    units = min(len(r) for r in reps.values())
    verdict = Verdict(
        claim=claim,
        verdict=NOT_REPRODUCED,
        reason="",
        evidence=claim.evidence.kind,
        accelerator=accel,
        ran_on=ran_on(*by_kind.values()),
    )
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
        f"{hi} / {lo} = {format_ratio(iv.ratio)}x, 95% CI [{format_ratio(iv.low)}, {format_ratio(iv.high)}] "
        f"({iv.method}, {units} guests)"
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

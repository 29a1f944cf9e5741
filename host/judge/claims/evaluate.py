"""The verdicts: each claim judged from this run's evidence by its source
(records.py A against B, order.py an order of frequencies, layouts.py the
memslot model on the layouts real guests reported; "none" is not
measurable), with the reason a person can check, the measurements beside
it and today's layouts.  The same rule serves the report and the e2e tests
(``judge_claim``).  Reads records, writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from memqual.host.core import descriptive
from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.layouts import evaluate_layouts
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import (
    CLAIM_ALPHA,
    NOT_MEASURABLE,
    UNMEASURABLE,
    BesideResult,
    Claim,
    NoEvidence,
    Skip,
    Verdict,
)
from memqual.host.judge.claims.order import evaluate_order
from memqual.host.judge.claims.records import evaluate_records, matches
from memqual.host.judge.stats import intervals
from memqual.host.memslots import virtio_layouts


def evaluate(
    claims: Sequence[Claim],
    records: Iterable[Measurement],
    *,
    skips: Sequence[Skip] = (),
    only: Sequence[str] = (),
    alpha: float = CLAIM_ALPHA,
    seed: int = intervals.DEFAULT_SEED,
) -> list[Verdict]:
    """One verdict per claim, in the registry's order.  ``skips`` are the
    tests that ended without passing (their reasons explain missing
    records); ``only`` the tags a run was limited to (a claim whose tag is
    not among them was not selected, and its reason says so)."""
    records = list(records)
    verdicts = []
    for registered in claims:
        claim = on_its_host(registered, records)
        # Judged on its host under test: by that host's records alone.
        mine = records if claim is registered else on_a_host_under_test(records)
        beside = _beside(claim, mine, seed=seed)
        try:
            verdict = _evaluate_one(claim, mine, alpha=alpha, seed=seed)
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


def on_a_host_under_test(records: list[Measurement]) -> list[Measurement]:
    """The records whose guests ran under a host under test (their
    environment names it), not under this machine's kernel."""
    return [r for r in records if r.environment.get("host_under_test")]


def on_its_host(claim: Claim, records: list[Measurement]) -> Claim:
    """The claim as its evidence stands in these records: measured on a
    host under test when its records hold both sides of its ``on_host``
    measure, else as registered (a model, a successor: what this machine
    can)."""
    if claim.on_host is None:
        return claim
    records = on_a_host_under_test(records)
    m = claim.on_host.measure
    wanted = [side.variant for side in (m.a, m.b) if side is not None]
    if m.source == "order":
        wanted = [{**m.where, m.order_key: kind} for kind in m.order]
    if wanted and all(any(matches(r, m.scenario, m.metric, variant) for r in records) for variant in wanted):
        return claim.measured_on_host()
    return claim


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
        return evaluate_layouts(claim, records)
    if m.source == "order":
        return evaluate_order(claim, records)
    return evaluate_records(claim, records, alpha=alpha, seed=seed)


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
            if not rec.samples or not matches(rec, want.scenario, want.metric, want.variant):
                continue
            if rec.n_replicates >= 2:
                low, high = intervals.median_ci(rec.replicates, seed=seed)
            else:
                low, high = min(rec.samples), max(rec.samples)
            out.append(
                BesideResult(
                    label=want.label,
                    variant=dict(rec.variant),
                    unit=rec.unit,
                    median=descriptive.median(rec.samples),
                    low=low,
                    high=high,
                    replicates=rec.n_replicates,
                    samples=len(rec.samples),
                )
            )
    return out

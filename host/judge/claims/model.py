"""What a claim and a verdict are: the typed cards of claims/claims.json
(quantities, measure, evidence) and the verdict with the evidence it
names.  docs/claims-and-report.md is the manual.  Plain values: reads no
file and judges nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from memqual.host.core import descriptive
from memqual.host.core.paths import shipped
from memqual.host.judge.claims.ran_on import RanOn
from memqual.host.memslots import virtio_layouts

SCHEMA = "memqual.claims/2"
DEFAULT_CLAIMS_FILE = shipped("claims") / "claims.json"
# The claim ids of the project's anchor list: the shipped registry must hold each.
ANCHOR_IDS = (
    "memslot-miss",
    "memslot-hit",
    "memslot-netperf",
    "memslot-priorities",
    "ksm-volatile-4k",
    "ksm-volatile-thp",
    "balloon-bitmap",
    "balloon-breakdown",
)

SOURCES = ("records", "memslots-layouts", "order", "none")
DIRECTIONS = ("greater", "less", "at_least")

MEASURED = "measured"
SUCCESSOR = "successor"
ANALOGUE = "analogue"
MODEL = "model"
UNMEASURABLE = "not measurable"
EVIDENCE_CLASSES = (MEASURED, SUCCESSOR, ANALOGUE, MODEL, UNMEASURABLE)

REPRODUCED = "reproduced"
DIRECTION_ONLY = "direction only"
NOT_REPRODUCED = "not reproduced"
UNDERPOWERED = "underpowered"
NOT_MEASURABLE = "not measurable"

# A claim's direction is judged at a looser level than `memqual compare`'s
# regression gate (verdicts.DEFAULT_ALPHA): the seeds' effects are large and
# a claim is one question, not a family of 30.
CLAIM_ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.05
# Fewer independent units than this a side and no verdict is given.  The
# t-interval (host/judge/stats/ratio_ci.py) holds its nominal rate from 2 units under
# normal noise, but with 1 degree of freedom one odd unit decides it; from
# 3 on it stays at or below 2.5 % a side also for heavy-tailed noise
# (tests/judge/test_claims_calibration.py).
MIN_REPLICATES = 3
LAYOUT_SCENARIO = "memslots.guest_layout"


@dataclasses.dataclass(frozen=True)
class Quantity:
    """One side (A or B) of a claim's comparison."""

    label: str
    variant: dict[str, Any] = dataclasses.field(default_factory=dict)  # source "records"
    structure: str = ""  # source "memslots-layouts"
    workload: str = ""
    field: str = ""
    published: float | None = None  # the seed's figure for this side, if any
    published_unit: str = ""  # its unit, when not the measure's (the seed's ms beside seconds)


@dataclasses.dataclass(frozen=True)
class Measure:
    source: str
    a: Quantity | None = None
    b: Quantity | None = None
    scenario: str = ""
    metric: str = ""
    unit: str = ""
    direction: str = "greater"
    expected: float | None = None  # published B / A
    tolerance: float = 0.25  # relative
    # smallest |B / A - 1| that counts as an effect in the asserted direction
    min_effect: float = DEFAULT_MIN_EFFECT
    note: str = ""
    reason: str = ""  # source "none": why it cannot be measured
    # records: replicate i of A and of B come from the same unit (one guest
    # measured both variants), so the interval is of per-unit log ratios
    paired: bool = False
    # records: the mechanism's own bound on B / A, measured in the run
    ceiling: CeilingSpec | None = None
    # order: the variants (values of ``order_key``) ranked most frequent
    # first, judged pair by pair on the records of ``scenario``/``metric``;
    # ``accelerator``: what the records' guests must have run under
    order: tuple[str, ...] = ()
    order_key: str = "kind"
    accelerator: str = ""
    # order: what else the records' variant must hold (the host under
    # test's kernel and conditions), so that one run's other counts stay out
    where: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CeilingSpec:
    """Where a run's records hold the most B / A the measured mechanism can
    give (its own limit applied to what the run measured): a record of the
    scenario whose variant holds ``variant``, one value a unit, with what
    the bound is made of in its ``extra`` (``ceiling_formula``,
    ``limit_any_workload``, ``limit_source``)."""

    scenario: str
    metric: str
    variant: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str = ""
    # the record's ``extra`` field the bound is computed from in this run
    # (smart scan's skip share), one value a unit, and its name in words
    input: str = ""
    input_label: str = ""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The accelerator the claim's evidence needs to speak for the claim,
    and what running under another one does to it."""

    needs: str  # "kvm"
    otherwise: str  # what the evidence says under another accelerator, and why
    would_measure: str  # what would measure it under ``needs``


@dataclasses.dataclass(frozen=True)
class Beside:
    """Records shown on a claim's card next to the verdict's evidence
    (today's kernel measured beside a model of the 2011 one, the seed's own
    quantity beside the one the verdict uses).  They never decide it."""

    label: str
    scenario: str
    metric: str
    variant: dict[str, Any] = dataclasses.field(default_factory=dict)  # a subset to match


@dataclasses.dataclass(frozen=True)
class TodayLayouts:
    """Layouts of a guest of today (a virtio-mem guest's plugged states)
    listed on a memslot claim's card beside the verdict's evidence: the
    nodes a miss examines in each named reference structure, computed from
    each recorded layout, and the miss cost measured through /dev/kvm at
    its slot count.  They never decide the verdict."""

    label: str
    scenario: str
    structures: tuple[str, ...]
    workload: str = "miss"
    kvm_scenario: str = virtio_layouts.KVM_SCENARIO


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the claim is about, and what this registry measures instead."""

    kind: str  # one of EVIDENCE_CLASSES: what the evidence is when present
    claimed: str  # the mechanism and setting the seed measured
    instead: str  # what memqual measures or models, and on what
    summary: str = ""  # ``instead`` in at most two sentences: what the card says at once
    inputs: tuple[str, ...] = ()  # model: where every input comes from
    would_measure: str = ""  # what would measure the claim itself
    beside: tuple[Beside, ...] = ()
    accelerator: Accelerator | None = None
    today: TodayLayouts | None = None


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    title: str
    seed: str
    quote: str
    published: list[dict[str, Any]]
    needs: list[str]
    tag: str
    evidence: Evidence
    measure: Measure
    # The claim measured where it lives, on a host kernel memqual builds
    # (the host under test): judged instead of ``measure`` when a run holds
    # records of its scenario and metric.
    on_host: OnHost | None = None

    def measured_on_host(self) -> Claim:
        """This claim with its host-under-test evidence and measure."""
        assert self.on_host is not None
        return dataclasses.replace(self, evidence=self.on_host.evidence, measure=self.on_host.measure, on_host=None)


@dataclasses.dataclass(frozen=True)
class OnHost:
    """What measures a claim on the host under test: its evidence (class
    measured, saying which kernels and what counts) and its measure (of
    source records)."""

    evidence: Evidence
    measure: Measure


@dataclasses.dataclass(frozen=True)
class LayoutResult:
    """The model's answer on one real guest's layout, on the 2011 host
    (host/memslots/kvm2011.py): ``a`` and ``b`` are the exact means over
    the layout's gaps; ``nic_a`` / ``nic_b`` the nodes of a miss at the
    guest's emulated NIC BAR when its record holds one (the path seed 000
    names).  A layout with more than 32 user slots ran on no 2011 host
    (``runs_2011`` False): its figures are of the guest's slots alone.
    ``newer`` names what of the guest came after 2011 (a q35 machine, a
    pc-dimm): such a layout is listed, never the one that decides.
    ``seed_guest``: the guest was built to the claim's seed's description."""

    config: str
    slots: int
    a: float
    b: float
    runs_2011: bool = True
    nic_a: float | None = None
    nic_b: float | None = None
    newer: tuple[str, ...] = ()
    seed_guest: bool = False

    @property
    def ratio(self) -> float:
        return self.b / self.a if self.a else math.inf

    @property
    def nic_ratio(self) -> float | None:
        if self.nic_a is None or self.nic_b is None:
            return None
        return self.nic_b / self.nic_a if self.nic_a else math.inf


@dataclasses.dataclass(frozen=True)
class BesideResult:
    label: str
    variant: dict[str, Any]
    unit: str
    median: float
    low: float  # hierarchical CI of the median, or min/max with one replicate
    high: float
    replicates: int
    samples: int


@dataclasses.dataclass(frozen=True)
class CeilingResult:
    """The mechanism's own bound on B / A in this run."""

    label: str
    value: float  # median over units
    low: float  # smallest and largest unit
    high: float
    units: int
    formula: str  # how it is computed, in words
    limit_any_workload: float | None  # the bound whatever the workload (the kernel's limit)
    limit_source: str  # where the kernel's limit was read
    input_label: str = ""  # what this run's bound is made of (smart scan's skip share)
    input_value: float | None = None  # its median over units


@dataclasses.dataclass
class Verdict:
    """The judgement of one claim, and everything it was made from."""

    claim: Claim
    verdict: str
    reason: str
    evidence: str = UNMEASURABLE  # the class of the evidence actually used
    ratio: float | None = None  # B / A
    ci: tuple[float, float] | None = None
    # The verdict's reason in one sentence (the card shows it; ``reason``
    # keeps every figure), and the per-layout or per-pair arithmetic behind it.
    headline: str = ""
    details: list[str] = dataclasses.field(default_factory=list)
    # a model's B / A on the layouts that do not decide, shown beside it
    range_beside: tuple[float, float] | None = None
    p_value: float | None = None
    a_replicates: list[list[float]] = dataclasses.field(default_factory=list)
    b_replicates: list[list[float]] = dataclasses.field(default_factory=list)
    replicates_needed: int | None = None
    layouts: list[LayoutResult] = dataclasses.field(default_factory=list)
    beside: list[BesideResult] = dataclasses.field(default_factory=list)
    today: list[virtio_layouts.TodayRow] = dataclasses.field(default_factory=list)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    interval_method: str = ""
    ceiling: CeilingResult | None = None
    accelerator: str = ""  # what the records' guests ran under ("" when they do not say)
    # what the verdict does not speak for (another accelerator), shown with it
    qualifier: str = ""
    # the hosts and clocks of the records the evidence came from; none for
    # a model or a claim not measured
    ran_on: RanOn = dataclasses.field(default_factory=RanOn)

    @property
    def computed(self) -> bool:
        return self.evidence == MODEL

    @property
    def a_samples(self) -> list[float]:
        return [s for r in self.a_replicates for s in r]

    @property
    def b_samples(self) -> list[float]:
        return [s for r in self.b_replicates for s in r]

    def to_json(self) -> dict[str, Any]:
        m = self.claim.measure
        ev = self.claim.evidence

        def side(q: Quantity | None, reps: list[list[float]]) -> dict[str, Any] | None:
            if q is None:
                return None
            out: dict[str, Any] = {"label": q.label, "unit": m.unit, "published": q.published}
            if q.published_unit:
                out["published_unit"] = q.published_unit
            flat = [s for r in reps for s in r]
            if flat:
                out["median"] = descriptive.median(flat)
                out["summary"] = descriptive.summarize(flat).to_json()
                out["replicates"] = len(reps)
            return out

        return {
            "id": self.claim.id,
            "title": self.claim.title,
            "verdict": self.verdict,
            "reason": self.reason,
            "headline": self.headline or self.reason,
            "details": list(self.details),
            "evidence": {
                "class": self.evidence,
                "registered_class": ev.kind,
                "claimed": ev.claimed,
                "instead": ev.instead,
                "inputs": list(ev.inputs),
                "would_measure": ev.would_measure,
                "summary": ev.summary,
                "accelerator": dataclasses.asdict(ev.accelerator) if ev.accelerator else None,
            },
            "qualifier": self.qualifier,
            "accelerator": self.accelerator,
            "ran_on": self.ran_on.to_json(),
            "interval_method": self.interval_method,
            "ceiling": dataclasses.asdict(self.ceiling) if self.ceiling else None,
            "seed": self.claim.seed,
            "quote": self.claim.quote,
            "published": self.claim.published,
            "expected": m.expected,
            "direction": m.direction,
            "tolerance": m.tolerance,
            "note": m.note,
            "needs": self.claim.needs,
            "measured": finite(self.ratio),
            "ci": [finite(self.ci[0]), finite(self.ci[1])] if self.ci else None,
            "range_beside": [finite(x) for x in self.range_beside] if self.range_beside else None,
            "p_value": self.p_value,
            "replicates_needed": self.replicates_needed,
            "unit": "x",
            "computed": self.computed,
            "source": m.source,
            "a": side(m.a, self.a_replicates),
            "b": side(m.b, self.b_replicates),
            "samples": {"a": self.a_samples, "b": self.b_samples},
            "replicates": {"a": self.a_replicates, "b": self.b_replicates},
            "layouts": [
                {
                    "config": lr.config,
                    "slots": lr.slots,
                    "a": lr.a,
                    "b": lr.b,
                    "ratio": finite(lr.ratio),
                    "runs_2011": lr.runs_2011,
                    "nic_a": lr.nic_a,
                    "nic_b": lr.nic_b,
                    "nic_ratio": finite(lr.nic_ratio),
                    "newer": list(lr.newer),
                    "seed_guest": lr.seed_guest,
                }
                for lr in self.layouts
            ],
            "beside": [dataclasses.asdict(b) for b in self.beside],
            "today": (
                {
                    "label": ev.today.label,
                    "structures": list(ev.today.structures),
                    "workload": ev.today.workload,
                    "rows": [r.to_json() for r in self.today],
                }
                if ev.today and self.today
                else None
            ),
            "settings": self.settings,
        }


# ------------------------------------------------------------ evaluation


@dataclasses.dataclass(frozen=True)
class Skip:
    """A test that did not produce records, and why (from avocado's results:
    SKIP/CANCEL/ERROR/FAIL reasons)."""

    test: str
    status: str
    reason: str


class NoEvidence(Exception):
    """This claim has no evidence in the records given (the message says why)."""


def format_ratio(x: float | None) -> str:
    """Ratios with 3 decimals below 10 (1.003x, not 1x)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.2f}" if abs(x) < 100 else f"{x:,.0f}"


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None

"""The claims registry and the verdicts.

claims/claims.json lists every claim of the seeds and says, as data, what
evidence judges it and how: which two quantities A and B to compare, what the
seed asserts about B / A (its direction) and the published magnitude with a
tolerance.  A new scenario plugs in by editing that file.

Every verdict names its evidence, one of five classes:

- ``measured``: the claimed mechanism itself, measured in this run on a
  real system;
- ``successor``: the claimed mechanism is in no kernel; the mechanism
  upstream adopted instead was measured on the real system (the card names
  both);
- ``analogue``: the claimed mechanism is in no kernel and nothing upstream
  replaced it; what the seed varied was varied on what the kernel has
  today (the balloon's request size with PFN arrays, not the bitmap), and
  measured on the real system;
- ``model``: the code the claim is about runs nowhere today; a model of it
  was run, and the card says where every input comes from;
- ``not measurable``: nothing in this run can measure it; the card says why
  and what would.

A claim may also name the accelerator its evidence needs (``accelerator``):
a verdict made on guests under another one carries a qualifier saying what
it does not speak for and what would measure it.

The evidence is never computed from the claim's own published figures:
those enter only here, where the evidence is compared with them.  The
sources of evidence:

- ``records``: samples from a scenario's measurement records, A and B by
  variant, grouped into independent replicates (host/record.py);
- ``memslots-layouts``: the memslot lookup model run on every layout a real
  guest reported in this run (records of ``memslots.guest_layout``);
- ``none``: no evidence can be had here, with the reason.

Verdicts, each with a reason a person can check:

- ``reproduced``: the asserted direction holds and, when the seed published a
  magnitude, B / A is within the tolerance of it (a claim that asserts only
  a direction is reproduced by its direction);
- ``direction only``: the direction holds, the magnitude does not;
- ``not reproduced``: the direction is not established (or is reversed);
- ``underpowered``: evidence was measured, but on fewer independent
  replicates a side than a verdict needs (the count it needs is given);
- ``not measurable``: no evidence in this run (no records, a skipped
  scenario, or a claim that needs what this host lacks).

For measured samples "the direction holds" means the 95 % t-interval of
B / A on the log scale lies wholly on the asserted side of 1
(host/ratio_ci.py): of the per-unit log ratios when each unit measured A
and B (``paired``), else Welch's of the log unit medians.  At 3 to 8 units
its one-sided error stays at the nominal 2.5 %, where a bootstrap of so
few units ran at up to 10.7 % (tests/test_claims_calibration.py).  The
exact sign-flip (paired) or permutation p is reported beside it.  A
mechanism's own bound on B / A (``ceiling``, smart scan's skip limit
applied to the run's skip share) says when the published magnitude is
out of its reach by design.  For the memslot model "holds" means the
median over the real layouts a 2011 host could run is on the asserted
side, by at least the claim's minimum effect (on seed 000's path, a miss
at the guest's emulated NIC BAR, where a layout holds one); the card lists
every layout, those no 2011 host ran among them.  The same rule serves the
report and the e2e tests: ``judge_claim``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memqual.host import ratio_ci, stats
from memqual.host.errors import BadInput
from memqual.host.figures import format_number
from memqual.host.jsonfile import read_json
from memqual.host.memslots import guest_layouts, kvm2011, model, structures, virtio_layouts
from memqual.host.memslots import layout as layout_mod
from memqual.host.paths import shipped
from memqual.host.record import Measurement

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

SOURCES = ("records", "memslots-layouts", "none")
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
# regression gate: the seeds' effects are large and a claim is one question,
# not a family of 30.
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.05
# Fewer independent units than this a side and no verdict is given.  The
# t-interval (host/ratio_ci.py) holds its nominal rate from 2 units under
# normal noise, but with 1 degree of freedom one odd unit decides it; from
# 3 on it stays at or below 2.5 % a side also for heavy-tailed noise
# (tests/test_claims_calibration.py).
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


@dataclasses.dataclass(frozen=True)
class LayoutResult:
    """The model's answer on one real guest's layout, on the 2011 host
    (host/memslots/kvm2011.py): ``a`` and ``b`` are the exact means over
    the layout's gaps; ``nic_a`` / ``nic_b`` the nodes of a miss at the
    guest's emulated NIC BAR when its record holds one (the path seed 000
    names).  A layout with more than 32 user slots ran on no 2011 host
    (``runs_2011`` False): its figures are of the guest's slots alone."""

    config: str
    slots: int
    a: float
    b: float
    runs_2011: bool = True
    nic_a: float | None = None
    nic_b: float | None = None

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


@dataclasses.dataclass
class Verdict:
    """The judgement of one claim, and everything it was made from."""

    claim: Claim
    verdict: str
    reason: str
    evidence: str = UNMEASURABLE  # the class of the evidence actually used
    ratio: float | None = None  # B / A
    ci: tuple[float, float] | None = None
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
                out["median"] = stats.median(flat)
                out["summary"] = stats.summarize(flat).to_json()
                out["replicates"] = len(reps)
            return out

        return {
            "id": self.claim.id,
            "title": self.claim.title,
            "verdict": self.verdict,
            "reason": self.reason,
            "evidence": {
                "class": self.evidence,
                "registered_class": ev.kind,
                "claimed": ev.claimed,
                "instead": ev.instead,
                "inputs": list(ev.inputs),
                "would_measure": ev.would_measure,
                "accelerator": dataclasses.asdict(ev.accelerator) if ev.accelerator else None,
            },
            "qualifier": self.qualifier,
            "accelerator": self.accelerator,
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
            "measured": _finite(self.ratio),
            "ci": [_finite(self.ci[0]), _finite(self.ci[1])] if self.ci else None,
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
                    "ratio": _finite(lr.ratio),
                    "runs_2011": lr.runs_2011,
                    "nic_a": lr.nic_a,
                    "nic_b": lr.nic_b,
                    "nic_ratio": _finite(lr.nic_ratio),
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


# --------------------------------------------------------------- loading


def load(path: str | Path | None = None) -> list[Claim]:
    """Read and validate a claims file; every problem is a BadInput that
    names the file, the claim and the field."""
    path = Path(path) if path is not None else DEFAULT_CLAIMS_FILE
    data = read_json(path, "claims file", "give claims/claims.json or a file of its form")
    return parse(data, source=str(path))


def parse(data: Any, source: str = "claims") -> list[Claim]:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{source}: schema {got!r} is not {SCHEMA!r}")
    entries = data.get("claims")
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"{source}: 'claims' must be a non-empty list")
    claims: list[Claim] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        claim = _parse_claim(entry, f"{source}: claim #{index}")
        if claim.id in seen:
            raise BadInput(f"{source}: claim id {claim.id!r} appears twice")
        seen.add(claim.id)
        claims.append(claim)
    return claims


def _require(entry: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in entry:
        raise BadInput(f"{where}: missing field {key!r}")
    value = entry[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadInput(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _number_or_none(entry: dict[str, Any], key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadInput(f"{where}: field {key!r} must be a number or null")
    return float(value)


def _parse_claim(entry: Any, where: str) -> Claim:
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: must be an object")
    cid = _require(entry, "id", str, where)
    where = where.split(": claim #")[0] + f": claim {cid!r}"
    published = _require(entry, "published", list, where)
    for item in published:
        if not isinstance(item, dict) or "what" not in item or "unit" not in item:
            raise BadInput(f"{where}: each published figure needs 'what' and 'unit'")
    measure = _parse_measure(_require(entry, "measure", dict, where), where + " measure")
    evidence = _parse_evidence(_require(entry, "evidence", dict, where), measure, where + " evidence")
    return Claim(
        id=cid,
        title=_require(entry, "title", str, where),
        seed=_require(entry, "seed", str, where),
        quote=_require(entry, "quote", str, where),
        published=published,
        needs=[str(n) for n in entry.get("needs", [])],
        tag=str(entry.get("tag", "")),
        evidence=evidence,
        measure=measure,
    )


def _parse_evidence(entry: dict[str, Any], measure: Measure, where: str) -> Evidence:
    kind = _require(entry, "class", str, where)
    if kind not in EVIDENCE_CLASSES:
        raise BadInput(f"{where}: class {kind!r} is not one of {', '.join(EVIDENCE_CLASSES)}")
    # The class must be one the source can give: a model source is a model,
    # records are a measurement (of the mechanism or its successor), and a
    # claim with no source is not measurable.
    allowed = {"none": (UNMEASURABLE,), "memslots-layouts": (MODEL,), "records": (MEASURED, SUCCESSOR, ANALOGUE)}
    if kind not in allowed[measure.source]:
        raise BadInput(
            f"{where}: class {kind!r} does not fit source {measure.source!r} "
            f"(use {' or '.join(allowed[measure.source])})"
        )
    inputs = entry.get("inputs", [])
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise BadInput(f"{where}: 'inputs' must be a list of sentences")
    if kind == MODEL and not inputs:
        raise BadInput(f"{where}: a model must say where each of its inputs comes from ('inputs')")
    would = str(entry.get("would_measure", ""))
    if kind == UNMEASURABLE and not would:
        raise BadInput(f"{where}: a claim that is not measurable must say what would measure it ('would_measure')")
    beside = []
    for index, item in enumerate(entry.get("beside", [])):
        w = f"{where} beside #{index}"
        if not isinstance(item, dict):
            raise BadInput(f"{w}: must be an object")
        beside.append(
            Beside(
                label=_require(item, "label", str, w),
                scenario=_require(item, "scenario", str, w),
                metric=_require(item, "metric", str, w),
                variant=dict(item.get("variant", {})),
            )
        )
    accelerator = None
    if "accelerator" in entry:
        acc = _require(entry, "accelerator", dict, where)
        w = f"{where} accelerator"
        accelerator = Accelerator(
            needs=_require(acc, "needs", str, w),
            otherwise=_require(acc, "otherwise", str, w),
            would_measure=_require(acc, "would_measure", str, w),
        )
    return Evidence(
        kind=kind,
        claimed=_require(entry, "claimed", str, where),
        instead=_require(entry, "instead", str, where),
        inputs=tuple(inputs),
        would_measure=would,
        beside=tuple(beside),
        accelerator=accelerator,
        today=_parse_today(entry.get("today"), where + " today"),
    )


def _parse_today(entry: Any, where: str) -> TodayLayouts | None:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: must be an object")
    names = _require(entry, "structures", list, where)
    known = set(structures.STRUCTURES)
    if not names or not all(isinstance(x, str) and x in known for x in names):
        raise BadInput(f"{where}: 'structures' must name structures of the memslot model ({', '.join(sorted(known))})")
    return TodayLayouts(
        label=_require(entry, "label", str, where),
        scenario=_require(entry, "scenario", str, where),
        structures=tuple(names),
        workload=str(entry.get("workload", "miss")),
        kvm_scenario=str(entry.get("kvm_scenario", virtio_layouts.KVM_SCENARIO)),
    )


def _parse_quantity(entry: Any, source: str, where: str) -> Quantity:
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: must be an object")
    q = Quantity(
        label=_require(entry, "label", str, where),
        variant=dict(entry.get("variant", {})),
        structure=str(entry.get("structure", "")),
        workload=str(entry.get("workload", "")),
        field=str(entry.get("field", "")),
        published=_number_or_none(entry, "published", where),
        published_unit=str(entry.get("published_unit", "")),
    )
    if source == "records" and not q.variant:
        raise BadInput(f"{where}: a 'records' side needs a 'variant' object")
    if source == "memslots-layouts":
        for key in ("structure", "workload", "field"):
            if not getattr(q, key):
                raise BadInput(f"{where}: a 'memslots-layouts' side needs {key!r}")
    return q


def _parse_measure(entry: dict[str, Any], where: str) -> Measure:
    source = _require(entry, "source", str, where)
    if source not in SOURCES:
        raise BadInput(f"{where}: source {source!r} is not one of {', '.join(SOURCES)}")
    if source == "none":
        return Measure(source=source, reason=_require(entry, "reason", str, where))
    direction = _require(entry, "direction", str, where)
    if direction not in DIRECTIONS:
        raise BadInput(f"{where}: direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    tolerance = _number_or_none(entry, "tolerance", where)
    if tolerance is None or tolerance < 0:
        raise BadInput(f"{where}: 'tolerance' must be a number >= 0")
    min_effect = _number_or_none(entry, "min_effect", where)
    if min_effect is not None and min_effect < 0:
        raise BadInput(f"{where}: 'min_effect' must be a number >= 0")
    expected = _number_or_none(entry, "expected", where)
    if expected is not None and expected <= 0:
        raise BadInput(f"{where}: 'expected' must be a positive ratio or null")
    if source == "records":
        _require(entry, "scenario", str, where)
        _require(entry, "metric", str, where)
    return Measure(
        source=source,
        a=_parse_quantity(entry.get("a"), source, where + " a"),
        b=_parse_quantity(entry.get("b"), source, where + " b"),
        scenario=str(entry.get("scenario", LAYOUT_SCENARIO if source == "memslots-layouts" else "")),
        metric=str(entry.get("metric", "")),
        unit=str(entry.get("unit", "")),
        direction=direction,
        expected=expected,
        tolerance=tolerance,
        min_effect=DEFAULT_MIN_EFFECT if min_effect is None else min_effect,
        note=str(entry.get("note", "")),
        paired=_flag(entry, "paired", where),
        ceiling=_parse_ceiling(entry.get("ceiling"), where + " ceiling"),
    )


def _parse_ceiling(entry: Any, where: str) -> CeilingSpec | None:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: must be an object")
    return CeilingSpec(
        scenario=_require(entry, "scenario", str, where),
        metric=_require(entry, "metric", str, where),
        variant=dict(entry.get("variant", {})),
        label=str(entry.get("label", "")),
    )


def _flag(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise BadInput(f"{where}: field {key!r} must be true or false")
    return value


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
            verdict = Verdict(claim=claim, verdict=NOT_MEASURABLE, reason=reason, evidence=UNMEASURABLE)
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
        p_value, floor = sign_flip_pvalue(a_reps, b_reps), 2.0 / 2**n_a
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
    return CeilingResult(
        label=spec.label or spec.metric,
        value=stats.median(units),
        low=min(units),
        high=max(units),
        units=len(units),
        formula=str(rec.extra.get("ceiling_formula", "")),
        limit_any_workload=float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None,
        limit_source=str(rec.extra.get("limit_source", "")),
    )


def _points_asserted_way(m: Measure, ratio: float) -> bool:
    if m.direction == "less":
        return ratio < 1.0
    return ratio > 1.0


def _evaluate_layouts(claim: Claim, records: list[Measurement]) -> Verdict:
    """The memslot model on the real layouts.  Only layouts a 2011 host
    could run decide; where any of them holds the guest's emulated NIC BAR,
    the miss at that BAR decides (seed 000's path: "the mmio faults for the
    NIC"), else the mean over every gap.  The rest is on the card."""
    m = claim.measure
    assert m.a is not None and m.b is not None
    results = layout_results(m.a, m.b, [r for r in records if r.scenario == m.scenario])
    if not results:
        raise NoEvidence(
            f"no memslot layouts read from real guests in this run (records of {m.scenario})"
            + (f"; needs {'; '.join(claim.needs)}" if claim.needs else "")
        )
    runnable = [lr for lr in results if lr.runs_2011]
    refused = [lr for lr in results if not lr.runs_2011]
    refused_text = "; ".join(
        f"{lr.config} ({lr.slots} user slots) ran on no 2011 host (KVM_MEMORY_SLOTS {kvm2011.KVM_MEMORY_SLOTS}): "
        f"on its slots alone {m.a.label} walks {format_number(lr.a)} per miss, {m.b.label} {format_number(lr.b)}"
        for lr in refused
    )
    if not runnable:
        raise NoEvidence(f"no layout read in this run is one a 2011 host could run: {refused_text}")
    at_nic = [lr for lr in runnable if lr.nic_ratio is not None]
    deciding = at_nic or runnable
    ratios = [lr.nic_ratio if at_nic and lr.nic_ratio is not None else lr.ratio for lr in deciding]
    ratio = stats.median(ratios)
    verdict, why = judge(m, ratio, None)
    holds = sum(1 for r in ratios if _on_side(m, r) and abs(r - 1.0) >= m.min_effect)
    if at_nic:
        path = "a miss at the guest's emulated NIC MMIO BAR (seed 000's path)"
        detail = ", ".join(
            f"{lr.config} ({lr.slots} slots) {format_number(lr.nic_b)}/{format_number(lr.nic_a)}" for lr in at_nic
        )
    else:
        path = "the mean over every gap (no layout in this run holds an emulated NIC BAR)"
        detail = ", ".join(
            f"{lr.config} ({lr.slots} slots) {format_number(lr.b)}/{format_number(lr.a)}" for lr in deciding
        )
    gaps = ", ".join(f"{lr.config} {format_number(lr.b)}/{format_number(lr.a)}" for lr in runnable)
    worst = max(results, key=lambda lr: lr.a)
    reason = (
        f"model of the 2011 structures on {len(results)} layouts read from real guests in this run, "
        f"on a 2011 {kvm2011.DEFAULT_HOST.name} host (the array walks nmemslots entries, private slots included); "
        f"decided on {len(deciding)} layout(s) by {path}: {m.b.label} / {m.a.label} median {_ratio(ratio)}x "
        f"(range {_ratio(min(ratios))}-{_ratio(max(ratios))}; the direction holds on {holds} of {len(deciding)}): "
        f"{detail} {m.unit}; {why}. Mean over every gap: {gaps} {m.unit}. "
        f"The tree's worst case here: {worst.config}, {format_number(worst.a)} {m.unit} per miss"
        + (f". {refused_text}" if refused else "")
    )
    return Verdict(
        claim=claim,
        verdict=verdict,
        reason=reason,
        evidence=MODEL,
        ratio=ratio,
        ci=(min(ratios), max(ratios)) if len(ratios) > 1 else None,
        a_replicates=[[lr.nic_a if at_nic and lr.nic_a is not None else lr.a] for lr in deciding],
        b_replicates=[[lr.nic_b if at_nic and lr.nic_b is not None else lr.b] for lr in deciding],
        layouts=results,
        settings={
            "layouts": [lr.config for lr in results],
            "host_2011": kvm2011.DEFAULT_HOST.name,
            "decided_by": "nic-bar-miss" if at_nic else "mean-over-gaps",
            "refused_by_2011_host": [lr.config for lr in refused],
        },
    )


def layout_results(a: Quantity, b: Quantity, records: Sequence[Measurement]) -> list[LayoutResult]:
    """The memslot model on every layout record (a real guest's memslots in
    ``extra["layout"]``), one result per configuration, on the 2011 host
    where one could run the layout."""
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
        anywhere = (
            f"; whatever the workload it cannot pass {format_number(limit)}x ({ceiling.limit_source})"
            if limit is not None
            else ""
        )
        why += (
            f". Out of reach by design, not a near miss: the tolerance band starts at {format_number(band_low)}x, "
            f"and {ceiling.label} in this run is {format_number(ceiling.value)}x "
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


def sign_flip_pvalue(a_reps: Sequence[Sequence[float]], b_reps: Sequence[Sequence[float]]) -> float:
    """Exact two-sided sign-flip test of the per-unit log ratios of medians
    (2^n arrangements): the paired counterpart of the permutation test."""
    import itertools

    import numpy as np

    logs = np.log([np.median(b) / np.median(a) for a, b in zip(a_reps, b_reps, strict=True)])
    observed = abs(logs.sum())
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=len(logs))))
    sums = np.abs(flips @ logs)
    return float(np.mean(sums >= observed - 1e-12))


def _plain(obj: Any) -> Any:
    """A model result as plain dicts, whether it is a dict, a dataclass or an
    object with to_json()."""
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def format_ratio(x: float | None) -> str:
    """Ratios with 3 decimals below 10 (1.003x, not 1x)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.2f}" if abs(x) < 100 else f"{x:,.0f}"


_ratio = format_ratio


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None

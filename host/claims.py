"""The claims registry and the verdicts.

claims/claims.json lists every claim of the seeds and says, as data, how to
judge it: which two quantities A and B to compare (samples of two variants of
a scenario's metric, figures a scenario computed, or the memslot reference
model), what the seed asserts about B / A (its direction) and the published
magnitude with a tolerance.  A new scenario plugs in by editing that file.

Verdicts, each with a reason a person can check:

- ``reproduced``: the asserted direction holds and, when the seed published a
  magnitude, B / A is within the tolerance of it (a claim that asserts only
  a direction is reproduced by its direction);
- ``direction only``: the direction holds, the magnitude does not;
- ``not reproduced``: the direction is not established (or is reversed);
- ``not measurable``: nothing here measures it (no records, a skipped
  scenario, a missing model, or a claim that needs what this host lacks).

For measured samples "the direction holds" means: the bootstrap CI of the
ratio of medians lies on the asserted side of 1 *and* the permutation test
gives p < alpha (host/stats.py).  Computed figures (the reference model) have
no spread: their direction is the sign of B / A - 1, and the reason says they
were computed, not measured.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from host import stats
from host.jsonfile import read_json
from host.errors import BadInput
from host.paths import REPO_ROOT
from host.record import Measurement

SCHEMA = "memqual.claims/1"
DEFAULT_CLAIMS_FILE = REPO_ROOT / "claims" / "claims.json"
# The claim ids of ../shared/ANCHORS.md: the shipped registry must hold each.
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

SOURCES = ("records", "record-extra", "memslots-model", "none")
DIRECTIONS = ("greater", "less", "at_least")

REPRODUCED = "reproduced"
DIRECTION_ONLY = "direction only"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable"
VERDICTS = (REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, NOT_MEASURABLE)

# A claim's direction is judged at a looser level than `memqual compare`'s
# regression gate: the seeds' effects are large, our repeats few (5 vs 5
# gives an exact two-sided p of at least 2/252 = 0.008).
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.05


@dataclasses.dataclass(frozen=True)
class Quantity:
    """One side (A or B) of a claim's comparison."""

    label: str
    variant: dict[str, Any] = dataclasses.field(default_factory=dict)  # source "records"
    # source "record-extra": dotted paths into Measurement.extra, the first
    # one present wins (a model may give a calibrated figure or only bounds)
    paths: tuple[str, ...] = ()
    layout: str = ""  # source "memslots-model"
    workload: str = ""
    structure: str = ""
    field: str = ""
    published: float | None = None  # the seed's figure for this side, if any


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


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    title: str
    seed: str
    quote: str
    published: list[dict[str, Any]]
    needs: list[str]
    tag: str
    measure: Measure


@dataclasses.dataclass
class Verdict:
    """The judgement of one claim, and everything it was made from."""

    claim: Claim
    verdict: str
    reason: str
    ratio: float | None = None  # B / A (ratio of medians when measured)
    ci: tuple[float, float] | None = None
    p_value: float | None = None
    a_samples: list[float] = dataclasses.field(default_factory=list)
    b_samples: list[float] = dataclasses.field(default_factory=list)
    computed: bool = False  # from a model, not a measurement
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def a_value(self) -> float | None:
        return stats.median(self.a_samples) if self.a_samples else None

    @property
    def b_value(self) -> float | None:
        return stats.median(self.b_samples) if self.b_samples else None

    def to_json(self) -> dict[str, Any]:
        m = self.claim.measure

        def side(q: Quantity | None, samples: list[float]) -> dict[str, Any] | None:
            if q is None:
                return None
            out: dict[str, Any] = {"label": q.label, "unit": m.unit, "published": q.published}
            if samples:
                out["median"] = stats.median(samples)
                out["summary"] = stats.summarize(samples).to_json()
            return out

        return {
            "id": self.claim.id,
            "title": self.claim.title,
            "verdict": self.verdict,
            "reason": self.reason,
            "seed": self.claim.seed,
            "quote": self.claim.quote,
            "published": self.claim.published,
            "expected": m.expected,
            "direction": m.direction,
            "tolerance": m.tolerance,
            "measured": _finite(self.ratio),
            "ci": [_finite(self.ci[0]), _finite(self.ci[1])] if self.ci else None,
            "p_value": self.p_value,
            "unit": "x",
            "computed": self.computed,
            "source": m.source,
            "a": side(m.a, self.a_samples),
            "b": side(m.b, self.b_samples),
            "samples": {"a": self.a_samples, "b": self.b_samples},
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
    return Claim(
        id=cid,
        title=_require(entry, "title", str, where),
        seed=_require(entry, "seed", str, where),
        quote=_require(entry, "quote", str, where),
        published=published,
        needs=[str(n) for n in entry.get("needs", [])],
        tag=str(entry.get("tag", "")),
        measure=measure,
    )


def _parse_quantity(entry: Any, source: str, where: str) -> Quantity:
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: must be an object")
    label = _require(entry, "label", str, where)
    q = Quantity(
        label=label,
        variant=dict(entry.get("variant", {})),
        paths=_paths(entry.get("path"), where),
        layout=str(entry.get("layout", "")),
        workload=str(entry.get("workload", "")),
        structure=str(entry.get("structure", "")),
        field=str(entry.get("field", "")),
        published=_number_or_none(entry, "published", where),
    )
    if source == "records" and not q.variant:
        raise BadInput(f"{where}: a 'records' side needs a 'variant' object")
    if source == "record-extra" and not q.paths:
        raise BadInput(f"{where}: a 'record-extra' side needs a 'path' (a string or a list of them)")
    if source == "memslots-model":
        for key in ("layout", "workload", "structure", "field"):
            if not getattr(q, key):
                raise BadInput(f"{where}: a 'memslots-model' side needs {key!r}")
    return q


def _paths(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise BadInput(f"{where}: 'path' must be a dotted path or a list of them")


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
    if source in ("records", "record-extra"):
        _require(entry, "scenario", str, where)
        if source == "records":
            _require(entry, "metric", str, where)
    return Measure(
        source=source,
        a=_parse_quantity(entry.get("a"), source, where + " a"),
        b=_parse_quantity(entry.get("b"), source, where + " b"),
        scenario=str(entry.get("scenario", "")),
        metric=str(entry.get("metric", "")),
        unit=str(entry.get("unit", "")),
        direction=direction,
        expected=expected,
        tolerance=tolerance,
        min_effect=DEFAULT_MIN_EFFECT if min_effect is None else min_effect,
        note=str(entry.get("note", "")),
    )


# ------------------------------------------------------------ evaluation


@dataclasses.dataclass(frozen=True)
class Skip:
    """A test that did not produce records, and why (from avocado's results:
    SKIP/CANCEL/ERROR/FAIL reasons)."""

    test: str
    status: str
    reason: str


class _Unmeasurable(Exception):
    """Internal: this claim cannot be evaluated from what we have."""


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
    model = _MemslotsModel()
    verdicts = []
    for claim in claims:
        try:
            verdicts.append(_evaluate_one(claim, records, model, alpha=alpha, seed=seed))
        except _Unmeasurable as why:
            reason = str(why)
            if only and claim.tag and claim.tag not in only and claim.measure.source != "none":
                reason = f"not selected in this run (--only {' '.join(only)}; this claim's tests are tagged {claim.tag!r}): {reason}"
            related = _related_skips(claim, skips)
            if related:
                first = related[0]
                reason += f"; {first.test} ended {first.status}: {first.reason}"
            verdicts.append(Verdict(claim=claim, verdict=NOT_MEASURABLE, reason=reason))
    return verdicts


def _related_skips(claim: Claim, skips: Sequence[Skip]) -> list[Skip]:
    """Tests of the claim's tag that did not pass, the ones named like its
    scenario first ("ksm.volatile_scan" -> a test with "volatile" in it)."""
    if not claim.tag:
        return []
    related = [s for s in skips if claim.tag in s.test.lower()]
    scenario_word = claim.measure.scenario.split(".")[-1].split("_")[0].lower()
    return sorted(related, key=lambda s: not (scenario_word and scenario_word in s.test.lower()))


def _evaluate_one(
    claim: Claim, records: list[Measurement], model: "_MemslotsModel", *, alpha: float, seed: int
) -> Verdict:
    m = claim.measure
    if m.source == "none":
        raise _Unmeasurable(m.reason)
    assert m.a is not None and m.b is not None  # the parser guarantees both sides
    if m.source == "records":
        a, b, settings = _record_samples(claim, records)
        comp = stats.compare(a, b, alpha=alpha, min_effect=0.0, seed=seed)
        verdict, why = _judge(m, comp.ratio, (comp.ci_low, comp.ci_high), comp.p_value, alpha)
        n = f"n={len(a)}+{len(b)}"
        reason = (
            f"measured {m.scenario} {m.metric}: {m.b.label} / {m.a.label} = "
            f"{_ratio(comp.ratio)}x, 95% CI [{_ratio(comp.ci_low)}, {_ratio(comp.ci_high)}], "
            f"p={comp.p_value:.3g}, {n}; {why}"
        )
        return Verdict(
            claim=claim,
            verdict=verdict,
            reason=reason,
            ratio=comp.ratio,
            ci=(comp.ci_low, comp.ci_high),
            p_value=comp.p_value,
            a_samples=list(a),
            b_samples=list(b),
            settings=settings,
        )
    if m.source == "record-extra":
        a, b, settings = _extra_values(claim, records)
        used = settings.get("extra_paths", {})
        what = (
            f"computed by {m.scenario}'s model from this run's measurements, not measured directly "
            f"(extra.{used.get('a')} and extra.{used.get('b')})"
        )
    else:
        a = [model.value(m.a)]
        b = [model.value(m.b)]
        settings = {"layouts": sorted({m.a.layout, m.b.layout}), "workloads": sorted({m.a.workload, m.b.workload})}
        what = "computed from the reference model (host.memslots.model), not measured"
    if len(a) > 1 and len(b) > 1:
        comp = stats.compare(a, b, alpha=alpha, min_effect=0.0, seed=seed)
        ratio, ci, p = comp.ratio, (comp.ci_low, comp.ci_high), comp.p_value
    else:
        ratio, ci, p = stats.ratio_of_medians(a, b), None, None
    verdict, why = _judge(m, ratio, ci, p, alpha)
    reason = (
        f"{what}: {m.b.label} {_fmt(stats.median(b))} {m.unit} / {m.a.label} "
        f"{_fmt(stats.median(a))} {m.unit} = {_ratio(ratio)}x; {why}"
    )
    if m.note and m.source == "memslots-model":
        reason += f" ({m.note})"
    return Verdict(
        claim=claim,
        verdict=verdict,
        reason=reason,
        ratio=ratio,
        ci=ci,
        p_value=p,
        a_samples=list(a),
        b_samples=list(b),
        computed=True,
        settings=settings,
    )


def _judge(
    m: Measure, ratio: float, ci: tuple[float, float] | None, p: float | None, alpha: float
) -> tuple[str, str]:
    """The verdict from B / A, its CI and p (CI and p are None for computed
    figures, which have no spread)."""
    if not math.isfinite(ratio):
        return NOT_REPRODUCED, "the ratio is undefined (A is zero)"
    tol = m.tolerance
    measured = ci is not None and p is not None
    if m.direction == "at_least":
        floor = 1.0 - tol
        worse = ratio < floor and (not measured or (ci[1] < floor and p < alpha))  # type: ignore[index]
        if worse:
            return NOT_REPRODUCED, f"B is worse than A beyond the {tol:.0%} slack of 'as good as'"
        if ratio < floor:
            return NOT_REPRODUCED, f"below the {tol:.0%} slack of 'as good as', though not significantly"
        holds_why = f"B / A >= {floor:.3g}: as good as or better, as asserted"
    else:
        want_up = m.direction == "greater"
        side = "above" if want_up else "below"
        if measured:
            on_side = ci[0] > 1.0 if want_up else ci[1] < 1.0  # type: ignore[index]
            if not (on_side and p < alpha):  # type: ignore[operator]
                pointing = (ratio > 1.0) == want_up and ratio != 1.0
                detail = "points the asserted way" if pointing else "points the other way"
                return NOT_REPRODUCED, (
                    f"the CI is not wholly {side} 1 with p < {alpha:g}: the effect {detail} "
                    "but is not established"
                )
        elif not ((ratio > 1.0) if want_up else (ratio < 1.0)):
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
        return REPRODUCED, f"{holds_why}, within {tol:.0%} of the published {_fmt(m.expected)}x"
    return DIRECTION_ONLY, (
        f"{holds_why}, but {abs(off):.0%} {'above' if off > 0 else 'below'} the published "
        f"{_fmt(m.expected)}x (tolerance {tol:.0%})"
    )


def _record_matches(rec: Measurement, claim: Claim, variant: dict[str, Any]) -> bool:
    m = claim.measure
    return (
        rec.scenario == m.scenario
        and rec.metric == m.metric
        and rec.claim in (None, claim.id)
        and all(rec.variant.get(k) == v for k, v in variant.items())
    )


def _record_samples(claim: Claim, records: list[Measurement]) -> tuple[list[float], list[float], dict[str, Any]]:
    """A's and B's samples: records of the scenario and metric whose variant
    holds each side's key-values, paired by settings (an A/B pair shares
    them).  Records tagged with this claim id come before untagged ones."""
    m = claim.measure
    assert m.a is not None and m.b is not None
    ranked = sorted(records, key=lambda r: r.claim != claim.id)
    pairs: dict[str, list[Measurement | None]] = {}
    for rec in ranked:
        settings_key = json.dumps(rec.settings, sort_keys=True)
        for index, side in enumerate((m.a, m.b)):
            if _record_matches(rec, claim, side.variant):
                slot = pairs.setdefault(settings_key, [None, None])
                if slot[index] is None:
                    slot[index] = rec
    complete = [(k, v) for k, v in pairs.items() if v[0] is not None and v[1] is not None]
    if not complete:
        missing = [s.label for s, i in ((m.a, 0), (m.b, 1)) if not any(v[i] for v in pairs.values())]
        raise _Unmeasurable(
            f"no records of {m.scenario} {m.metric} for {' and '.join(missing) or 'a matched pair'} in this run"
            + (f"; needs {'; '.join(claim.needs)}" if claim.needs else "")
        )
    # The pair with the most repeats is the most informative one.
    _, (rec_a, rec_b) = max(complete, key=lambda kv: min(len(kv[1][0].samples), len(kv[1][1].samples)))  # type: ignore[union-attr]
    assert rec_a is not None and rec_b is not None
    if not rec_a.samples or not rec_b.samples:
        raise _Unmeasurable(f"records of {m.scenario} {m.metric} hold no samples")
    return rec_a.samples, rec_b.samples, rec_a.settings


def _dig(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _as_samples(value: Any) -> list[float] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return [float(value)]
    if isinstance(value, list) and value and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    ):
        return [float(v) for v in value]
    return None


def _extra_values(claim: Claim, records: list[Measurement]) -> tuple[list[float], list[float], dict[str, Any]]:
    m = claim.measure
    assert m.a is not None and m.b is not None
    # Any record of the scenario may carry its model's output (one model
    # serves several claims); records tagged with this claim come first.
    candidates = [
        r
        for r in sorted(records, key=lambda r: r.claim != claim.id)
        if r.scenario == m.scenario and (not m.metric or r.metric == m.metric)
    ]
    if not candidates:
        raise _Unmeasurable(
            f"no records of {m.scenario}{' ' + m.metric if m.metric else ''} in this run"
            + (f"; needs {'; '.join(claim.needs)}" if claim.needs else "")
        )
    for rec in candidates:
        a = _first_present(rec.extra, m.a.paths)
        b = _first_present(rec.extra, m.b.paths)
        if a and b:
            settings = dict(rec.settings)
            settings["extra_paths"] = {"a": a[0], "b": b[0]}
            return a[1], b[1], settings
    raise _Unmeasurable(
        f"records of {m.scenario} carry no numbers at extra.{' | '.join(m.a.paths)} and "
        f"extra.{' | '.join(m.b.paths)} (the scenario's model output has another shape: "
        "update claims/claims.json)"
    )


def _first_present(extra: dict[str, Any], paths: Sequence[str]) -> tuple[str, list[float]] | None:
    for path in paths:
        samples = _as_samples(_dig(extra, path))
        if samples:
            return path, samples
    return None


class _MemslotsModel:
    """Lazy access to host.memslots.model (issue 5): absent or of another
    shape -> the memslot claims are not measurable, with the reason."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], dict[str, Any]] = {}

    def value(self, q: Quantity) -> float:
        table = self._table(q.layout, q.workload)
        structures = table.get("structures")
        if not isinstance(structures, dict) or q.structure not in structures:
            raise _Unmeasurable(
                f"the memslot model's table for {q.layout}/{q.workload} has no structure {q.structure!r}"
            )
        entry = structures[q.structure]
        entry = _plain(entry)
        value = entry.get(q.field) if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Unmeasurable(f"the memslot model gives no number {q.structure}.{q.field} for {q.layout}/{q.workload}")
        return float(value)

    def _table(self, layout_name: str, workload: str) -> dict[str, Any]:
        key = (layout_name, workload)
        if key in self._tables:
            return self._tables[key]
        try:
            model = importlib.import_module("host.memslots.model")
            layout_mod = importlib.import_module("host.memslots.layout")
        except ImportError as exc:
            raise _Unmeasurable(f"the memslot reference model is not available here ({exc})") from exc
        try:
            layout = layout_mod.load_layout(layout_name)
            table = _plain(model.model_table(layout, workload))
        except BadInput as exc:
            raise _Unmeasurable(f"the memslot model refused {layout_name}/{workload}: {exc}") from exc
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            raise _Unmeasurable(f"the memslot model could not compute {layout_name}/{workload}: {exc!r}") from exc
        if not isinstance(table, dict):
            raise _Unmeasurable(f"the memslot model's table for {layout_name}/{workload} is not a mapping")
        self._tables[key] = table
        return table


def _plain(obj: Any) -> Any:
    """A model result as plain dicts, whether it is a dict, a dataclass or an
    object with to_json()."""
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def _ratio(x: float | None) -> str:
    """Ratios with 3 decimals below 10 (1.003x, not 1x)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.2f}" if abs(x) < 100 else f"{x:,.0f}"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None

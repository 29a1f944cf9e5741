"""claims/claims.json read and checked into typed Claims: a card that does
not say what evidence judges it and how is BadInput, one line.  Judges
nothing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json
from memqual.host.judge.claims.model import (
    ANALOGUE,
    DEFAULT_CLAIMS_FILE,
    DEFAULT_MIN_EFFECT,
    DIRECTIONS,
    EVIDENCE_CLASSES,
    LAYOUT_SCENARIO,
    MEASURED,
    MODEL,
    SCHEMA,
    SOURCES,
    SUCCESSOR,
    UNMEASURABLE,
    Accelerator,
    Beside,
    CeilingSpec,
    Claim,
    Evidence,
    Measure,
    Quantity,
    TodayLayouts,
)
from memqual.host.memslots import structures, virtio_layouts

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
    allowed = {
        "none": (UNMEASURABLE,),
        "memslots-layouts": (MODEL,),
        "records": (MEASURED, SUCCESSOR, ANALOGUE),
        "order": (MEASURED,),
    }
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
    summary = str(entry.get("summary", ""))
    if summary.count(". ") + 1 > 2:
        raise BadInput(f"{where}: 'summary' must be at most two sentences (the card shows it at once)")
    return Evidence(
        kind=kind,
        claimed=_require(entry, "claimed", str, where),
        instead=_require(entry, "instead", str, where),
        summary=summary,
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
    if source == "order":
        order = _require(entry, "order", list, where)
        if len(order) < 2 or not all(isinstance(k, str) and k for k in order) or len(set(order)) < len(order):
            raise BadInput(f"{where}: 'order' must list at least two distinct variants, most frequent first")
        return Measure(
            source=source,
            scenario=_require(entry, "scenario", str, where),
            metric=_require(entry, "metric", str, where),
            unit=str(entry.get("unit", "")),
            direction="greater",
            expected=None,
            note=str(entry.get("note", "")),
            reason=str(entry.get("reason", "")),
            order=tuple(order),
            order_key=str(entry.get("order_key", "kind")),
            accelerator=str(entry.get("accelerator", "")),
            min_effect=_number_or_none(entry, "min_effect", where) or 0.0,
        )
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
        input=str(entry.get("input", "")),
        input_label=str(entry.get("input_label", "")),
    )


def _flag(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise BadInput(f"{where}: field {key!r} must be true or false")
    return value

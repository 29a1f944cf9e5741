"""claims/claims.json read and checked into typed Claims: a card that does
not say what evidence judges it and how is BadInput, one line.  The form
is claims.schema.json beside this module (JSON Schema, checked with
jsonschema); here only what a schema cannot say (ids unique, structures the
memslot model knows, a two-sentence summary).  Judges nothing.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json, schema_validator
from memqual.host.judge.claims.model import (
    DEFAULT_CLAIMS_FILE,
    DEFAULT_MIN_EFFECT,
    LAYOUT_SCENARIO,
    SCHEMA,
    Accelerator,
    Beside,
    CeilingSpec,
    Claim,
    Evidence,
    Measure,
    OnHost,
    Quantity,
    TodayLayouts,
)
from memqual.host.memslots import structures, virtio_layouts

# The one description of a valid claims file, shipped beside this module
# (pyproject.toml's package data).
SCHEMA_FILE = Path(__file__).with_name("claims.schema.json")
# The registries this process has found valid, by their content: memqual
# run reads claims.json for each arm's results and at each look, and the
# schema's check took 12 of a load's 13 ms here (the unit tests load it
# some 500 times).
_VALID: set[str] = set()


def load(path: str | Path | None = None) -> list[Claim]:
    """Read and validate a claims file; every problem is a BadInput that
    names the file, the claim and the field."""
    path = Path(path) if path is not None else DEFAULT_CLAIMS_FILE
    data = read_json(path, "claims file", "give claims/claims.json or a file of its form")
    return parse(data, source=str(path))


def parse(data: Any, source: str = "claims") -> list[Claim]:
    check(data, source)
    claims: list[Claim] = []
    seen: set[str] = set()
    for entry in data["claims"]:
        claim = _claim(entry, f"{source}: claim {entry['id']!r}")
        if claim.id in seen:
            raise BadInput(f"{source}: claim id {claim.id!r} appears twice")
        seen.add(claim.id)
        claims.append(claim)
    return claims


def check(data: Any, source: str) -> None:
    """``data`` against claims.schema.json: the first problem as one line
    naming the claim and the field.  A broken rule's own sentence (the
    schema's ``x-message``) is said after the plain type and field errors,
    which come first."""
    import jsonschema

    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise BadInput(f"{source}: schema {got!r} is not {SCHEMA!r}")
    content = _content(data)
    if content in _VALID:
        return
    errors = list(schema_validator(SCHEMA_FILE).iter_errors(data))
    if not errors:
        if content is not None:
            _VALID.add(content)
        return
    plain = [e for e in errors if "x-message" not in e.schema]
    # An unknown field first: a misspelt one also leaves its own field
    # missing, and a rule that reads that field may then ask for another
    # ("clas" for "class" read as a model's evidence without its "inputs").
    unknown = [e for e in plain if e.validator == "additionalProperties" and isinstance(e.instance, dict)]
    # best_match looks inside an anyOf for its closest branch; a rule's own
    # sentence is said whole instead.
    if unknown:
        error = unknown[0]
    else:
        error = jsonschema.exceptions.best_match(plain) if plain else max(errors, key=jsonschema.exceptions.relevance)
    path = list(error.absolute_path)
    where = source
    if len(path) >= 2 and path[0] == "claims":
        entry = data["claims"][path[1]]
        cid = entry.get("id") if isinstance(entry, dict) else None
        where += f": claim {cid!r}" if isinstance(cid, str) else f": claim #{path[1]}"
        path = path[2:]
    field = ".".join(str(p) for p in path)
    if "x-message" in error.schema:
        what = str(error.schema["x-message"])
    elif error.validator == "required":
        missing = next(k for k in error.validator_value if k not in error.instance)
        what = f"missing field {missing!r}"
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        what = _unknown_fields(error.instance, error.schema)
    else:
        what = error.message[:160]
    raise BadInput(f"{where}: {field}: {what}" if field else f"{where}: {what}")


def _content(data: dict[str, Any]) -> str | None:
    """A digest of ``data`` whatever its keys' order, or None for what
    JSON cannot hold (the schema's check says what is wrong with it)."""
    try:
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    except (TypeError, ValueError):
        return None


def _unknown_fields(instance: dict[str, Any], schema: dict[str, Any]) -> str:
    """The fields of ``instance`` its schema does not know, each with the
    known one it is closest to, and the fields the schema knows."""
    allowed = sorted(schema.get("properties", {}))
    patterns = list(schema.get("patternProperties", {}))
    extra = [k for k in instance if k not in allowed and not any(re.search(p, k) for p in patterns)]
    named = []
    for key in extra:
        close = difflib.get_close_matches(key, allowed, n=1)
        named.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return f"unknown field{'s' if len(extra) > 1 else ''} {', '.join(named)}; allowed: {', '.join(allowed)}"


def _claim(entry: dict[str, Any], where: str) -> Claim:
    measure = _measure(entry["measure"])
    return Claim(
        id=entry["id"],
        title=entry["title"],
        seed=entry["seed"],
        quote=entry["quote"],
        published=entry["published"],
        needs=list(entry.get("needs", [])),
        tag=entry.get("tag", ""),
        evidence=_evidence(entry["evidence"], where + " evidence"),
        measure=measure,
        on_host=_on_host(entry.get("on_host"), where + " on_host"),
    )


def _on_host(entry: dict[str, Any] | None, where: str) -> OnHost | None:
    if entry is None:
        return None
    measure = _measure(entry["measure"])
    if measure.source not in ("records", "order"):
        raise BadInput(f"{where}: its measure must be of source 'records' or 'order' (what a host under test recorded)")
    return OnHost(evidence=_evidence(entry["evidence"], where + " evidence"), measure=measure)


def _evidence(entry: dict[str, Any], where: str) -> Evidence:
    summary = entry.get("summary", "")
    if summary.count(". ") + 1 > 2:
        raise BadInput(f"{where}: 'summary' must be at most two sentences (the card shows it at once)")
    accelerator = entry.get("accelerator")
    return Evidence(
        kind=entry["class"],
        claimed=entry["claimed"],
        instead=entry["instead"],
        summary=summary,
        inputs=tuple(entry.get("inputs", [])),
        would_measure=entry.get("would_measure", ""),
        beside=tuple(
            Beside(label=b["label"], scenario=b["scenario"], metric=b["metric"], variant=dict(b.get("variant", {})))
            for b in entry.get("beside", [])
        ),
        accelerator=Accelerator(**accelerator) if accelerator is not None else None,
        today=_today(entry.get("today"), where + " today"),
    )


def _today(entry: dict[str, Any] | None, where: str) -> TodayLayouts | None:
    if entry is None:
        return None
    known = set(structures.STRUCTURES)
    if not all(name in known for name in entry["structures"]):
        raise BadInput(f"{where}: 'structures' must name structures of the memslot model ({', '.join(sorted(known))})")
    return TodayLayouts(
        label=entry["label"],
        scenario=entry["scenario"],
        structures=tuple(entry["structures"]),
        workload=entry.get("workload", "miss"),
        kvm_scenario=entry.get("kvm_scenario", virtio_layouts.KVM_SCENARIO),
    )


def _quantity(entry: dict[str, Any]) -> Quantity:
    published = entry.get("published")
    return Quantity(
        label=entry["label"],
        variant=dict(entry.get("variant", {})),
        structure=entry.get("structure", ""),
        workload=entry.get("workload", ""),
        field=entry.get("field", ""),
        published=None if published is None else float(published),
        published_unit=entry.get("published_unit", ""),
    )


def _measure(entry: dict[str, Any]) -> Measure:
    source = entry["source"]
    if source == "none":
        return Measure(source=source, reason=entry["reason"])
    if source == "order":
        return Measure(
            source=source,
            scenario=entry["scenario"],
            metric=entry["metric"],
            unit=entry.get("unit", ""),
            direction="greater",
            expected=None,
            note=entry.get("note", ""),
            reason=entry.get("reason", ""),
            order=tuple(entry["order"]),
            order_key=entry.get("order_key", "kind"),
            accelerator=entry.get("accelerator", ""),
            where=dict(entry.get("where", {})),
            min_effect=float(entry.get("min_effect") or 0.0),
        )
    expected, min_effect, ceiling = entry.get("expected"), entry.get("min_effect"), entry.get("ceiling")
    return Measure(
        source=source,
        a=_quantity(entry["a"]),
        b=_quantity(entry["b"]),
        scenario=entry.get("scenario", LAYOUT_SCENARIO if source == "memslots-layouts" else ""),
        metric=entry.get("metric", ""),
        unit=entry.get("unit", ""),
        direction=entry["direction"],
        expected=None if expected is None else float(expected),
        tolerance=float(entry["tolerance"]),
        min_effect=DEFAULT_MIN_EFFECT if min_effect is None else float(min_effect),
        note=entry.get("note", ""),
        paired=entry.get("paired", False),
        ceiling=CeilingSpec(
            scenario=ceiling["scenario"],
            metric=ceiling["metric"],
            variant=dict(ceiling.get("variant", {})),
            label=ceiling.get("label", ""),
            input=ceiling.get("input", ""),
            input_label=ceiling.get("input_label", ""),
        )
        if ceiling is not None
        else None,
    )

"""results.json: the typed schema of what a run says, and its one reader and
writer.

``Results``, ``MetricEntry`` and ``ClaimEntry`` are the file as frozen
dataclasses; ``from_json`` and ``to_json`` give back a file key for key,
older ones and unknown keys included.  It holds the raw samples, not only
summaries, since report.html and ``memqual compare`` read it.  The file's
shape and where the environment comes from: docs/claims-and-report.md,
"results.json as host/judge/results.py types it".
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core.environment import FINGERPRINT_KEYS
from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json, schema_validator
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.record import Measurement
from memqual.host.judge.primaries import is_primary

if TYPE_CHECKING:
    from memqual.host.judge.claims.model import Verdict

SCHEMA = "memqual.results/1"
# What a results file may weigh: its schema check costs about 2.7 s a MB
# here (jsonschema), so a larger file is refused before it is read, not
# checked for a minute.
RESULTS_MAX = 8 << 20


class _JsonFields:
    """A frozen dataclass written as a JSON object.

    Its fields, in order, are the JSON keys in the file's order, but for
    the last two: ``missing`` holds the keys the source object lacked (left
    out again by ``to_json``) and ``extra`` the keys this version does not
    know (kept, after the known ones)."""

    missing: frozenset[str]
    extra: Mapping[str, Any]

    @classmethod
    def json_keys(cls) -> tuple[str, ...]:
        """The JSON keys: the fields, so the schema is written once."""
        fields_of: type = cls  # the class itself, hashed for the cache
        return _json_keys(fields_of)

    def to_json(self) -> dict[str, Any]:
        out = {k: _plain(getattr(self, k)) for k in self.json_keys() if k not in self.missing}
        out.update(self.extra)
        return out

    @classmethod
    def _split(cls, data: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
        """The dataclass's arguments from a JSON object: known keys (absent
        ones from ``defaults``, and noted), the rest as ``extra``."""
        keys = cls.json_keys()
        args = {k: data[k] if k in data else defaults.get(k) for k in keys}
        args["missing"] = frozenset(k for k in keys if k not in data)
        args["extra"] = {k: v for k, v in data.items() if k not in keys}
        return args


@functools.cache
def _json_keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("missing", "extra"))


def _plain(value: Any) -> Any:
    if isinstance(value, (_JsonFields, ClaimEntry)):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ----------------------------------------------------------------- entries


@dataclasses.dataclass(frozen=True, eq=True)
class MetricEntry(_JsonFields):
    """One metric of one variant and settings, with its samples."""

    key: str  # metric_key(), with " #2"... when two tests recorded the same one
    scenario: str
    metric: str
    claim: str | None
    unit: str
    better: str  # lower | higher
    variant: dict[str, Any]
    settings: dict[str, Any]
    samples: list[float]
    # Grouped by independent unit (a fresh guest, a round): what `memqual
    # compare` tests.  None in files written before replicates existed.
    replicates: list[list[float]] | None
    summary: dict[str, Any]  # descriptive.summarize(samples).to_json()
    duration_s: float | None
    # The block of each replicate in an interleaved A/B (record.Measurement.blocks);
    # None or [] when unknown (one-sided runs, older files).
    blocks: list[int] | None = None
    # A metric a kernel developer watches: compare's family-wise correction
    # and exit status run over these; the rest is exploratory.  None in
    # files that mark no metric (then every metric counts as primary).
    primary: bool | None = None
    # The clock its record was read with (its environment's): under a
    # run's plan (--clock auto) each scenario's own, so a metric names its
    # clock where a file's clock is a plan.  None in older files: the file's.
    clock: str | None = None
    missing: frozenset[str] = dataclasses.field(default=frozenset(), repr=False, compare=False)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricEntry:
        if isinstance(data, MetricEntry):
            return data
        defaults = {"scenario": "", "metric": "", "variant": {}, "settings": {}, "summary": {}}
        return cls(**cls._split(data, defaults))

    @classmethod
    def of(cls, rec: Measurement, key: str) -> MetricEntry:
        from memqual.host.core import descriptive  # numpy: imported here, keeps `memqual --help` fast

        # The record's own fields under their own names, and what the
        # entry adds: the key and the samples' summary.
        read_with = str(rec.environment.get("clock") or "")
        on_host_under_test = bool(rec.environment.get("host_under_test"))
        added: dict[str, Any] = {
            "key": key,
            "summary": descriptive.summarize(rec.samples).to_json(),
            # On the icount clock, or on a host under test, another metric
            # of a scenario may decide it.
            "primary": is_primary(rec.scenario, rec.metric, rec.variant, read_with, on_host_under_test),
            "clock": read_with or None,
        }
        return cls(**added, **{k: getattr(rec, k) for k in cls.json_keys() if k not in added})


@dataclasses.dataclass(frozen=True, eq=True)
class ClaimEntry:
    """One claim's verdict: what ``claims.Verdict.to_json()`` wrote, whole
    (``data``, for the pages' claim-specific lines), with the fields every
    reader uses typed.  Files written before evidence was named have no
    ``evidence``: None."""

    id: str
    verdict: str
    reason: str
    evidence: dict[str, Any] | None
    data: Mapping[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClaimEntry:
        if isinstance(data, ClaimEntry):
            return data
        return cls(
            id=str(data.get("id", "")),
            verdict=str(data.get("verdict", "")),
            reason=str(data.get("reason", "")),
            evidence=data.get("evidence"),
            data=dict(data),
        )

    @classmethod
    def of(cls, verdict: Verdict) -> ClaimEntry:
        return cls.from_json(verdict.to_json())

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)


@dataclasses.dataclass(frozen=True, eq=True)
class Results(_JsonFields):
    """A whole results.json."""

    schema: str
    memqual_version: str
    created: str  # UTC, 2026-11-30T01:02:03Z
    run: dict[str, Any]  # profile, label, rounds, the avocado summary, tests...
    environment: dict[str, Any]  # environment_fingerprint()
    scenarios: list[str]
    claims: list[ClaimEntry]
    metrics: list[MetricEntry]
    missing: frozenset[str] = dataclasses.field(default=frozenset(), repr=False, compare=False)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Results | Mapping[str, Any]) -> Results:
        """A results object (checked by ``load_results`` when it comes
        from a file); metric and claim entries may already be typed."""
        if isinstance(data, Results):
            return data
        args = cls._split(
            data,
            {"schema": SCHEMA, "memqual_version": "", "created": "", "run": {}, "environment": {}, "scenarios": []},
        )
        args["claims"] = [ClaimEntry.from_json(c) for c in data.get("claims") or []]
        args["metrics"] = [MetricEntry.from_json(m) for m in data.get("metrics") or []]
        return cls(**args)


# ---------------------------------------------------------------- building


def memqual_version() -> str:
    try:
        from importlib.metadata import version

        return version("memqual")
    except Exception:  # not installed (a bare checkout): say so rather than guess
        return "unknown"


def variant_label(variant: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(variant.items())) or "default"


def metric_key(rec: Measurement | Mapping[str, Any]) -> str:
    """Identifies one metric of one variant across runs: what `memqual
    compare` pairs up."""
    # A record's own fields, not its to_json(): a deep copy of every sample
    # for four fields (the bisect keys every record of every step).
    if isinstance(rec, Measurement):
        scenario, metric = rec.scenario, rec.metric
        variant: Mapping[str, Any] = rec.variant or {}
        settings: Mapping[str, Any] = rec.settings or {}
    else:
        scenario, metric = rec["scenario"], rec["metric"]
        variant, settings = rec.get("variant") or {}, rec.get("settings") or {}
    return f"{scenario} {metric} [{variant_label(variant)}] {json.dumps(settings, sort_keys=True)}"


def metrics_of(records: Iterable[Measurement]) -> list[MetricEntry]:
    """A metric entry per record with samples, sorted by key."""
    with_samples = [rec for rec in records if rec.samples]
    # Two tests may record the same metric with the same settings: keep both
    # (in collection order, which follows avocado's test order) as "#2"...
    seen: collections.Counter[str] = collections.Counter()
    out = []
    for rec in with_samples:
        key = metric_key(rec)
        seen[key] += 1
        out.append(MetricEntry.of(rec, key if seen[key] == 1 else f"{key} #{seen[key]}"))
    out.sort(key=lambda m: m.key)
    return out


def environment_fingerprint(records: Sequence[Measurement], *, host_fallback: bool = True) -> dict[str, Any]:
    """The records' environment, one value per key (the most common when
    records disagree, all of them under ``<key>_all``), then this host's
    facts for the keys no record gave."""
    from memqual.host.core import probe  # imported here: the KVM ioctl wrapper it loads would slow `memqual --help`

    values: dict[str, list[str]] = collections.defaultdict(list)
    originals: dict[str, dict[str, Any]] = collections.defaultdict(dict)
    for rec in records:
        for key, value in (rec.environment or {}).items():
            encoded = json.dumps(value, sort_keys=True)
            values[key].append(encoded)
            originals[key][encoded] = value
    env: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, seen in values.items():
        counts = collections.Counter(seen)
        env[key] = originals[key][counts.most_common(1)[0][0]]
        sources[key] = "records"
        if len(counts) > 1:
            env[key + "_all"] = [originals[key][v] for v in counts]
    if host_fallback:
        for key, value in probe.environment(with_ksm=True).to_json().items():
            if key not in env:
                env[key] = value
                sources[key] = "host (no record said)"
    for key in FINGERPRINT_KEYS:
        if key not in env:
            env[key] = None
            sources[key] = "unknown: no record said"
    ordered = {k: env[k] for k in FINGERPRINT_KEYS}
    ordered.update({k: v for k, v in sorted(env.items()) if k not in ordered})
    ordered["environment_sources"] = sources
    return ordered


def build_results(
    verdicts: Sequence[Verdict],
    records: Sequence[Measurement],
    *,
    run: dict[str, Any] | None = None,
    host_fallback: bool = True,
) -> Results:
    return Results(
        schema=SCHEMA,
        memqual_version=memqual_version(),
        created=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        run=run or {},
        environment=environment_fingerprint(records, host_fallback=host_fallback),
        scenarios=sorted({r.scenario for r in records}),
        claims=[ClaimEntry.of(v) for v in verdicts],
        metrics=metrics_of(records),
    )


# -------------------------------------------------------------------- file


def write_results(results: Results | Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    data = Results.from_json(results).to_json()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, (json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n").encode(), 0o644)
    return path


# The one description of a valid results.json, shipped beside this module
# (pyproject.toml's package data) and pinned by tests/data/results.json.
SCHEMA_FILE = Path(__file__).with_name("results.schema.json")


def _validator() -> Any:
    return schema_validator(SCHEMA_FILE)


def check_results(data: Any, source: str) -> None:
    """``data`` (a parsed results.json) against the schema: the first
    problem, where it is, as one BadInput line."""
    import jsonschema

    if not isinstance(data, dict) or "schema" not in data:
        raise BadInput(f"{source}: not a memqual results file (no 'schema')")
    if str(data["schema"]).startswith("memqual.measurement/"):
        raise BadInput(f"{source}: a measurement record, not a results.json (memqual run writes OUTPUT/results.json)")
    if data["schema"] != SCHEMA:
        raise BadInput(f"{source}: schema {data['schema']!r} is not {SCHEMA!r}: written by another memqual version")
    error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top"
        if error.validator == "anyOf" and ("samples" in error.absolute_path or "replicates" in error.absolute_path):
            what = f"{str(error.instance)[:40]} is no sample (0, or a magnitude from 1e-100 to 1e100)"
        else:
            what = error.message[:160]
        raise BadInput(f"{source}: not a valid results file at {where}: {what}: truncated or hand-edited?")
    for m in data["metrics"]:
        blocks, replicates = m.get("blocks"), m.get("replicates")
        if blocks and len(blocks) != len(replicates or [m["samples"]]):
            raise BadInput(f"{source}: metric {m['key']}: {len(blocks)} blocks for {len(replicates or [1])} replicates")


def load_results(path: str | os.PathLike[str]) -> Results:
    """A results.json, checked: missing, truncated, another schema or a
    file that does not follow results.schema.json are BadInput with one
    line."""
    path = Path(path)
    data = read_json(
        path,
        "results file",
        "give OUTPUT/results.json of a memqual run, or re-run memqual run",
        max_bytes=RESULTS_MAX,
    )
    check_results(data, str(path))
    return Results.from_json(data)

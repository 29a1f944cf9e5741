"""The measurement record: the contract between scenarios and the report.

One JSON file per metric per run, ``memqual-<scenario>-<metric>-<variant>.json``,
in the test's output directory; everything the claims and the report say
is computed from them.  ``replicates`` groups samples by independent unit
(a fresh guest or a round); ``settings`` holds only what the scenario set,
measured context goes in ``extra``.  docs/architecture.md,
"host/core/record.py", says why."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json, schema_validator
from memqual.host.core.paths import write_private_atomic

SCHEMA = "memqual.measurement/1"
RECORD_GLOB = "memqual-*.json"


@dataclasses.dataclass
class Measurement:
    scenario: str  # e.g. "ksm.volatile_scan"
    metric: str  # e.g. "pages_per_ksmd_cpu_s"
    unit: str
    better: str  # "lower" or "higher"
    samples: list[float]
    claim: str | None = None  # claim id from claims/claims.json, if any
    variant: dict[str, Any] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # derived figures (ratio, CI, model)
    # The samples grouped by independent unit (fresh guest, round); see the
    # module docstring.  Filled from ``samples`` when not given.
    replicates: list[list[float]] = dataclasses.field(default_factory=list)
    # In an interleaved A/B job: which side ran this record ("A" or "B"),
    # and for each replicate the block it belongs to.  A block is one A run
    # and one B run of the same test, minutes apart; the comparison pairs
    # A's and B's replicates by block so drift between blocks cancels.
    # Empty when the run had one side (or predates blocks).
    arm: str = ""
    blocks: list[int] = dataclasses.field(default_factory=list)
    started: str = dataclasses.field(default_factory=lambda: _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    duration_s: float = 0.0
    schema: str = SCHEMA

    def __post_init__(self) -> None:
        if self.better not in ("lower", "higher"):
            raise ValueError(f"better must be 'lower' or 'higher', not {self.better!r}")
        self.samples = [float(s) for s in self.samples]
        groups = [[float(s) for s in group] for group in self.replicates if len(group)]
        if groups and not self.samples:
            self.samples = [s for group in groups for s in group]
        elif groups and sorted(s for g in groups for s in g) != sorted(self.samples):
            raise ValueError("replicates must hold exactly the samples, grouped by independent unit")
        elif not groups:
            groups = [list(self.samples)] if self.samples else []
        self.replicates = groups
        self.blocks = [int(b) for b in self.blocks]
        if self.blocks and len(self.blocks) != len(self.replicates):
            raise ValueError("blocks must name one block per replicate")
        if self.arm not in ("", "A", "B"):
            raise ValueError(f"arm must be 'A', 'B' or empty, not {self.arm!r}")

    @property
    def n_replicates(self) -> int:
        return len(self.replicates)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "<record>") -> Measurement:
        if not isinstance(data, dict):
            raise BadInput(f"{source}: a JSON {type(data).__name__}, not a measurement record (a JSON object)")
        if data.get("schema") != SCHEMA:
            raise BadInput(
                f"{source}: schema {data.get('schema')!r} is not {SCHEMA!r}: "
                "re-run the scenarios with this memqual version"
            )
        check_record(data, source)
        fields = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in fields})
        except (TypeError, ValueError) as exc:
            raise BadInput(f"{source}: not a complete measurement record ({str(exc)[:160]})") from exc

    def key(self) -> tuple[str, str, str]:
        """Records with the same key and different variants form an A/B pair."""
        return (self.scenario, self.metric, json.dumps(self.settings, sort_keys=True))

    def filename(self) -> str:
        variant = "-".join(f"{k}={v}" for k, v in sorted(self.variant.items())) or "default"
        stem = f"memqual-{self.scenario}-{self.metric}-{variant}"
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", stem)[:200] + ".json"


# The record's types, shipped beside this module (pyproject.toml's package data).
SCHEMA_FILE = Path(__file__).with_name("record.schema.json")


def _validator() -> Any:
    return schema_validator(SCHEMA_FILE)


def check_record(data: dict[str, Any], source: str) -> None:
    """A record's fields against record.schema.json: records come back
    from lab hosts, which are trusted less than the controller, so a
    sample of the wrong type or out of range is one BadInput line, not a
    wrong statistic later."""
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top"
        if error.validator == "anyOf":
            what = f"{str(error.instance)[:40]} is no sample (0, or a magnitude from 1e-100 to 1e100)"
        else:
            what = error.message[:160]
        raise BadInput(f"{source}: not a valid measurement record at {where}: {what}")
    # NaN passes every bound of a schema (it compares false): checked here.
    measured = [*data.get("samples", []), *(s for r in data.get("replicates", []) for s in r)]
    if not all(math.isfinite(x) for x in [*measured, data.get("duration_s", 0.0)]):
        raise BadInput(f"{source}: not a valid measurement record: a sample or the duration is not finite")


def write(record: Measurement, directory: str | os.PathLike[str]) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / record.filename()
    # never a half-written record, never written through a planted link
    write_private_atomic(target, (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode(), 0o644)
    return target


# What one record may weigh: one metric's samples, a few KiB; its schema
# check costs about 2.7 s a MB, as a results file's does.
RECORD_MAX = 8 << 20


def load(path: str | os.PathLike[str]) -> Measurement:
    # NaN only where check_record lets it be: a derived figure in extra.
    data = read_json(path, "record file", "re-run the scenario that writes it", allow_nan=True, max_bytes=RECORD_MAX)
    return Measurement.from_json(data, source=str(path))


def collect(root: str | os.PathLike[str]) -> list[Measurement]:
    """Every record below ``root`` (an Avocado job results dir works)."""
    return [load(p) for p in sorted(Path(root).rglob(RECORD_GLOB))]


def merge_rounds(records: list[Measurement]) -> list[Measurement]:
    """Pool the records of several rounds of the same scenarios (``memqual
    run --rounds``): records of the same scenario, metric, claim, variant
    and settings become one whose samples are all the rounds' samples in
    round order, and whose replicates are every round's replicates in round
    order: a round is an independent unit, so units are concatenated, never
    pooled into one, and a record of one guest per round gives one replicate
    a round.  Derived figures in ``extra`` (a ratio, a model) are the first
    round's, since they were computed from its samples alone; each round's
    samples, replicate count and start time are kept under
    ``extra["rounds"]`` so the spread between rounds stays visible.  A
    record seen once is returned as it is.  Rounds merge only when their
    settings are equal, which is why settings must never hold a measured
    value."""
    groups: dict[tuple[str, ...], list[Measurement]] = {}
    for rec in records:
        key = (
            rec.scenario,
            rec.metric,
            str(rec.claim),
            json.dumps(rec.variant, sort_keys=True),
            json.dumps(rec.settings, sort_keys=True),
        )
        groups.setdefault(key, []).append(rec)
    merged: list[Measurement] = []
    for group in groups.values():
        if len(group) == 1:
            merged.append(group[0])
            continue
        first = group[0]
        extra = dict(first.extra)
        extra["rounds"] = [{"started": r.started, "samples": r.samples, "replicates": r.n_replicates} for r in group]
        extra["derived_from"] = f"round 1 of {len(group)} (samples pool all rounds)"
        merged.append(
            dataclasses.replace(
                first,
                samples=[s for r in group for s in r.samples],
                replicates=[g for r in group for g in r.replicates],
                # blocks stay known only when every round named them
                blocks=[b for r in group for b in r.blocks] if all(r.blocks for r in group) else [],
                duration_s=sum(r.duration_s for r in group),
                extra=extra,
            )
        )
    return merged

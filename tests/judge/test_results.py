"""results.json's typed schema (host/judge/results.py): built from verdicts and
records, written, read back and written again unchanged; older files load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement
from memqual.host.judge import results
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import REPRODUCED
from memqual.host.judge.results import ClaimEntry, MetricEntry, Results


def _records() -> list[Measurement]:
    env = {"host_kernel": "6.18.0", "qemu": "7.2.15", "accel": "tcg"}
    return [
        Measurement(
            scenario="ksm.volatile_scan",
            metric="ksmd_cpu_ns_per_page",
            unit="ns",
            better="lower",
            claim="ksm-volatile-4k",
            settings={"pages_to_scan": 4000},
            variant={"smart_scan": s, "pages": "4k"},
            samples=xs,
            replicates=[[x] for x in xs],
            environment=env,
        )
        for s, xs in ((0, [0.80, 0.82, 0.79, 0.81, 0.80]), (1, [0.10, 0.11, 0.10, 0.105, 0.10]))
    ]


@pytest.fixture()
def built() -> Results:
    recs = _records()
    return results.build_results(evaluate(load(), recs), recs, run={"profile": "quick"}, host_fallback=False)


def test_build_gives_typed_entries(built):
    assert built.schema == results.SCHEMA and built.run == {"profile": "quick"}
    assert built.scenarios == ["ksm.volatile_scan"]
    assert all(isinstance(m, MetricEntry) for m in built.metrics)
    assert all(isinstance(c, ClaimEntry) for c in built.claims)
    m = built.metrics[0]
    assert m.key == results.metric_key(_records()[0])
    assert m.replicates == [[x] for x in m.samples] and m.summary["n"] == 5
    ksm = next(c for c in built.claims if c.id == "ksm-volatile-4k")
    assert ksm.verdict == REPRODUCED and ksm.evidence and ksm.evidence["class"] == "successor"


# A results.json as this schema writes it, kept as data: the schema is pinned
# by a file a reader would meet, not by restating the dataclasses' fields.
GOLDEN = Path(__file__).parents[1] / "data" / "results.json"


def test_the_json_shape_is_the_files(built):
    golden = json.loads(GOLDEN.read_text())
    data = built.to_json()
    assert list(data) == list(golden)
    assert list(data["metrics"][0]) == list(golden["metrics"][0])
    # A claim entry is what the verdict wrote, key for key.
    recs = _records()
    verdicts = evaluate(load(), recs)
    assert data["claims"] == [json.loads(json.dumps(v.to_json())) for v in verdicts]


def test_the_golden_file_is_all_known_keys_and_writes_back_byte_for_byte(tmp_path):
    loaded = results.load_results(GOLDEN)
    entries = [loaded, *loaded.metrics]
    assert all(not e.missing and not e.extra for e in entries), "a key the schema lacks, or one it no longer writes"
    assert results.write_results(loaded, tmp_path / "again.json").read_text() == GOLDEN.read_text()


def test_write_read_write_is_identical(built, tmp_path):
    first = results.write_results(built, tmp_path / "a.json")
    loaded = results.load_results(first)
    assert isinstance(loaded, Results) and loaded == built
    second = results.write_results(loaded, tmp_path / "b.json")
    assert first.read_text() == second.read_text()


def test_the_entries_are_read_through_their_fields_only(built):
    # Typed entries, not mappings: a misspelt field is mypy's error, not a KeyError at run time.
    assert not isinstance(built, Mapping)
    m, c = built.metrics[0], built.claims[0]
    assert not isinstance(m, Mapping) and not isinstance(c, Mapping)
    assert m.to_json()["samples"] == m.samples and c.to_json()["id"] == c.id
    assert MetricEntry.from_json(m.to_json()) == m and ClaimEntry.from_json(c.to_json()) == c


def test_an_old_file_without_replicates_or_evidence_loads_and_stays_as_it_was(built, tmp_path):
    old = built.to_json()
    for m in old["metrics"]:
        del m["replicates"]
    for c in old["claims"]:
        del c["evidence"]
    old["something_later_versions_drop"] = {"x": 1}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old, indent=2) + "\n")
    loaded = results.load_results(path)
    assert all(m.replicates is None and "replicates" in m.missing for m in loaded.metrics)
    assert all(c.evidence is None for c in loaded.claims)
    assert loaded.to_json() == old  # nothing added, nothing lost
    again = results.write_results(loaded, tmp_path / "again.json")
    assert json.loads(again.read_text()) == old


def test_a_dict_with_typed_entries_is_taken_as_results():
    metrics = results.metrics_of(_records())
    r = Results.from_json({"memqual_version": "x", "metrics": metrics, "claims": [], "environment": {}})
    assert r.metrics == metrics and "scenarios" in r.missing


@pytest.mark.parametrize(
    "data, message",
    [
        ({"schema": "memqual.measurement/1"}, "a measurement record, not a results.json"),
        ({"schema": "memqual.results/0"}, "is not 'memqual.results/1'"),
        ({"claims": []}, "no 'schema'"),
        (
            {"schema": "memqual.results/1", "claims": [], "metrics": {}},
            "at the top: 'environment' is a required property",
        ),
        (
            {"schema": "memqual.results/1", "claims": [], "environment": {}, "metrics": [{"key": "k"}]},
            "at metrics/0: 'samples' is a required property",
        ),
        (
            {
                "schema": "memqual.results/1",
                "claims": [],
                "environment": {},
                "metrics": [{"key": "k", "samples": [], "better": "lower", "unit": "s"}],
            },
            r"at metrics/0/samples: \[\] should be non-empty",
        ),
        (
            {"schema": "memqual.results/1", "claims": [3], "environment": {}, "metrics": []},
            "at claims/0: 3 is not of type 'object'",
        ),
    ],
)
def test_what_is_not_a_results_file_is_one_line(data, message, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=message):
        results.load_results(path)


def _golden_with(change: Any) -> dict[str, Any]:
    data = json.loads(GOLDEN.read_text())
    change(data)
    return data


def _samples(value: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        m = data["metrics"][0]
        m["samples"] = [value] * len(m["samples"])
        m["replicates"] = [[value] * len(r) for r in m["replicates"]]

    return change


# What a results file written by hand, by another tool or by a broken one
# may hold, and where the reader must stop it: each case once wrote a wrong
# statistic, an "unexpected" exit 1 or a non-JSON export.
BAD_CONTENT = {
    "boolean samples": (_samples(True), r"metrics/0/samples/\d+: True is no sample"),
    "a sample of 1e308": (_samples(1e308), "1e[+]308 is beyond 1e[+]150"),
    "a subnormal sample": (_samples(1e-310), r"metrics/0/samples/\d+: 1e-310 is no sample"),
    "a list as key": (lambda d: d["metrics"][0].update(key=["k"]), "metrics/0/key: .* is not of type 'string'"),
    "a string as settings": (lambda d: d["metrics"][0].update(settings="x"), "metrics/0/settings: 'x' is not of"),
    "a string as run": (lambda d: d.update(run="quick"), "at run: 'quick' is not of type 'object'"),
    "better sideways": (lambda d: d["metrics"][0].update(better="sideways"), "metrics/0/better: 'sideways'"),
    "blocks of strings": (
        lambda d: d["metrics"][0].update(blocks=["1"] * 5),
        r"metrics/0/blocks/\d+: .1. is not of type .integer.",
    ),
    "primary as a string": (lambda d: d["metrics"][0].update(primary="yes"), "metrics/0/primary"),
    "scenarios of numbers": (lambda d: d.update(scenarios=[1]), "scenarios/0"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONTENT))
def test_a_results_file_of_the_wrong_types_or_range_is_one_line(case, tmp_path):
    change, message = BAD_CONTENT[case]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_golden_with(change)))
    with pytest.raises(BadInput, match=message) as caught:
        results.load_results(path)
    assert len(str(caught.value).splitlines()) == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"schema": "memqual.results/1", "x": ' + "[" * 50000 + "]" * 50000 + "}", "nested deeper than 64"),
        ('{"schema": "memqual.results/1", "x": ' + "[" * 70 + "]" * 70 + "}", "nested deeper than 64"),
        ('{"schema": "memqual.results/1", "x": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ('{"schema": "memqual.results/1", "x": NaN}', "NaN is no number JSON has"),
        ('{"schema": "memqual.results/1", "x": -Infinity}', "-Infinity is no number JSON has"),
        ('{"schema": "memqual.results/1", "x": 1e400}', "1e400 is beyond"),
    ],
    ids=["deep", "deeper-than-memqual", "huge-int", "nan", "infinity", "overflow"],
)
def test_json_no_memqual_file_holds_is_one_line(text, message, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(BadInput, match=message):
        results.load_results(path)


def test_the_golden_file_follows_the_shipped_schema():
    import jsonschema

    schema = json.loads(results.SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads(GOLDEN.read_text()))
    # Every key the schema types for a metric is one the file has: the
    # schema and the dataclass describe the same file.
    golden_metric = json.loads(GOLDEN.read_text())["metrics"][0]
    assert set(schema["$defs"]["metric"]["properties"]) == set(golden_metric)
    assert set(schema["properties"]) == set(json.loads(GOLDEN.read_text()))

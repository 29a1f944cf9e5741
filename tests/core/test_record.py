"""memqual.host.core.record: the measurement record's file round trip and the pooling
of several rounds (memqual run --rounds)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memqual.host.core import record
from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement


def rec(samples: list[float], **kw: Any) -> Measurement:
    fields: dict[str, Any] = {
        "scenario": "ksm.volatile_scan",
        "metric": "ns_per_page",
        "unit": "ns",
        "better": "lower",
        "variant": {"smart_scan": 1},
        "settings": {"pages_to_scan": 4000},
    }
    fields.update(kw)
    return Measurement(samples=samples, **fields)


def test_write_and_load_round_trip(tmp_path):
    path = record.write(rec([1.0, 2.0], extra={"ratio": 3.0}), tmp_path)
    loaded = record.load(path)
    assert loaded.samples == [1.0, 2.0] and loaded.extra == {"ratio": 3.0}
    assert not list(tmp_path.glob("*.tmp"))


def test_another_schema_is_bad_input(tmp_path):
    path = record.write(rec([1.0]), tmp_path)
    path.write_text(path.read_text().replace(record.SCHEMA, "memqual.measurement/0"))
    with pytest.raises(BadInput, match="re-run the scenarios"):
        record.load(path)


def test_merge_rounds_pools_samples_in_round_order():
    rounds = [
        rec([1.0, 1.1], extra={"ratio": 2.0}, duration_s=3.0, started="r1"),
        rec([1.2], extra={"ratio": 9.0}, duration_s=4.0, started="r2"),
    ]
    (merged,) = record.merge_rounds(rounds)
    assert merged.samples == [1.0, 1.1, 1.2]
    assert merged.duration_s == 7.0
    assert merged.extra["ratio"] == 2.0  # derived figures are round 1's ...
    assert merged.extra["rounds"] == [
        {"started": "r1", "samples": [1.0, 1.1], "replicates": 1},
        {"started": "r2", "samples": [1.2], "replicates": 1},
    ]
    assert "round 1 of 2" in merged.extra["derived_from"]  # ... and say so
    assert rounds[0].samples == [1.0, 1.1]  # the inputs are not changed


def test_merge_rounds_keeps_variants_settings_and_claims_apart():
    records = [
        rec([1.0]),
        rec([2.0], variant={"smart_scan": 0}),
        rec([3.0], settings={"pages_to_scan": 100}),
        rec([4.0], claim="ksm-volatile-4k"),
    ]
    merged = record.merge_rounds(records)
    assert sorted(m.samples[0] for m in merged) == [1.0, 2.0, 3.0, 4.0]
    assert all("rounds" not in m.extra for m in merged)


def _record_file(tmp_path, change):
    path = record.write(rec([1.0, 2.0], extra={"ratio": float("nan")}), tmp_path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


# Records come back from lab hosts, which are trusted less than the
# controller: what a scenario never writes is refused at the reader.
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(samples=[True, False]), r"samples/\d+: (True|False) is no sample"),
        (lambda d: d.update(samples=[float("nan")]), "a sample or the duration is not finite"),
        (lambda d: d.update(samples=[1e308, 1.0]), "1e[+]308 is beyond 1e[+]150"),
        (lambda d: d.update(replicates=[[1.0], "x"]), "replicates/1: 'x' is not of type 'array'"),
        (lambda d: d.update(scenario=["a"]), "scenario: .* is not of type 'string'"),
        (lambda d: d.update(settings="pages=4k"), "settings: 'pages=4k' is not of type 'object'"),
        (lambda d: d.update(duration_s=float("inf")), "duration_s"),
        (lambda d: d.update(blocks=[True, False]), r"blocks/\d+: (True|False) is not of type .integer."),
        (lambda d: d.update(arm="C"), "arm: 'C' is not one of"),
    ],
    ids=[
        "booleans",
        "nan",
        "1e308",
        "replicate-string",
        "list-scenario",
        "string-settings",
        "inf-duration",
        "boolean-blocks",
        "arm",
    ],
)
def test_a_record_of_the_wrong_types_or_range_is_one_line(tmp_path, change, message):
    with pytest.raises(BadInput, match=message) as caught:
        record.load(_record_file(tmp_path, change))
    assert "\n" not in str(caught.value)


def test_a_derived_figure_may_be_nan(tmp_path):
    # what scancost and kvm_lookup write when nothing could be computed
    loaded = record.load(_record_file(tmp_path, lambda d: None))
    assert loaded.extra["ratio"] != loaded.extra["ratio"]


def test_a_deeply_nested_record_is_one_line(tmp_path):
    path = tmp_path / "memqual-x.json"
    path.write_text('{"schema": "memqual.measurement/1", "extra": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(BadInput, match="nested deeper than"):
        record.load(path)

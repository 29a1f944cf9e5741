"""memqual.host.record: the measurement record's file round trip and the pooling
of several rounds (memqual run --rounds)."""

from __future__ import annotations

from typing import Any

import pytest

from memqual.host import record
from memqual.host.errors import BadInput
from memqual.host.record import Measurement


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

"""The block spread of an A/B run (lab/block_spread.py): the sd of the
blocks' log(B/A) per metric, its primary marked, from results.json or from
the records of a run stopped before it wrote them."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from memqual.host.core import record
from memqual.host.core.record import Measurement
from memqual.host.judge.results import Results
from memqual.lab import block_spread
from memqual.lab.block_spread import block_spreads


def _entry(key: str, scenario: str, metric: str, values: list[float], variant: dict | None = None) -> dict:
    return {
        "key": key,
        "scenario": scenario,
        "metric": metric,
        "variant": variant or {},
        "replicates": [[v] for v in values],
        "blocks": list(range(1, len(values) + 1)),
    }


def test_block_spread_is_the_sd_of_the_blocks_log_ratios_and_marks_the_primary() -> None:
    a = {
        "environment": {"clock": "icount:4"},
        "metrics": [_entry("m", "ksm.guest_merge", "merged_fraction", [1.0, 2.0, 4.0])],
    }
    b = {
        "environment": {"clock": "icount:4"},
        "metrics": [_entry("m", "ksm.guest_merge", "merged_fraction", [1.0, 2.2, 4.0 * 0.9])],
    }
    (spread,) = block_spreads(a, b)
    expected = [0.0, math.log(1.1), math.log(0.9)]
    assert spread.blocks == 3 and spread.primary and spread.clock == "icount:4"
    assert spread.sd == pytest.approx(statistics.stdev(expected))
    # Typed results, as load_results gives them, spread the same.
    assert block_spreads(Results.from_json(a), Results.from_json(b)) == [spread]
    # An A/A with identical blocks spreads nothing; a single block has no sd.
    (same,) = block_spreads(a, a)
    assert same.sd == 0.0
    one = {"metrics": [_entry("m", "s", "x", [1.0])]}
    assert math.isnan(block_spreads(one, one)[0].sd)


def test_each_arm_s_spread_shows_what_paired_blocks_cancel() -> None:
    """Both arms move together with their blocks' inputs: log(B/A) spreads
    nothing, each arm's own spread over the blocks does; one arm that
    follows its inputs alone spreads the ratio as much as itself."""
    moving = [1.0, 1.1, 0.95, 1.05]
    together = block_spreads(
        {"metrics": [_entry("m", "s", "x", moving)]}, {"metrics": [_entry("m", "s", "x", moving)]}
    )[0]
    assert together.sd == pytest.approx(0.0)
    assert together.sd_a == together.sd_b == pytest.approx(statistics.stdev([math.log(v) for v in moving]))
    alone = block_spreads(
        {"metrics": [_entry("m", "s", "x", [1.0] * 4)]}, {"metrics": [_entry("m", "s", "x", moving)]}
    )[0]
    assert alone.sd_a == 0.0 and alone.sd == pytest.approx(alone.sd_b) and alone.sd > 0.03
    assert "sd log A" in block_spread.table([alone])[0] and alone.to_json()["sd_log_a"] == 0.0


def test_block_spread_reads_a_stopped_runs_job_records_by_arm_and_block(tmp_path, capsys) -> None:
    test_results = tmp_path / "avocado" / "job-1" / "test-results"
    values = {("A", 1): 30.0, ("B", 1): 33.0, ("A", 2): 29.0, ("B", 2): 29.0 * 0.95}
    for (arm, block), value in values.items():
        found = Measurement(
            scenario="balloon.inflate", metric="inflate_guest_s", unit="s", better="lower", samples=[value]
        )
        found.environment["clock"] = "icount:4"
        record.write(found, test_results / f"{block}-e2e_test_balloon.py_T.test_x_b{block}-{arm}" / "data")
    assert block_spread.main([str(tmp_path), "--jobs", "--json"]) == 0
    (spread,) = json.loads(capsys.readouterr().out)
    assert spread["blocks"] == 2 and spread["primary"] and spread["clock"] == "icount:4"
    assert spread["sd_log_ratio"] == pytest.approx(statistics.stdev([math.log(1.1), math.log(0.95)]), abs=1e-6)
    # The arms' results for memqual compare.
    assert block_spread.main([str(tmp_path), "--jobs", "--write", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    written = json.loads((tmp_path / "out" / "B" / "results.json").read_text())
    assert [m["replicates"] for m in written["metrics"]] == [[[33.0], [29.0 * 0.95]]]
    # Without the records there is nothing to read: one line, exit 2.
    assert block_spread.main([str(tmp_path / "none"), "--jobs"]) == 2

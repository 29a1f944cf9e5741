"""The memslot model's lookup benchmark (lab/memslots_bench.py): every
structure timed, summaries consistent."""

from __future__ import annotations

import json

from memqual.host.memslots.structures import STRUCTURES
from memqual.lab import memslots_bench


def test_bench_times_every_structure_with_a_spread():
    results = memslots_bench.run_bench("seed-32", ["miss"], repeats=3, batch=50)
    assert [r.structure for r in results] == ["call", *STRUCTURES]
    for result in results:
        row = result.summary()
        assert len(result.samples_us) == 3
        assert 0 < row["min_us"] <= row["q1_us"] <= row["median_us"] <= row["q3_us"] <= row["max_us"]


def test_bench_json_and_bad_arguments(capsys):
    assert memslots_bench.main(["--repeats", "2", "--batch", "20", "--workload", "small-hits", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {row["workload"] for row in doc["results"]} == {"small-hits"}
    assert memslots_bench.main(["--repeats", "1"]) == 2
    assert memslots_bench.main(["--layout", "seed-0", "--repeats", "2"]) == 2
    assert "unknown layout 'seed-0'" in capsys.readouterr().err

"""memqual.host.core.record.merge_rounds on replicates: rounds are independent units,
and only records whose settings hold what was set merge at all."""

from __future__ import annotations

from memqual.host.core import record
from memqual.host.core.record import Measurement
from memqual.host.judge.stats import permutation


def _rec(replicates: list[list[float]], settings: dict | None = None, started: str = "r") -> Measurement:
    return Measurement(
        scenario="balloon.deflate",
        metric="deflate_s",
        unit="s",
        better="lower",
        samples=[],
        replicates=replicates,
        settings=settings or {"guest_mib": 1024},
        started=started,
    )


def test_a_record_of_one_guest_is_one_replicate_a_round():
    rounds = [
        _rec([[0.20, 0.21, 0.19]], started="r1"),
        _rec([[0.22, 0.23]], started="r2"),
        _rec([[0.18, 0.2]], started="r3"),
    ]
    (merged,) = record.merge_rounds(rounds)
    assert merged.replicates == [[0.20, 0.21, 0.19], [0.22, 0.23], [0.18, 0.2]]
    assert merged.n_replicates == 3 and len(merged.samples) == 7
    assert [r["replicates"] for r in merged.extra["rounds"]] == [1, 1, 1]


def test_replicates_within_a_round_stay_units_across_rounds():
    # A scenario with a fresh guest per sample: each sample its own unit.
    rounds = [_rec([[1.0], [1.1]], started="r1"), _rec([[1.2], [0.9], [1.05]], started="r2")]
    (merged,) = record.merge_rounds(rounds)
    assert merged.replicates == [[1.0], [1.1], [1.2], [0.9], [1.05]]
    assert [r["replicates"] for r in merged.extra["rounds"]] == [2, 3]


def test_a_measured_value_in_settings_keeps_rounds_apart():
    # Why settings hold only what was set: the balloon scenario once keyed
    # its records by the inflate size it measured, so no two rounds merged
    # and each stayed one unmergeable unit.
    rounds = [
        _rec([[0.2]], {"guest_mib": 1024, "inflate_mib": 781.8}),
        _rec([[0.21]], {"guest_mib": 1024, "inflate_mib": 784.3}),
    ]
    assert len(record.merge_rounds(rounds)) == 2


def test_merged_rounds_feed_the_replicate_statistics():
    a = record.merge_rounds([_rec([[1.00, 1.01]]), _rec([[0.99, 1.0]]), _rec([[1.01, 1.02]])])[0]
    b = record.merge_rounds([_rec([[1.10, 1.11]]), _rec([[1.09, 1.12]]), _rec([[1.11, 1.1]])])[0]
    assert (len(a.replicates), len(b.replicates)) == (3, 3)
    assert permutation.replicate_permutation_test(a.replicates, b.replicates).p_value == 0.1
    assert permutation.min_attainable_p(3, 3) == 0.1  # not below 0.05: 3 a side cannot show it


def test_the_round_trip_through_a_file_keeps_the_replicates(tmp_path):
    path = record.write(_rec([[1.0, 1.1], [1.2]]), tmp_path)
    assert record.load(path).replicates == [[1.0, 1.1], [1.2]]

"""memqual.host.judge.stats on synthetic samples whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memqual.host.core import descriptive
from memqual.host.judge.stats import binomial, intervals, permutation


def test_location_and_spread_of_a_known_sample():
    s = descriptive.summarize([1, 2, 3, 4, 100])
    assert s.n == 5
    assert s.median == 3.0
    assert s.mean == 22.0
    assert s.iqr == 2.0  # 25th percentile 2, 75th 4
    assert s.mad == 1.0  # |deviations| 2,1,0,1,97 -> median 1
    assert s.minimum == 1 and s.maximum == 100
    assert s.stdev == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))
    assert s.cv == pytest.approx(s.stdev / 22.0)


def test_cv_edge_cases():
    assert descriptive.cv([5.0]) == 0.0
    assert descriptive.cv([2.0, 2.0, 2.0]) == 0.0
    assert math.isnan(descriptive.cv([-1.0, 1.0]))


def test_empty_or_non_finite_samples_are_refused():
    with pytest.raises(ValueError):
        descriptive.summarize([])
    with pytest.raises(ValueError):
        descriptive.summarize([1.0, float("nan")])


def _normal(seed: int, n: int, loc: float, scale: float) -> list[float]:
    return list(np.random.default_rng(seed).normal(loc, scale, n))


def test_exact_permutation_p_value_for_fully_separated_5_vs_5():
    # 10 choose 5 = 252 splits; only the observed one and its mirror are as
    # extreme, so the exact two-sided p is 2/252.
    p = permutation.permutation_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]).p_value
    assert p == pytest.approx(2 / 252)


def test_constant_samples_give_p_one():
    assert permutation.permutation_test([3.0, 3.0], [3.0, 3.0]).p_value == 1.0


# --- replicates: independent units, their samples nested in them ----------


def _reps(seed: int, n_reps: int, per_rep: int, loc: float, between: float, within: float) -> list[list[float]]:
    """n_reps units, each with its own offset (between-unit noise, relative)
    and per_rep samples around it (within-unit noise, relative)."""
    rng = np.random.default_rng(seed)
    return [list(loc * (1 + rng.normal(0, between)) * (1 + rng.normal(0, within, per_rep))) for _ in range(n_reps)]


def test_exact_permutation_p_for_separated_3_vs_3_is_one_tenth():
    # C(6, 3) = 20 splits; the observed one and its mirror are the extremes.
    res = permutation.permutation_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert res.exact and res.n_arrangements == 20
    assert res.p_value == pytest.approx(0.1)
    rep = permutation.replicate_permutation_test([[1.0, 1.1], [2.0], [3.0, 2.9, 3.1]], [[4.0], [5.0], [6.0]])
    assert rep.p_value == pytest.approx(0.1)  # one median per unit is what is permuted


def test_8_vs_8_is_exact_when_the_budget_allows_and_says_monte_carlo_otherwise():
    a, b = list(range(8)), list(range(8, 16))
    exact = permutation.permutation_test(a, b, n_resamples=20000)
    assert exact.exact and exact.n_arrangements == 12870
    assert exact.p_value == pytest.approx(2 / 12870)
    assert "exact (12870 arrangements)" in exact.method
    mc = permutation.permutation_test(a, b, n_resamples=9999)
    assert not mc.exact and "Monte Carlo" in mc.method
    assert 1 / 10000 <= mc.p_value < 10 / 10000  # never 0: (1 + hits) / (1 + n)


def test_exact_p_is_independent_of_the_seed_and_monte_carlo_is_seeded():
    a, b = _normal(11, 6, 10.0, 1.0), _normal(12, 6, 10.5, 1.0)
    assert permutation.permutation_test(a, b, seed=1) == permutation.permutation_test(a, b, seed=2)
    a, b = _normal(13, 9, 10.0, 1.0), _normal(14, 9, 10.5, 1.0)
    first = permutation.permutation_test(a, b, n_resamples=2000, seed=3)
    assert first == permutation.permutation_test(a, b, n_resamples=2000, seed=3)
    assert not first.exact


def test_min_attainable_p():
    assert permutation.min_attainable_p(3, 3) == pytest.approx(0.1)
    assert permutation.min_attainable_p(2, 2) == pytest.approx(1 / 3)
    assert permutation.min_attainable_p(4, 4) == pytest.approx(2 / 70)  # 0.029 > 0.01
    assert permutation.min_attainable_p(5, 5) == pytest.approx(2 / 252)
    assert permutation.min_attainable_p(1, 3) == pytest.approx(1 / 4)  # no mirror split
    assert permutation.min_attainable_p(8, 8, n_resamples=9999) == pytest.approx(1 / 10000)


def test_holm_matches_the_textbook():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04;
    # the running maximum makes the last 0.06.
    assert permutation.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert permutation.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert permutation.holm([]) == []
    adjusted = permutation.holm([0.001, 0.2, 0.0001, 0.04, 0.03])
    order = np.argsort([0.001, 0.2, 0.0001, 0.04, 0.03])
    assert list(np.diff(np.array(adjusted)[order]) >= 0) == [True] * 4  # monotone


def test_hierarchical_ci_sees_the_noise_between_units():
    # A/A with 1 % noise between guests and 0.1 % inside each: the flat
    # bootstrap, taking 40 samples as independent (each its own unit), is
    # too narrow; the two-stage one is as wide as the units' spread and
    # covers 1.
    a = _reps(21, 5, 8, 100.0, 0.01, 0.001)
    b = _reps(22, 5, 8, 100.0, 0.01, 0.001)
    flat = intervals.hierarchical_ratio_ci([[x] for r in a for x in r], [[x] for r in b for x in r])
    low, high = intervals.hierarchical_ratio_ci(a, b)
    assert high - low > 2 * (flat[1] - flat[0])
    assert low <= 1.0 <= high
    assert intervals.hierarchical_ratio_ci(a, b, seed=5) == intervals.hierarchical_ratio_ci(a, b, seed=5)


def test_hierarchical_ci_with_one_replicate_a_side_is_within_unit():
    low, high = intervals.hierarchical_ratio_ci([[10.0, 10.1, 9.9, 10.0]], [[20.0, 20.2, 19.8, 20.0]])
    assert 1.95 < low <= 2.0 <= high < 2.05
    assert all(math.isnan(x) for x in intervals.hierarchical_ratio_ci([[0.0, 0.0]], [[1.0, 2.0]]))


def test_hierarchical_ci_handles_units_of_different_sizes():
    a = [[10.0, 10.2, 9.8], [10.1], [9.9, 10.0, 10.1, 10.05, 9.95]]
    b = [[15.0, 15.3], [15.1, 14.9, 15.2], [14.8]]
    low, high = intervals.hierarchical_ratio_ci(a, b)
    assert 1.4 < low <= intervals.pooled_ratio(a, b) <= high < 1.6


def test_many_samples_in_one_unit_are_still_one_unit():
    # 40 samples from one guest each side: tightly 2 % apart, but one unit a
    # side can never be significant.
    a = _reps(51, 1, 40, 100.0, 0.0, 0.001)
    b = _reps(52, 1, 40, 102.0, 0.0, 0.001)
    assert permutation.replicate_permutation_test(a, b).p_value == 1.0


def test_replicate_level_test_enumerates_8_vs_8_by_default():
    a = _reps(61, 8, 3, 100.0, 0.01, 0.002)
    b = _reps(62, 8, 3, 110.0, 0.01, 0.002)
    res = permutation.replicate_permutation_test(a, b)
    assert "exact (12870 arrangements)" in res.method
    assert res.p_value == pytest.approx(2 / 12870)
    assert permutation.min_attainable_p(8, 8, permutation.DEFAULT_PERMUTATIONS) == pytest.approx(2 / 12870)


def test_median_ci_brackets_the_pooled_median() -> None:
    reps = [[10.0, 11.0, 12.0], [9.0, 10.0, 11.0], [10.5, 11.5, 12.5]]
    low, high = intervals.median_ci(reps, seed=5)
    assert low <= 11.0 <= high and 9.0 <= low and high <= 12.5


def test_clopper_pearson_matches_the_closed_forms() -> None:
    # k = 0: the upper end is 1 - (alpha/2)^(1/n); k = n mirrors it.
    low, high = binomial.clopper_pearson(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-9)
    low, high = binomial.clopper_pearson(10, 10)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 10), rel=1e-9)
    low, high = binomial.clopper_pearson(4, 150)
    assert 0.007 < low < 0.0267 < high < 0.07


def test_a_summary_writes_no_figure_its_reader_refuses():
    # Readable samples whose mean is near 0: their CV (3e200) is past what
    # a results file may hold, so it is written as "not known".
    from memqual.host.core.descriptive import Summary, summarize
    from memqual.host.core.jsonfile import MAX_MAGNITUDE

    written = summarize([1e100, -1e100, 1e-100]).to_json()
    assert written["cv"] is None
    assert written["stdev"] == 1e100 and written["stdev"] <= MAX_MAGNITUDE
    assert Summary.from_json(written).stdev == 1e100

"""memqual.host.judge.stats on synthetic samples whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memqual.host.judge import stats
from memqual.host.judge.stats import binomial


def test_location_and_spread_of_a_known_sample():
    s = stats.summarize([1, 2, 3, 4, 100])
    assert s.n == 5
    assert s.median == 3.0
    assert s.mean == 22.0
    assert s.iqr == 2.0  # 25th percentile 2, 75th 4
    assert s.mad == 1.0  # |deviations| 2,1,0,1,97 -> median 1
    assert s.minimum == 1 and s.maximum == 100
    assert s.stdev == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))
    assert s.cv == pytest.approx(s.stdev / 22.0)


def test_cv_edge_cases():
    assert stats.cv([5.0]) == 0.0
    assert stats.cv([2.0, 2.0, 2.0]) == 0.0
    assert math.isnan(stats.cv([-1.0, 1.0]))


def test_empty_or_non_finite_samples_are_refused():
    with pytest.raises(ValueError):
        stats.summarize([])
    with pytest.raises(ValueError):
        stats.summarize([1.0, float("nan")])


def _normal(seed: int, n: int, loc: float, scale: float) -> list[float]:
    return list(np.random.default_rng(seed).normal(loc, scale, n))


def test_identical_distributions_give_a_large_p_and_a_ci_around_one():
    a = _normal(1, 8, 100.0, 2.0)
    b = _normal(2, 8, 100.0, 2.0)
    c = stats.compare(a, b)
    assert c.p_value > 0.05
    assert c.ci_low <= 1.0 <= c.ci_high
    assert not c.significant
    assert c.direction == 0


def test_a_doubling_gives_a_ratio_ci_around_two_and_a_small_p():
    a = _normal(3, 8, 100.0, 2.0)
    b = _normal(4, 8, 200.0, 4.0)
    c = stats.compare(a, b)
    assert 1.9 < c.ci_low <= c.ratio <= c.ci_high < 2.1
    assert c.p_value < 0.01
    assert c.significant and c.direction == 1


def test_a_halving_is_a_negative_direction():
    a = [10.0, 10.2, 9.9, 10.1, 10.0]
    b = [5.0, 5.1, 4.9, 5.05, 5.0]
    c = stats.compare(a, b)
    assert c.ratio == pytest.approx(0.5)
    assert c.direction == -1


def test_exact_permutation_p_value_for_fully_separated_5_vs_5():
    # 10 choose 5 = 252 splits; only the observed one and its mirror are as
    # extreme, so the exact two-sided p is 2/252.
    p = stats.permutation_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]).p_value
    assert p == pytest.approx(2 / 252)


def test_a_real_but_tiny_shift_is_not_significant_under_min_effect():
    a = [100.0, 100.1, 100.2, 100.1, 100.0, 100.2]
    b = [101.0, 101.1, 101.2, 101.1, 101.0, 101.2]
    c = stats.compare(a, b, min_effect=0.05)
    assert c.p_value < 0.01  # the shift is real...
    assert not c.significant  # ...but 1 % is below the 5 % minimum effect
    assert stats.compare(a, b, min_effect=0.005).significant


def test_results_are_deterministic_with_a_seed():
    a = _normal(5, 7, 10.0, 3.0)
    b = _normal(6, 7, 12.0, 3.0)
    first = stats.compare(a, b, seed=7)
    second = stats.compare(a, b, seed=7)
    assert first == second
    # The seed is really used: a few other seeds move the (discrete)
    # percentile bounds of a small bootstrap.
    others = {stats.bootstrap_ratio_ci(a, b, seed=s, n_resamples=99) for s in range(8, 14)}
    assert len(others) > 1


def test_constant_samples_give_a_point_interval_and_p_one():
    c = stats.compare([4.0, 4.0, 4.0], [8.0, 8.0, 8.0])
    assert (c.ci_low, c.ratio, c.ci_high) == (2.0, 2.0, 2.0)
    assert stats.permutation_test([3.0, 3.0], [3.0, 3.0]).p_value == 1.0


def test_single_sample_side_still_gets_an_interval():
    low, high = stats.bootstrap_ratio_ci([10.0], [18.0, 20.0, 22.0, 19.0, 21.0])
    assert 1.8 <= low <= 2.0 <= high <= 2.2


def test_zero_median_in_a_gives_no_finite_ratio_and_json_null():
    c = stats.compare([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    assert math.isinf(c.ratio)
    data = c.to_json()
    assert data["ratio"] is None
    assert not c.significant


def test_a_single_repeat_gives_no_evidence():
    assert stats.compare([1.0], [5.0, 5.1, 5.2]).p_value == 1.0
    c = stats.compare([1.0], [2.0])
    assert c.ratio == 2.0 and not c.significant


# --- replicates: independent units, their samples nested in them ----------


def _reps(seed: int, n_reps: int, per_rep: int, loc: float, between: float, within: float) -> list[list[float]]:
    """n_reps units, each with its own offset (between-unit noise, relative)
    and per_rep samples around it (within-unit noise, relative)."""
    rng = np.random.default_rng(seed)
    return [list(loc * (1 + rng.normal(0, between)) * (1 + rng.normal(0, within, per_rep))) for _ in range(n_reps)]


def test_exact_permutation_p_for_separated_3_vs_3_is_one_tenth():
    # C(6, 3) = 20 splits; the observed one and its mirror are the extremes.
    res = stats.permutation_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert res.exact and res.n_arrangements == 20
    assert res.p_value == pytest.approx(0.1)
    rep = stats.replicate_permutation_test([[1.0, 1.1], [2.0], [3.0, 2.9, 3.1]], [[4.0], [5.0], [6.0]])
    assert rep.p_value == pytest.approx(0.1)  # one median per unit is what is permuted


def test_8_vs_8_is_exact_when_the_budget_allows_and_says_monte_carlo_otherwise():
    a, b = list(range(8)), list(range(8, 16))
    exact = stats.permutation_test(a, b, n_resamples=20000)
    assert exact.exact and exact.n_arrangements == 12870
    assert exact.p_value == pytest.approx(2 / 12870)
    assert "exact (12870 arrangements)" in exact.method
    mc = stats.permutation_test(a, b, n_resamples=9999)
    assert not mc.exact and "Monte Carlo" in mc.method
    assert 1 / 10000 <= mc.p_value < 10 / 10000  # never 0: (1 + hits) / (1 + n)


def test_exact_p_is_independent_of_the_seed_and_monte_carlo_is_seeded():
    a, b = _normal(11, 6, 10.0, 1.0), _normal(12, 6, 10.5, 1.0)
    assert stats.permutation_test(a, b, seed=1) == stats.permutation_test(a, b, seed=2)
    a, b = _normal(13, 9, 10.0, 1.0), _normal(14, 9, 10.5, 1.0)
    first = stats.permutation_test(a, b, n_resamples=2000, seed=3)
    assert first == stats.permutation_test(a, b, n_resamples=2000, seed=3)
    assert not first.exact


def test_min_attainable_p_and_replicates_needed():
    assert stats.min_attainable_p(3, 3) == pytest.approx(0.1)
    assert stats.min_attainable_p(2, 2) == pytest.approx(1 / 3)
    assert stats.min_attainable_p(4, 4) == pytest.approx(2 / 70)  # 0.029 > 0.01
    assert stats.min_attainable_p(5, 5) == pytest.approx(2 / 252)
    assert stats.min_attainable_p(1, 3) == pytest.approx(1 / 4)  # no mirror split
    assert stats.min_attainable_p(8, 8, n_resamples=9999) == pytest.approx(1 / 10000)
    assert stats.replicates_needed(0.05) == 4
    assert stats.replicates_needed(0.01) == 5
    assert stats.replicates_needed(0.01 / 30) == 8  # 2/3432 > 3.3e-4 > 2/12870
    assert stats.replicates_needed(0.0) is None


def test_holm_matches_the_textbook():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04;
    # the running maximum makes the last 0.06.
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []
    adjusted = stats.holm([0.001, 0.2, 0.0001, 0.04, 0.03])
    order = np.argsort([0.001, 0.2, 0.0001, 0.04, 0.03])
    assert list(np.diff(np.array(adjusted)[order]) >= 0) == [True] * 4  # monotone


def test_hierarchical_ci_sees_the_noise_between_units():
    # A/A with 1 % noise between guests and 0.1 % inside each: the flat
    # bootstrap, taking 40 samples as independent, is too narrow; the
    # two-stage one is as wide as the units' spread and covers 1.
    a = _reps(21, 5, 8, 100.0, 0.01, 0.001)
    b = _reps(22, 5, 8, 100.0, 0.01, 0.001)
    flat = stats.bootstrap_ratio_ci([x for r in a for x in r], [x for r in b for x in r])
    low, high = stats.hierarchical_ratio_ci(a, b)
    assert high - low > 2 * (flat[1] - flat[0])
    assert low <= 1.0 <= high
    assert stats.hierarchical_ratio_ci(a, b, seed=5) == stats.hierarchical_ratio_ci(a, b, seed=5)


def test_hierarchical_ci_with_one_replicate_a_side_is_within_unit_and_says_so():
    low, high = stats.hierarchical_ratio_ci([[10.0, 10.1, 9.9, 10.0]], [[20.0, 20.2, 19.8, 20.0]])
    assert 1.95 < low <= 2.0 <= high < 2.05
    c = stats.compare_replicates([[10.0, 10.1, 9.9, 10.0]], [[20.0, 20.2, 19.8, 20.0]])
    assert c.ci_method.startswith("within-unit only")
    assert c.underpowered and not c.significant
    assert all(math.isnan(x) for x in stats.hierarchical_ratio_ci([[0.0, 0.0]], [[1.0, 2.0]]))


def test_hierarchical_ci_handles_units_of_different_sizes():
    a = [[10.0, 10.2, 9.8], [10.1], [9.9, 10.0, 10.1, 10.05, 9.95]]
    b = [[15.0, 15.3], [15.1, 14.9, 15.2], [14.8]]
    low, high = stats.hierarchical_ratio_ci(a, b)
    assert 1.4 < low <= stats.pooled_ratio(a, b) <= high < 1.6


def test_compare_replicates_flags_a_10_percent_slowdown_with_5_units_a_side():
    a = _reps(31, 5, 8, 100.0, 0.01, 0.005)
    b = _reps(32, 5, 8, 110.0, 0.01, 0.005)
    c = stats.compare_replicates(a, b, alpha=0.01, min_effect=0.05)
    assert (c.n_replicates_a, c.n_replicates_b) == (5, 5)
    assert c.p_value == pytest.approx(2 / 252) and "exact (252" in c.p_method
    assert not c.underpowered and c.replicates_needed == 5
    assert c.ci_low > 1.05 and c.significant and c.direction == 1
    data = c.to_json()
    for key in ("n_replicates_a", "n_replicates_b", "underpowered", "replicates_needed", "p_method", "ci_method"):
        assert key in data


def test_compare_replicates_with_2_units_a_side_is_underpowered():
    a = _reps(41, 2, 8, 100.0, 0.01, 0.005)
    b = _reps(42, 2, 8, 150.0, 0.01, 0.005)
    c = stats.compare_replicates(a, b, alpha=0.01, min_effect=0.0)
    assert c.underpowered and c.min_attainable_p == pytest.approx(1 / 3)
    assert c.replicates_needed == 5
    assert not c.significant  # a 50 % change, but two units a side cannot show it


def test_many_samples_in_one_unit_are_still_one_unit():
    # 40 samples from one guest each side: tightly 2 % apart, but one unit a
    # side can never be significant.
    a = _reps(51, 1, 40, 100.0, 0.0, 0.001)
    b = _reps(52, 1, 40, 102.0, 0.0, 0.001)
    c = stats.compare_replicates(a, b, alpha=0.05, min_effect=0.0)
    assert c.p_value == 1.0 and c.underpowered and not c.significant


def test_replicate_level_test_enumerates_8_vs_8_by_default():
    a = _reps(61, 8, 3, 100.0, 0.01, 0.002)
    b = _reps(62, 8, 3, 110.0, 0.01, 0.002)
    c = stats.compare_replicates(a, b)
    assert "exact (12870 arrangements)" in c.p_method
    assert c.p_value == pytest.approx(2 / 12870)
    assert c.min_attainable_p == pytest.approx(2 / 12870)


def test_paired_ci_needs_both_sides_of_every_unit() -> None:
    with pytest.raises(ValueError):
        stats.paired_ratio_ci([])
    with pytest.raises(ValueError):
        stats.paired_ratio_ci([([1.0], [1.0]), ([], [2.0])])


def test_paired_ci_sees_a_shift_that_unit_load_hides_unpaired() -> None:
    # Each unit's load scales both of its sides; B is 10 % above A in every unit.
    loads = [1.0, 2.0, 0.5, 1.5, 0.8, 1.2]
    a = [[load * (1 + 0.002 * i) for i in range(5)] for load in loads]
    b = [[1.1 * x for x in rep] for rep in a]
    paired = stats.paired_ratio_ci(list(zip(a, b, strict=True)), seed=3)
    unpaired = stats.hierarchical_ratio_ci(a, b, seed=3)
    assert 1.05 < paired[0] <= 1.1 <= paired[1] < 1.15
    assert unpaired[1] - unpaired[0] > 4 * (paired[1] - paired[0])


def test_median_ci_brackets_the_pooled_median() -> None:
    reps = [[10.0, 11.0, 12.0], [9.0, 10.0, 11.0], [10.5, 11.5, 12.5]]
    low, high = stats.median_ci(reps, seed=5)
    assert low <= 11.0 <= high and 9.0 <= low and high <= 12.5


def test_clopper_pearson_matches_the_closed_forms() -> None:
    # k = 0: the upper end is 1 - (alpha/2)^(1/n); k = n mirrors it.
    low, high = binomial.clopper_pearson(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-9)
    low, high = binomial.clopper_pearson(10, 10)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 10), rel=1e-9)
    low, high = binomial.clopper_pearson(4, 150)
    assert 0.007 < low < 0.0267 < high < 0.07

"""Permutation tests on replicate medians with their power floor, the exact
sign-flip test of paired units, Holm, and ``Comparison``: A against B as
the claims decide it (ratio, interval, p, and whether the counts can reach
alpha at all).  The A/B decisions of ``memqual compare`` are ab_tests.py's.
Every random choice is seeded; no I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from memqual.host.core.descriptive import Samples, Summary, as_array, finite_or_none, ratio_of_medians, summarize
from memqual.host.judge.stats.intervals import (
    CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    bootstrap_ratio_ci,
    ci_method,
    hierarchical_ratio_ci,
    replicate_arrays,
    replicate_medians,
)

# Permutations of replicate medians are cheap (a few numbers each), so the
# budget is large enough to enumerate every split up to 10 against 10
# (184756): a Monte Carlo p near a Holm-corrected level would otherwise
# decide a verdict by its own sampling noise.
DEFAULT_PERMUTATIONS = 200_000
DEFAULT_ALPHA = 0.01
DEFAULT_MIN_EFFECT = 0.05


@dataclasses.dataclass(frozen=True)
class PermutationResult:
    """A two-sided permutation test and how it was computed."""

    p_value: float
    exact: bool  # every arrangement enumerated (else Monte Carlo)
    n_arrangements: int  # C(na + nb, na)
    n_resamples: int  # arrangements evaluated: all of them when exact

    @property
    def method(self) -> str:
        if self.exact:
            return f"exact ({self.n_arrangements} arrangements)"
        return f"Monte Carlo ({self.n_resamples} of {self.n_arrangements} arrangements)"


def permutation_test(
    a: Samples,
    b: Samples,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> PermutationResult:
    """Two-sided permutation test of mean(B) - mean(A) on the values given.

    Exact when C(na + nb, na) <= n_resamples: every split of the pooled
    values into groups of na and nb is enumerated (itertools.combinations)
    and p is the share at least as extreme as the observed one.  Otherwise
    n_resamples random splits, and p = (1 + hits) / (1 + n_resamples), so a
    Monte Carlo p is never 0 (Phipson and Smyth 2010)."""
    arr_a, arr_b = as_array(a), as_array(b)
    na, nb = arr_a.size, arr_b.size
    pooled = np.concatenate([arr_a, arr_b])
    total = math.comb(na + nb, na)
    if np.ptp(pooled) == 0.0:
        # All values equal: no evidence of any difference.
        return PermutationResult(1.0, True, total, total)
    observed = abs(float(arr_b.mean() - arr_a.mean()))
    # Ties in floating point: an arrangement as extreme as the observed one
    # must count even if its sums round differently.
    tolerance = 1e-12 * max(1.0, float(np.max(np.abs(pooled)))) * (na + nb)
    grand = float(pooled.sum())
    if total <= n_resamples:
        idx = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(na + nb), na)),
            dtype=np.intp,
            count=total * na,
        ).reshape(total, na)
        sum_a = pooled[idx].sum(axis=1)
        stat = np.abs((grand - sum_a) / nb - sum_a / na)
        hits = int(np.count_nonzero(stat >= observed - tolerance))
        return PermutationResult(float(min(1.0, hits / total)), True, total, total)
    rng = np.random.default_rng(seed)
    hits = 0
    done = 0
    chunk = max(1, 2_000_000 // (na + nb))  # bound the memory of one batch
    while done < n_resamples:
        size = min(chunk, n_resamples - done)
        perm = rng.permuted(np.broadcast_to(pooled, (size, na + nb)), axis=1)
        sum_a = perm[:, :na].sum(axis=1)
        stat = np.abs((grand - sum_a) / nb - sum_a / na)
        hits += int(np.count_nonzero(stat >= observed - tolerance))
        done += size
    return PermutationResult(float(min(1.0, (1 + hits) / (1 + n_resamples))), False, total, n_resamples)


def replicate_permutation_test(
    a_reps: Sequence[Samples],
    b_reps: Sequence[Samples],
    *,
    n_resamples: int = DEFAULT_PERMUTATIONS,
    seed: int = DEFAULT_SEED,
) -> PermutationResult:
    """The permutation test on replicate medians: the units that were
    independently drawn are what is permuted, never the samples nested in
    them."""
    return permutation_test(replicate_medians(a_reps), replicate_medians(b_reps), n_resamples=n_resamples, seed=seed)


def min_attainable_p(na: int, nb: int, n_resamples: int | None = None) -> float:
    """The smallest two-sided p a permutation test of na against nb units
    can give, with distinct values.  Exact: 2 / C(na + nb, na) for equal
    sizes (the observed split and its mirror are equally extreme), and
    1 / C(na + nb, na) for unequal ones (no mirror split exists).  With a
    budget smaller than the arrangements the test is Monte Carlo, whose
    floor is 1 / (n_resamples + 1)."""
    if na < 1 or nb < 1:
        return 1.0
    total = math.comb(na + nb, na)
    if n_resamples is not None and total > n_resamples:
        return 1.0 / (n_resamples + 1)
    return min(1.0, (2.0 if na == nb else 1.0) / total)


def replicates_needed(alpha_eff: float, *, limit: int = 64) -> int | None:
    """The smallest n such that n replicates a side have an exact floor
    ``min_attainable_p(n, n)`` below alpha_eff: fewer can never be
    significant at that level.  None when alpha_eff is so small that even
    ``limit`` a side would not do (or not positive)."""
    if not alpha_eff > 0.0:
        return None
    for n in range(1, limit + 1):
        if 2.0 / math.comb(2 * n, n) < alpha_eff:
            return n
    return None


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    Sorted ascending, the k-th smallest (k from 1) is multiplied by m - k + 1;
    a running maximum keeps the adjusted values monotone in the raw ones;
    capped at 1.  Rejecting every hypothesis whose adjusted p is below alpha
    is Holm's procedure: the chance of *any* false flag among the m is at
    most alpha (family-wise control), with no assumption on how the metrics
    depend on each other."""
    ps = [float(p) for p in pvalues]
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [1.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * ps[i]))
        adjusted[i] = running
    return adjusted


def sign_flip_pvalue(a_reps: Sequence[Sequence[float]], b_reps: Sequence[Sequence[float]]) -> float:
    """Exact two-sided sign-flip test of the per-unit log ratios of medians
    (2^n arrangements): the paired counterpart of the permutation test."""
    logs = np.log([np.median(b) / np.median(a) for a, b in zip(a_reps, b_reps, strict=True)])
    observed = abs(logs.sum())
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=len(logs))))
    sums = np.abs(flips @ logs)
    return float(np.mean(sums >= observed - 1e-12))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A against B: B's median over A's, its CI, and whether the change is
    real (p < alpha) and big enough (relative change >= min_effect).

    From ``compare_replicates`` it also says how many independent units
    each side had, how p was computed, the lowest p those counts can give,
    and whether it is ``underpowered`` (that floor not below alpha: it can
    never be significant), with the replicates a side that would do.
    ``p_adjusted`` is set when the comparison is one of a family (host/
    compare.py applies Holm); significance then uses it."""

    a: Summary
    b: Summary
    ratio: float  # median(B) / median(A)
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    alpha: float
    min_effect: float
    n_replicates_a: int = 1
    n_replicates_b: int = 1
    p_method: str = ""
    ci_method: str = ""
    min_attainable_p: float = 0.0
    underpowered: bool = False
    replicates_needed: int | None = None
    p_adjusted: float | None = None

    @property
    def relative_change(self) -> float:
        return self.ratio - 1.0

    @property
    def significant(self) -> bool:
        """p (adjusted, when it is one of a family) below alpha and the
        effect at least min_effect: the Firecracker rule for calling an A/B
        difference real.  Never when underpowered."""
        p = self.p_value if self.p_adjusted is None else self.p_adjusted
        return (
            math.isfinite(self.ratio)
            and not self.underpowered
            and p < self.alpha
            and abs(self.relative_change) >= self.min_effect
        )

    @property
    def direction(self) -> int:
        """+1 when B is significantly larger, -1 when smaller, 0 otherwise."""
        if not self.significant:
            return 0
        return 1 if self.ratio > 1.0 else -1

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "ratio": finite_or_none(self.ratio),
            "ci": [finite_or_none(self.ci_low), finite_or_none(self.ci_high)],
            "confidence": self.confidence,
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
            "significant": self.significant,
            "n_replicates_a": self.n_replicates_a,
            "n_replicates_b": self.n_replicates_b,
            "p_method": self.p_method,
            "ci_method": self.ci_method,
            "min_attainable_p": self.min_attainable_p,
            "underpowered": self.underpowered,
            "replicates_needed": self.replicates_needed,
        }


def compare(
    a: Samples,
    b: Samples,
    *,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """A against B on flat samples, each sample taken as independent: right
    only for figures with no nesting (a model's outputs).  Measurements go
    through ``compare_replicates``."""
    arr_a, arr_b = as_array(a), as_array(b)
    # A side with a single value has no spread to test against: p is 1.
    testable = arr_a.size > 1 and arr_b.size > 1
    return _comparison(
        arr_a,
        arr_b,
        bootstrap_ratio_ci(arr_a, arr_b, n_resamples=n_resamples, seed=seed),
        permutation_test(arr_a, arr_b, n_resamples=n_resamples, seed=seed).p_value if testable else 1.0,
        alpha=alpha,
        min_effect=min_effect,
        n_replicates=(len(a), len(b)),
        p_method="sample-level permutation",
        ci_method="sample-level bootstrap",
    )


def compare_replicates(
    a_reps: Sequence[Samples],
    b_reps: Sequence[Samples],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    n_permutations: int = DEFAULT_PERMUTATIONS,
) -> Comparison:
    """A against B, each a list of replicates (independent units), each a
    list of samples: the ratio of pooled medians, its two-stage bootstrap
    CI (n_resamples), the permutation p on replicate medians (exact up to
    n_permutations arrangements), the replicate counts, and whether those
    counts can reach p < alpha at all."""
    ga, gb = replicate_arrays(a_reps), replicate_arrays(b_reps)
    ci = hierarchical_ratio_ci(ga, gb, n_resamples=n_resamples, seed=seed)
    perm = replicate_permutation_test(ga, gb, n_resamples=n_permutations, seed=seed)
    comparison = _comparison(
        np.concatenate(ga),
        np.concatenate(gb),
        ci,
        perm.p_value,
        alpha=alpha,
        min_effect=min_effect,
        n_replicates=(len(ga), len(gb)),
        p_method=f"permutation of replicate medians, {perm.method}",
        ci_method=ci_method(len(ga), len(gb)),
    )
    # What these replicate counts can show at all (the flat comparison
    # takes every sample as a unit and has no such floor).
    floor = min_attainable_p(len(ga), len(gb), n_permutations)
    return dataclasses.replace(
        comparison,
        min_attainable_p=floor,
        underpowered=floor >= alpha,
        replicates_needed=replicates_needed(alpha),
    )


def _comparison(
    a: np.ndarray,
    b: np.ndarray,
    ci: tuple[float, float],
    p_value: float,
    *,
    alpha: float,
    min_effect: float,
    n_replicates: tuple[int, int],
    p_method: str,
    ci_method: str,
) -> Comparison:
    """The Comparison of the pooled samples ``a`` and ``b`` with the CI and
    p each kind of comparison computed its own way."""
    return Comparison(
        a=summarize(a),
        b=summarize(b),
        ratio=ratio_of_medians(a, b),
        ci_low=ci[0],
        ci_high=ci[1],
        confidence=CONFIDENCE,
        p_value=p_value,
        alpha=alpha,
        min_effect=min_effect,
        n_replicates_a=n_replicates[0],
        n_replicates_b=n_replicates[1],
        p_method=p_method,
        ci_method=ci_method,
    )

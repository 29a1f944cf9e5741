"""Permutation tests on replicate medians with their power floor and the
exact sign-flip test of paired units (the p a claim's verdict reports,
host/judge/claims/records.py), and Holm's correction over a family.  The
A/B decisions of ``memqual compare`` are ab_tests.py's.  Every random
choice is seeded; no I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np

from memqual.host.core.descriptive import Samples, as_array
from memqual.host.judge.stats.intervals import DEFAULT_RESAMPLES, DEFAULT_SEED, replicate_medians

# Permutations of replicate medians are cheap (a few numbers each), so the
# budget is large enough to enumerate every split up to 10 against 10
# (184756): a Monte Carlo p near a Holm-corrected level would otherwise
# decide a verdict by its own sampling noise.
DEFAULT_PERMUTATIONS = 200_000


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

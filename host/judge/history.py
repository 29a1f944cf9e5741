"""The series of many runs of one host: runs grouped by host and QEMU, ordered
by time or kernel, each metric's ratios to the group's first run, and the
change points (binary segmentation on the runs' medians, located by the
family's scan and by each series' own search, each series' run spread
moderated by its family's, corrected per family as memqual compare's).
docs/bisect-history-export.md explains the test.
Draws nothing and parses no options.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core.errors import BadInput
from memqual.host.judge.pairing import replicates_of
from memqual.host.judge.regime import NOT_COMPARABLE, RegimeCheck, condition_of
from memqual.host.judge.regime import check as check_regime
from memqual.host.judge.results import MetricEntry, load_results

if TYPE_CHECKING:
    pass


# The change-point test, named on the page: **binary segmentation on the
# runs' medians, a t at every boundary with the run-to-run variance
# moderated by the family's**.  The unit is the run: runs sit hours or days
# apart, the host moves between them (docs/ab-calibration.md measured some
# 10 % between jobs), and the replicates of one run share that run's state,
# so a test on replicates pooled across runs reads run-to-run drift as
# change.  Each run gives one value, the median of its replicate medians (on
# the log scale; relative to the series' mean for a metric with a value at
# or below zero).
#
# In a segment of the series every boundary between two runs is a
# candidate: a two-sample t of the run values before against after, with
# the variance within both sides.  Eight runs leave that variance 6 degrees
# of freedom, and that, not the search over boundaries, is what a series
# alone cannot overcome: at alpha 0.01 the best of 7 boundaries needs
# |t| > 5.55 (its exact null, by simulation) against Bonferroni's 5.56, and
# a 10 % step in 8 runs of 3 % run-to-run drift gives t about 4.2.  So the
# variance is **moderated** by the family's (Smyth's empirical Bayes, as
# limma's moderated t): at each boundary, the within-sides variances of
# every series of the family at that same boundary are fitted as a scaled
# inverse chi-square prior (its degrees of freedom d0 from how much the
# log variances scatter beyond their sampling error; at most the family's
# own degrees of freedom), and a series' variance becomes
# (d0 s0^2 + d s^2) / (d0 + d) with d0 + d degrees of freedom.  Series that
# drift alike lend each other degrees of freedom; series whose spreads
# differ widely (the primaries here span 0.05 % to 36 %) give d0 near 0 and
# each series keeps its own t.  A series alone is its own t.
#
# What moderation cannot buy back is the search: Holm over 10 primaries
# times 7 boundaries asks a series for p < 1.4e-4, and a 10 % step in 8
# runs of 3 % drift gives t about 4.2, found in half the series.  A kernel
# change moves the primaries at the same run, so the family is scanned
# first (``family_scan``: where its runs changed, a null drawn from the
# residuals' covariance so a drift common to a run is no signal), and each
# series is tested at the boundaries the family located (one boundary, not
# seven) with LOCATED_WEIGHT of alpha, and by its own search with the
# rest; when the family located nothing its search has all of alpha (a
# step of one primary alone).  docs/ab-calibration.md measures both.
#
# The segment's p is the smallest of the boundaries' times their number
# (Bonferroni; near exact here, above).  When it is below alpha the
# boundary of the smallest p is a candidate and both sides are searched
# again.  Then each candidate is judged between its neighbours (the
# candidates before and after it): it is a step when the ratio after /
# before of the run values lies beyond the threshold band -- as
# ``memqual compare``'s slower/faster: shown to differ, the estimate beyond
# the margin, not a change shown to exceed the margin.  The step keeps its
# 95 % t-interval for the page.
#
# Families, as in ``memqual compare`` (host/judge/comparison.py): a change point
# is a decision, and many metrics moving together is what host drift looks
# like.  So each series' test of "no change anywhere" (``no_change_p``) is
# corrected within its family -- Holm over the primary metrics, Holm over
# the negative controls (the host-only /dev/kvm costs: no guest kernel moves
# them), Benjamini-Hochberg over the rest (at alpha: a page to read, not a
# gate) -- and a series gets steps only when it passes.  A control with a
# step says the host moved between those two runs: a step of any other
# series between the same two runs is then **confounded** (kept, drawn,
# listed, but not a decision), and a series whose every step is confounded
# is ``undecided``.  A series with no step is ``equivalent`` when every
# run's value is shown inside the threshold band against the first (the two
# one-sided tests with the run-to-run spread of the whole series, the
# largest p of the runs, corrected in the family), ``undecided`` otherwise.
#
# A metric that holds only under a regime the host sets (KSM's volatile
# scan under its dirtying rate, host/judge/regime.py) gets steps and verdicts only
# when every run of its series recorded the regime and they all match
# within the tolerance; otherwise its series is drawn, marked ``not
# comparable`` with the regimes' range, and left out of its family's
# correction.

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01  # family-wise, per family, as memqual compare's
STEP = "step"
CI_RESAMPLES = 1999  # a page's intervals; memqual compare uses 9999
HOST_KEYS = ("cpu", "host_kernel", "qemu", "accel")
TEST_NAME = (
    "binary segmentation on run medians (the run is the unit): the runs of the family scanned together for where "
    "they changed (null drawn from the covariance of the residuals), each series tested there and by its own search "
    "over every boundary (Bonferroni), its run-to-run variance moderated across the family (empirical Bayes); "
    "a step: shown to differ, the ratio beyond the threshold; a step the controls share is confounded"
)
# Keys that describe the guest or the bookkeeping, not the host.
_NOT_HOST = ("guest_kernel", "guest_kernel_sha256", "initramfs_sha256", "environment_sources", "python")


@dataclasses.dataclass(frozen=True)
class Run:
    path: Path
    created: str
    environment: dict[str, Any]
    guest_kernel: str | None
    label: str
    metrics: dict[str, MetricEntry]  # by key

    @property
    def host(self) -> tuple[str, ...]:
        return tuple(str(self.environment.get(k)) for k in HOST_KEYS)

    @property
    def name(self) -> str:
        return f"{self.created} {self.guest_kernel or '?'}" + (f" [{self.label}]" if self.label else "")


@dataclasses.dataclass(frozen=True)
class Step:
    """A change between run ``after - 1`` and run ``after`` (positions in
    the series)."""

    after: int
    ratio: float  # pooled median after / before, within the segment
    ci_low: float
    ci_high: float
    p_value: float
    # A control stepped between the same two runs: the host moved there, so
    # this step is not a decision.
    confounded: bool = False


@dataclasses.dataclass
class Point:
    run: int  # position of the run in its group
    median: float
    ratio: float | None  # to the series' first point
    ci_low: float | None
    ci_high: float | None
    replicates: int


@dataclasses.dataclass
class Series:
    key: str
    unit: str
    better: str
    points: list[Point]
    steps: list[Step]
    scenario: str = ""
    role: str = "primary"
    verdict: str = "undecided"  # STEP, equivalent, undecided or NOT_COMPARABLE
    p_change: float = 1.0  # of no change anywhere: the best boundary's pooled t on run values, Bonferroni
    p_change_adjusted: float = 1.0
    p_equivalence: float = 1.0  # every run inside the band against the first (TOST, the largest p)
    p_equivalence_adjusted: float = 1.0
    regime: RegimeCheck | None = None  # the runs' regimes, for a metric that holds under one
    # One value a run of the group (``run_values``; NaN where the series has
    # none) and whether they are logs: what the change-point test reads.
    values: list[float] = dataclasses.field(default_factory=list)
    log: bool = True
    # Where the runs of this series' whole family changed (``located_changes``:
    # positions of the first run after each change); empty: nowhere.
    family_changes: list[int] = dataclasses.field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return self.regime is None or self.regime.matches

    @property
    def decided_steps(self) -> list[Step]:
        """The steps no control shares."""
        return [st for st in self.steps if not st.confounded]


@dataclasses.dataclass
class Group:
    host: dict[str, Any]
    runs: list[Run]
    series: list[Series]

    @property
    def controls_stepped(self) -> list[Series]:
        return [s for s in self.series if s.role == "control" and s.verdict == STEP]

    @property
    def host_drifted(self) -> bool:
        return bool(self.controls_stepped)

    def family_changes(self) -> dict[str, list[int]]:
        """Each family's located change points (positions of the first run
        after each), for the families that have any."""
        out: dict[str, list[int]] = {}
        for s in self.series:
            if s.family_changes:
                out.setdefault(s.role, s.family_changes)
        return out


# ------------------------------------------------------------ input


def find_results(paths: Sequence[str]) -> list[Path]:
    """The memqual results.json files given or found below a directory
    (avocado's own results.json in its job dirs are not memqual's and are
    left out by their schema)."""
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            for candidate in sorted(path.rglob("results.json")):
                if "avocado" in candidate.relative_to(path).parts:
                    continue
                found.append(candidate)
        else:
            raise BadInput(f"{path}: no such file or directory (give results.json files or run directories)")
    return found


def load_runs(paths: Sequence[str]) -> list[Run]:
    files = find_results(paths)
    if not files:
        raise BadInput(f"no results.json under {', '.join(paths)}: give memqual run output directories")
    runs = []
    for f in files:
        results = load_results(f)
        env = results.environment or {}
        run = results.run or {}
        runs.append(
            Run(
                path=f,
                created=str(results.created or ""),
                environment=env,
                guest_kernel=env.get("guest_kernel"),
                label=str(run.get("label") or ""),
                metrics={m.key: m for m in results.metrics},
            )
        )
    return runs


def _kernel_order(release: str | None) -> tuple[Any, ...]:
    from memqual.images.releases import release_order

    return (0, release_order(release)) if release else (1, ())


def order_runs(runs: list[Run], by: str) -> list[Run]:
    if by == "kernel":
        return sorted(runs, key=lambda r: (_kernel_order(r.guest_kernel), r.created, str(r.path)))
    return sorted(runs, key=lambda r: (r.created, str(r.path)))


def group_runs(runs: list[Run]) -> list[list[Run]]:
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(run.host, []).append(run)
    return list(groups.values())


def environment_differences(groups: list[list[Run]]) -> dict[str, list[Any]]:
    """Host keys whose value differs between the groups: one value a group."""
    if len(groups) < 2:
        return {}
    envs = [g[0].environment for g in groups]
    keys = sorted({k for e in envs for k in e if k not in _NOT_HOST and not k.endswith("_all")})
    return {k: [e.get(k) for e in envs] for k in keys if len({json.dumps(e.get(k), sort_keys=True) for e in envs}) > 1}


# ------------------------------------------------------------ the test


def _reps(entry: MetricEntry) -> list[list[float]]:
    return replicates_of(entry)


def run_values(series: Sequence[Sequence[Sequence[float]]]) -> list[float]:
    """One value a run, the unit of the tests: the log of the median of its
    replicate medians, or, when a run's median is at or below zero (a
    count, a fraction), that median relative to the series' mean absolute
    median (the ratio is then 1 + the difference).  A run with no samples
    gives NaN (left out by the tests)."""
    import numpy as np

    medians = [
        float(np.median([float(np.median(r)) for r in run if len(r)])) if any(len(r) for r in run) else math.nan
        for run in series
    ]
    known = [m for m in medians if math.isfinite(m)]
    if known and min(known) > 0.0:
        return [math.log(m) if math.isfinite(m) else math.nan for m in medians]
    ref = (math.fsum(abs(m) for m in known) / len(known)) if known else 1.0
    return [m / (ref or 1.0) for m in medians]


def _log_scale(series: Sequence[Sequence[Sequence[float]]]) -> bool:
    import numpy as np

    meds = [float(np.median(r)) for run in series for r in run if len(r)]
    return bool(meds) and min(meds) > 0.0


@dataclasses.dataclass(frozen=True)
class Prior:
    """The family's run-to-run variance at one boundary, as a prior for one
    series' (a scaled inverse chi-square: ``variance`` s0^2 on ``df`` d0
    degrees of freedom).  ``df`` 0: none, each series its own t."""

    df: float
    variance: float


NO_PRIOR = Prior(0.0, 0.0)


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (y > 0), by Newton's method as limma's."""
    from scipy import special

    x = 0.5 + 1.0 / y if y < 1e6 else 1.0 / math.sqrt(y)
    for _ in range(60):
        tri = float(special.polygamma(1, x))
        step = tri * (1.0 - tri / y) / float(special.polygamma(2, x))
        x += step
        if x <= 0.0:
            x = 1e-8
        if abs(step) < 1e-10 * x:
            break
    return x


def fit_prior(variances: Sequence[tuple[float, float]], independent: float | None = None) -> Prior:
    """Smyth's (2004) moment fit of a prior to the series' (variance,
    degrees of freedom) pairs: the log variances' scatter beyond what their
    own sampling gives is the prior's; a prior is capped at the degrees of
    freedom the family's variances hold, less one series': ``independent``
    (default: as many as there are) is how many independent series those
    variances are worth.  Fewer than three series with a variance above
    zero: none."""
    from scipy import special

    pairs = [(v, d) for v, d in variances if d > 0.0 and v > 0.0 and math.isfinite(v)]
    if len(pairs) < 3:
        return NO_PRIOR
    e = [math.log(v) - float(special.digamma(d / 2.0)) + math.log(d / 2.0) for v, d in pairs]
    g = len(e)
    mean = math.fsum(e) / g
    excess = (
        math.fsum((x - mean) ** 2 for x in e) / (g - 1)
        - math.fsum(float(special.polygamma(1, d / 2.0)) for _, d in pairs) / g
    )
    worth = g if independent is None else max(1.0, min(float(g), independent))
    cap = math.fsum(d for _, d in pairs) / g * (worth - 1.0)
    if cap <= 0.0:
        return NO_PRIOR
    d0 = cap if excess <= 0.0 else min(cap, 2.0 * _trigamma_inverse(excess))
    s0 = math.exp(mean + float(special.digamma(d0 / 2.0)) - math.log(d0 / 2.0))
    return Prior(d0, s0)


def _within(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """The variance within both sides and its degrees of freedom."""
    df = len(x) + len(y) - 2
    if not x or not y or df < 1:
        return math.nan, 0.0
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    ss = math.fsum((v - mx) ** 2 for v in x) + math.fsum((v - my) ** 2 for v in y)
    return ss / df, float(df)


class FamilySpread:
    """The prior at each boundary of each segment, fitted to the
    within-sides variances of every series of one family at that boundary
    (run values aligned on the group's runs, NaN where a series has no
    run).  Under no change the series' variances there are independent
    scaled chi-squares; a series with a step elsewhere inflates its own,
    which only widens the prior."""

    def __init__(self, values: Sequence[Sequence[float]]) -> None:
        self.values = [list(v) for v in values]
        self._cache: dict[tuple[int, int, int], Prior] = {}

    def __call__(self, i: int, j: int, k: int) -> Prior:
        key = (i, j, k)
        if key not in self._cache:
            pairs = []
            for v in self.values:
                x = [a for a in v[i:k] if math.isfinite(a)]
                y = [a for a in v[k:j] if math.isfinite(a)]
                pairs.append(_within(x, y))
            self._cache[key] = fit_prior(pairs, self.independent(i, j, k))
        return self._cache[key]

    def independent(self, i: int, j: int, k: int) -> float:
        """How many independent series the family's variances at this
        boundary are worth: G / (1 + (G - 1) r2), r2 the mean over pairs of
        series of their residuals' squared correlation less what it is
        between independent series (1 / the residuals' degrees of
        freedom).  A drift that moves every series of a run alike makes
        their variances one draw, not G (r2 near 1): without this the prior
        would lend a common drift the degrees of freedom of G series."""
        import numpy as np

        block = np.array([v[i:j] for v in self.values], dtype=float)  # series x runs
        cut = k - i
        resid = np.full_like(block, np.nan)
        for side in (slice(0, cut), slice(cut, None)):
            part = block[:, side]
            with np.errstate(invalid="ignore"):
                counts = np.isfinite(part).sum(axis=1, keepdims=True)
                means = np.nansum(part, axis=1, keepdims=True) / np.maximum(counts, 1)
            resid[:, side] = part - means
        known = np.isfinite(resid)
        r = np.where(known, resid, 0.0)
        norms = np.sqrt((r * r).sum(axis=1))
        use = norms > 0.0
        g = int(use.sum())
        if g < 2:
            return float(g)
        r, known = r[use] / norms[use, None], known[use]
        r2 = (r @ r.T) ** 2
        dof = np.maximum(known.astype(float) @ known.T.astype(float) - 2.0, 2.0)  # runs both have, less two means
        excess = np.clip((r2 - 1.0 / dof) / (1.0 - 1.0 / dof), 0.0, 1.0)
        mean = float((excess.sum() - np.trace(excess)) / (g * (g - 1)))
        return g / (1.0 + (g - 1) * mean)


@dataclasses.dataclass(frozen=True)
class Split:
    """Run values before against after one boundary: the difference of
    their means, its standard error, and the degrees of freedom of the
    spread it was estimated with."""

    difference: float
    se: float
    df: float

    def p_value(self) -> float:
        from scipy import special

        if self.df <= 0.0 or not math.isfinite(self.se):
            return 1.0
        if self.se == 0.0:
            return 1.0 if self.difference == 0.0 else 0.0
        return float(2.0 * special.stdtr(self.df, -abs(self.difference) / self.se))

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        from scipy import special

        if self.df <= 0.0 or not math.isfinite(self.se):
            return (-math.inf, math.inf)
        half = float(special.stdtrit(self.df, 0.5 + confidence / 2.0)) * self.se
        return (self.difference - half, self.difference + half)


def split(before: Sequence[float], after: Sequence[float], prior: Prior = NO_PRIOR) -> Split:
    """The two-sample t of the run values before against after a boundary,
    the variance within both sides, moderated by ``prior`` (NaN, a run with
    no samples, left out)."""
    x = [v for v in before if math.isfinite(v)]
    y = [v for v in after if math.isfinite(v)]
    if not x or not y:
        return Split(0.0, math.inf, 0.0)
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    var, df = _within(x, y)
    if df < 1:
        var, df = 0.0, 0.0
    if prior.df > 0.0:
        var, df = (prior.df * prior.variance + df * var) / (prior.df + df), prior.df + df
    if df <= 0.0:
        return Split(my - mx, math.inf, 0.0)
    return Split(my - mx, math.sqrt(var * (1.0 / len(x) + 1.0 / len(y))), df)


def _boundaries(values: Sequence[float], i: int, j: int) -> list[int]:
    """The boundaries inside [i, j) that split its known values in two
    different ways: before each known value but the first."""
    known = [k for k in range(i, j) if math.isfinite(values[k])]
    return known[1:]


def no_change_p(series: Sequence[Sequence[Sequence[float]]]) -> float:
    """The p of "no change anywhere in the series" for a series alone: at
    every boundary between two runs, the t-test of the run values
    (``run_values``) before against after, the smallest p, times the
    boundaries (Bonferroni over the candidates: the best of k - 1 splits,
    not one chosen in advance).  Its error rate on series with run-to-run
    drift is measured (docs/ab-calibration.md, "memqual history").  Under
    no change the runs are exchangeable, so drift that moves each run
    independently is in the variance the test estimates, not in its
    signal."""
    values = run_values(series)
    return _segment_p(values, 0, len(values), None)[0]


def _segment_p(values: Sequence[float], i: int, j: int, prior_at: Any) -> tuple[float, int]:
    """The segment's Bonferroni p and its best boundary (-1: none)."""
    known = [v for v in values[i:j] if math.isfinite(v)]
    if len(known) < 3 and (prior_at is None or len(known) < 2):
        return 1.0, -1  # two runs leave no spread between runs to test against, unless the family lends one
    cuts = _boundaries(values, i, j)
    if not cuts:
        return 1.0, -1
    ps = [split(values[i:k], values[k:j], prior_at(i, j, k) if prior_at else NO_PRIOR).p_value() for k in cuts]
    best = min(range(len(cuts)), key=lambda m: ps[m])
    return min(1.0, ps[best] * len(ps)), cuts[best]


def change_points(
    series: Sequence[Sequence[Sequence[float]]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
) -> list[Step]:
    """Steps in a series of runs alone, each run a list of replicates
    (lists of samples).  See the module docstring for the test."""
    return steps_in(run_values(series), _log_scale(series), threshold=threshold, alpha=alpha)


def steps_in(
    values: Sequence[float],
    log: bool,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    prior_at: Any = None,
    located: dict[int, float] | None = None,
) -> list[Step]:
    """Steps in one series' run values (``run_values``, NaN where it has
    no run), its variances moderated by ``prior_at(i, j, k)`` (a
    ``FamilySpread``; None: the series alone).  ``located``: the p of
    this series at each boundary its family located (``located_p``); a
    located boundary spends ``LOCATED_WEIGHT`` of alpha and the series' own
    search the rest.  None: the search spends all of it."""

    def ratio(x: float) -> float:
        return math.exp(x) if log else 1.0 + x

    search_share = 1.0 - LOCATED_WEIGHT if located else 1.0
    candidates: dict[int, float] = {}  # boundary -> the p (over its share) that found it

    def segment(i: int, j: int) -> None:
        p, after = _segment_p(values, i, j, prior_at)
        p = min(1.0, p / search_share)
        if after < 0 or p >= alpha:
            return
        candidates[after] = p
        segment(i, after)
        segment(after, j)

    segment(0, len(values))
    for after, p in (located or {}).items():
        share = min(1.0, p / LOCATED_WEIGHT)
        if share < alpha:
            candidates[after] = min(share, candidates.get(after, 1.0))
    # Each candidate is judged against its neighbours: the runs between
    # the candidate before it and the one after.  Judged against the whole
    # segment instead, a rise followed by a fall (or the reverse) mixes
    # both levels on one side and neither step would show.
    steps: list[Step] = []
    cuts = sorted(candidates)
    for k, after in enumerate(cuts):
        start = cuts[k - 1] if k else 0
        end = cuts[k + 1] if k + 1 < len(cuts) else len(values)
        found = split(values[start:after], values[after:end], prior_at(start, end, after) if prior_at else NO_PRIOR)
        estimate = ratio(found.difference)
        if not (estimate > 1.0 + threshold or estimate < 1.0 - threshold):
            continue  # perhaps significant, but the estimate is inside the band
        low, high = found.interval()
        steps.append(
            Step(after=after, ratio=estimate, ci_low=ratio(low), ci_high=ratio(high), p_value=candidates[after])
        )
    return steps


def family_p(values: Sequence[float], prior_at: Any) -> float:
    """A series' p of "no change anywhere" with its family's prior: the
    whole series as one segment."""
    return _segment_p(values, 0, len(values), prior_at)[0]


SCAN_DRAWS = 1999
SCAN_SEED = 20261203  # fixed: the same runs give the same page
# The share of alpha a series spends on the boundaries its family located;
# the rest goes to its own search over every boundary (a step of that
# series alone).
LOCATED_WEIGHT = 0.9


def _scan_statistic(block: Any) -> Any:
    """For each boundary of rows of centred, standardised run values
    (``...`` x series x runs), the share of each series' variance between
    the two sides (its R^2 at that boundary: monotone in its |t|), summed
    over the series; the largest over the boundaries and where it is
    (its index: the boundary before run index + 1), each of shape ``...``."""
    import numpy as np

    n = block.shape[-1]
    k = np.arange(1, n)
    before = np.cumsum(block, axis=-1)[..., :-1]  # rows sum to 0: after = -before
    r2 = before * before * n / (k * (n - k) * (n - 1))
    return r2.sum(axis=-2).max(axis=-1), r2.sum(axis=-2).argmax(axis=-1)


def family_scan(values: Sequence[Sequence[float]], i: int, j: int) -> tuple[float, int]:
    """Where the family's runs changed: at each boundary of [i, j) the sum
    over the series of their R^2 there (each series standardised: a sign
    does not matter, so a change that makes some primaries faster and
    others slower adds up), the largest over the boundaries.  Its null is
    simulated: new runs drawn as normal vectors with the covariance of the
    series' residuals within both sides of the best boundary (a Gaussian
    multiplier bootstrap), so a drift common to the series of a run --
    correlated residuals -- widens the null as much as it widens the
    statistic, and independent series keep the sum's own spread.  Not a
    permutation of the runs: 8 runs split 4 and 4 in 35 ways, so no
    permutation p goes below 1/35.  Series with a run missing in the
    segment, or no spread, are left out.  Returns the p and the boundary
    (-1: none)."""
    import numpy as np

    rows = [list(v[i:j]) for v in values]
    rows = [r for r in rows if all(math.isfinite(x) for x in r)]
    n = j - i
    if n < 4 or not rows:
        return 1.0, -1
    block = np.array(rows, dtype=float)
    block -= block.mean(axis=1, keepdims=True)
    sd = block.std(axis=1, ddof=1)
    block = block[sd > 0.0] / sd[sd > 0.0, None]
    if not len(block):
        return 1.0, -1
    observed, at = _scan_statistic(block)
    cut = int(at) + 1
    resid = block.copy()
    for side in (slice(0, cut), slice(cut, None)):
        resid[:, side] -= resid[:, side].mean(axis=1, keepdims=True)
    rng = np.random.default_rng(SCAN_SEED)
    exceed = 0
    for start in range(0, SCAN_DRAWS, 250):
        count = min(250, SCAN_DRAWS - start)
        draws = np.einsum("gm,bmn->bgn", resid, rng.standard_normal((count, n, n)))
        draws -= draws.mean(axis=2, keepdims=True)
        spread = draws.std(axis=2, ddof=1, keepdims=True)
        draws = np.divide(draws, spread, out=np.zeros_like(draws), where=spread > 0.0)
        exceed += int((_scan_statistic(draws)[0] >= observed).sum())
    return (1 + exceed) / (SCAN_DRAWS + 1), i + cut


def located_changes(values: Sequence[Sequence[float]], *, alpha: float = DEFAULT_ALPHA) -> list[int]:
    """The family's change points: binary segmentation with
    ``family_scan`` at ``alpha`` in each segment."""
    found: list[int] = []

    def segment(i: int, j: int) -> None:
        p, after = family_scan(values, i, j)
        if after < 0 or p >= alpha:
            return
        found.append(after)
        segment(i, after)
        segment(after, j)

    n = max((len(v) for v in values), default=0)
    segment(0, n)
    return sorted(found)


def located_p(values: Sequence[float], located: Sequence[int], prior_at: Any) -> dict[int, float]:
    """A series' p at each boundary its family located, between the
    located boundaries on either side, times their number."""
    out: dict[int, float] = {}
    for m, after in enumerate(located):
        start = located[m - 1] if m else 0
        end = located[m + 1] if m + 1 < len(located) else len(values)
        found = split(values[start:after], values[after:end], prior_at(start, end, after) if prior_at else NO_PRIOR)
        out[after] = min(1.0, found.p_value() * len(located))
    return out


def equivalence_p(series: Sequence[Sequence[Sequence[float]]], threshold: float) -> float:
    """The largest over the runs of the TOST p of "this run's value is
    inside the band against the first run's", with the run-to-run spread
    estimated from the whole series (a change anywhere widens it, which
    only makes equivalence harder to show)."""
    from scipy import special

    values = [v for v in run_values(series) if math.isfinite(v)]
    n = len(values)
    if n < 3:
        return 1.0
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    log = _log_scale(series)
    low = math.log(1.0 - threshold) if log else -threshold
    high = math.log(1.0 + threshold) if log else threshold
    se = sd * math.sqrt(2.0)
    worst = 0.0
    for v in values[1:]:
        d = v - values[0]
        if se == 0.0:
            p = 0.0 if low < d < high else 1.0
        else:
            p = max(special.stdtr(n - 1, -(d - low) / se), special.stdtr(n - 1, -(high - d) / se))
        worst = max(worst, float(p))
    return worst


def series_of(runs: list[Run], *, threshold: float, alpha: float) -> list[Series]:
    from memqual.host.judge import stats

    keys = sorted({k for r in runs for k in r.metrics})
    out = []
    for key in keys:
        present = [(pos, r.metrics[key]) for pos, r in enumerate(runs) if key in r.metrics]
        if len(present) < 2:
            continue
        first = _reps(present[0][1])
        points = []
        for pos, entry in present:
            reps = _reps(entry)
            low, high = stats.hierarchical_ratio_ci(first, reps, n_resamples=CI_RESAMPLES)
            points.append(
                Point(
                    pos,
                    float(stats.median([x for r in reps for x in r])),
                    stats.pooled_ratio(first, reps),
                    low if math.isfinite(low) else None,
                    high if math.isfinite(high) else None,
                    len(reps),
                )
            )
        m = present[0][1]
        series = Series(key, str(m.unit or ""), str(m.better or "lower"), points, [], str(m.scenario or ""))
        # The run values on the group's positions: the family's prior is
        # fitted boundary by boundary across series.
        series.values = [math.nan] * len(runs)
        for (pos, _), value in zip(present, run_values([_reps(e) for _, e in present]), strict=True):
            series.values[pos] = value
        series.log = _log_scale([_reps(e) for _, e in present])
        condition = condition_of(series.scenario, str(m.metric or ""))
        if condition is not None:
            series.regime = check_regime(
                condition,
                [
                    (
                        f"run {pos + 1}",
                        list(runs[pos].metrics.values()),
                        e.variant or {},
                        e.settings or {},
                    )
                    for pos, e in present
                ],
            )
        series.p_equivalence = equivalence_p([_reps(e) for _, e in present], threshold)
        out.append(series)
    _decide_families(out, runs, threshold, alpha)
    return out


def _decide_families(series: list[Series], runs: list[Run], threshold: float, alpha: float) -> None:
    """Each series' family (memqual.host.judge.primaries, the primary marks the
    runs' files carry), the test and corrections within it, and the verdicts."""
    from memqual.host.judge import comparison
    from memqual.host.judge.primaries import is_control

    marks = {k: m.primary for r in runs for k, m in r.metrics.items() if m.primary is not None}
    for s in series:
        if is_control(s.scenario):
            s.role = comparison.CONTROL
        elif not marks or marks.get(s.key):
            s.role = comparison.PRIMARY
        else:
            s.role = comparison.EXPLORATORY
    for s in series:
        if not s.comparable:
            s.verdict, s.steps = NOT_COMPARABLE, []
    for role in comparison.ROLES:
        # A series whose runs' regimes differ decides nothing and is in no family.
        judge_family([s for s in series if s.role == role and s.comparable], threshold=threshold, alpha=alpha)
    confound(series)


def judge_family(members: list[Series], *, threshold: float, alpha: float) -> None:
    """One family's series (their ``values``, ``log``, ``role`` and
    ``p_equivalence`` set): each one's steps with the family's prior, the
    p of no change corrected in the family (Holm; Benjamini-Hochberg for
    the exploratory), and the verdicts.  Confounding by the controls is
    ``confound``'s."""
    from memqual.host.judge import comparison, stats
    from memqual.host.judge.stats import ab_tests

    if not members:
        return
    spread = FamilySpread([s.values for s in members])
    located = located_changes([s.values for s in members], alpha=alpha)
    for s in members:
        s.family_changes = list(located)
        at = located_p(s.values, located, spread)
        own = family_p(s.values, spread)
        s.p_change = min(1.0, own / (1.0 - LOCATED_WEIGHT), min(at.values()) / LOCATED_WEIGHT) if at else own
        s.steps = steps_in(s.values, s.log, threshold=threshold, alpha=alpha, prior_at=spread, located=at)
    correct = ab_tests.benjamini_hochberg if members[0].role == comparison.EXPLORATORY else stats.holm
    for s, p, q in zip(
        members, correct([s.p_change for s in members]), correct([s.p_equivalence for s in members]), strict=True
    ):
        s.p_change_adjusted, s.p_equivalence_adjusted = p, q
        if p < alpha and s.steps:
            s.verdict = STEP
        else:
            s.steps = []
            s.verdict = comparison.EQUIVALENT if q < alpha else comparison.UNDECIDED


def confound(series: list[Series]) -> None:
    """A step of a control says the host moved between those two runs: the
    steps of the other series between the same runs are kept but marked
    confounded, and a series left with no other step is undecided."""
    from memqual.host.judge import comparison

    moved = {st.after for s in series if s.role == comparison.CONTROL and s.verdict == STEP for st in s.steps}
    for s in series:
        if s.role == comparison.CONTROL or s.verdict != STEP:
            continue
        s.steps = [dataclasses.replace(st, confounded=st.after in moved) for st in s.steps]
        if not s.decided_steps:
            s.verdict = comparison.UNDECIDED


def build(
    paths: Sequence[str], *, order: str = "time", threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA
) -> tuple[list[Group], dict[str, list[Any]]]:
    runs = load_runs(paths)
    groups = [order_runs(g, order) for g in group_runs(runs)]
    diffs = environment_differences(groups)
    out = []
    for g in groups:
        host = {k: g[0].environment.get(k) for k in HOST_KEYS}
        out.append(Group(host, g, series_of(g, threshold=threshold, alpha=alpha)))
    return out, diffs


# ------------------------------------------------------------ output


def to_json(
    groups: list[Group], diffs: dict[str, list[Any]], order: str, threshold: float, alpha: float
) -> dict[str, Any]:
    return {
        "order": order,
        "threshold": threshold,
        "alpha": alpha,
        "test": TEST_NAME,
        "environment_differences": diffs,
        "groups": [
            {
                "host": g.host,
                "host_drifted": g.host_drifted,
                "controls_stepped": [c.key for c in g.controls_stepped],
                "family_changes": g.family_changes(),
                "runs": [
                    {"path": str(r.path), "created": r.created, "guest_kernel": r.guest_kernel, "label": r.label}
                    for r in g.runs
                ],
                "series": [
                    {
                        "key": s.key,
                        "unit": s.unit,
                        "better": s.better,
                        "scenario": s.scenario,
                        "role": s.role,
                        "verdict": s.verdict,
                        "p_change": s.p_change,
                        "p_change_adjusted": s.p_change_adjusted,
                        "p_equivalence": s.p_equivalence,
                        "p_equivalence_adjusted": s.p_equivalence_adjusted,
                        "regime": s.regime.to_json() if s.regime else None,
                        "points": [dataclasses.asdict(p) for p in s.points],
                        "steps": [dataclasses.asdict(st) for st in s.steps],
                    }
                    for s in g.series
                ],
            }
            for g in groups
        ],
    }

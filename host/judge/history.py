"""The series of many runs of one host: runs grouped by host and QEMU, ordered
by time or kernel, each metric's ratios to the group's first run, each
family's series judged together (change_points.py's test, corrected per
family as memqual compare's; a control's step confounds the others' between
the same runs), and the page's JSON.  docs/bisect-history-export.md
explains the test.  Draws nothing and parses no options.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.judge.change_points import (
    LOCATED_WEIGHT,
    Step,
    equivalence_p,
    family_p,
    located_changes,
    located_p,
    log_scale,
    run_values,
    steps_in,
)
from memqual.host.judge.pairing import replicates_of
from memqual.host.judge.regime import NOT_COMPARABLE, RegimeCheck, condition_of
from memqual.host.judge.regime import check as check_regime
from memqual.host.judge.results import MetricEntry, load_results
from memqual.host.judge.variance_prior import FamilySpread
from memqual.host.judge.verdicts import DEFAULT_ALPHA, DEFAULT_THRESHOLD

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


# ------------------------------------------------------------ the series


def _reps(entry: MetricEntry) -> list[list[float]]:
    return replicates_of(entry)


def series_of(runs: list[Run], *, threshold: float, alpha: float) -> list[Series]:
    from memqual.host.core import descriptive
    from memqual.host.judge.stats import intervals

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
            low, high = intervals.hierarchical_ratio_ci(first, reps, n_resamples=CI_RESAMPLES)
            points.append(
                Point(
                    pos,
                    float(descriptive.median([x for r in reps for x in r])),
                    intervals.pooled_ratio(first, reps),
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
        series.log = log_scale([_reps(e) for _, e in present])
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
    from memqual.host.judge import primaries, verdicts
    from memqual.host.judge.primaries import is_control

    marks = {k: m.primary for r in runs for k, m in r.metrics.items() if m.primary is not None}
    for s in series:
        if is_control(s.scenario):
            s.role = primaries.CONTROL
        elif not marks or marks.get(s.key):
            s.role = primaries.PRIMARY
        else:
            s.role = primaries.EXPLORATORY
    for s in series:
        if not s.comparable:
            s.verdict, s.steps = NOT_COMPARABLE, []
    for role in verdicts.ROLES:
        # A series whose runs' regimes differ decides nothing and is in no family.
        judge_family([s for s in series if s.role == role and s.comparable], threshold=threshold, alpha=alpha)
    confound(series)


def judge_family(members: list[Series], *, threshold: float, alpha: float) -> None:
    """One family's series (their ``values``, ``log``, ``role`` and
    ``p_equivalence`` set): each one's steps with the family's prior, the
    p of no change corrected in the family (Holm; Benjamini-Hochberg for
    the exploratory), and the verdicts.  Confounding by the controls is
    ``confound``'s."""
    from memqual.host.judge import primaries, verdicts
    from memqual.host.judge.stats import ab_tests, permutation

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
    correct = ab_tests.benjamini_hochberg if members[0].role == primaries.EXPLORATORY else permutation.holm
    for s, p, q in zip(
        members, correct([s.p_change for s in members]), correct([s.p_equivalence for s in members]), strict=True
    ):
        s.p_change_adjusted, s.p_equivalence_adjusted = p, q
        if p < alpha and s.steps:
            s.verdict = STEP
        else:
            s.steps = []
            s.verdict = verdicts.EQUIVALENT if q < alpha else verdicts.UNDECIDED


def confound(series: list[Series]) -> None:
    """A step of a control says the host moved between those two runs: the
    steps of the other series between the same runs are kept but marked
    confounded, and a series left with no other step is undecided."""
    from memqual.host.judge import primaries, verdicts

    moved = {st.after for s in series if s.role == primaries.CONTROL and s.verdict == STEP for st in s.steps}
    for s in series:
        if s.role == primaries.CONTROL or s.verdict != STEP:
            continue
        s.steps = [dataclasses.replace(st, confounded=st.after in moved) for st in s.steps]
        if not s.decided_steps:
            s.verdict = verdicts.UNDECIDED


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

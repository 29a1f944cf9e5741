"""``python -m memqual.host.cli.calibrate``: the error rates of the A/B
decisions, measured on synthetic truth through the real decision code
(``comparison.compare_runs``, ``families.decide``, the ``until.Tracker``
with its group-sequential boundaries, ``change_points.change_points`` and its
family), from fixed seeds.  Every figure of docs/ab-calibration.md's
"Decisions outside the happy path" table comes from here; each rate is
printed with its trials, seed and binomial 95 % interval (Clopper-Pearson).
``--quick`` (``table(0.1)``) runs a tenth of the trials; tests/judge/test_ab_calibration.py runs
bounded subsets of the same functions and asserts their rates inside the
intervals measured here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from memqual.host.judge import change_points, comparison, control_power, families, history
from memqual.host.judge import primaries as metric_roles
from memqual.host.judge import until_decided as until
from memqual.host.judge.primaries import CONTROL, EXPLORATORY, PRIMARY
from memqual.host.judge.stats import ab_tests, binomial
from memqual.host.judge.verdicts import DEFAULT_ALPHA, DEFAULT_THRESHOLD, EQUIVALENT, FASTER, SLOWER, UNDECIDED


@dataclasses.dataclass(frozen=True)
class Rate:
    """A measured rate: events in trials, with its seed."""

    name: str
    events: int
    trials: int
    seed: int

    @property
    def rate(self) -> float:
        return self.events / self.trials if self.trials else math.nan

    def interval(self) -> tuple[float, float]:
        """Clopper-Pearson 95 %."""
        return binomial.clopper_pearson(self.events, self.trials)

    def line(self) -> str:
        low, high = self.interval()
        return (
            f"{self.name}: {100 * self.rate:.2f} % ({self.events} of {self.trials}, seed {self.seed}; "
            f"95 % [{100 * low:.2f}, {100 * high:.2f}] %)"
        )


# ---------------------------------------------------------------- unblocked compare


def _entry(key: str, reps: list[list[float]], primary: bool, scenario: str) -> dict[str, Any]:
    return {
        "key": key,
        "scenario": scenario,
        "metric": key,
        "unit": "s",
        "better": "lower",
        "variant": {},
        "settings": {},
        "samples": [x for r in reps for x in r],
        "replicates": reps,
        "primary": primary,
        "summary": {},
    }


def _run_file(
    rng: np.random.Generator, primaries: int, controls: int, reps: int, offsets: np.ndarray
) -> dict[str, Any]:
    """One run's results outside blocks: each metric's replicates (3
    samples of 1 % noise around a replicate level of 3 % noise), the whole
    run's metric moved by its ``offsets`` entry."""
    metrics = []
    # a real negative control's name, so the comparison gives its metrics that role
    control_name = min(metric_roles.controls())
    for j in range(primaries + controls):
        control = j >= primaries
        level = (1.0 + j / 10.0) * math.exp(offsets[j])
        rep_levels = level * np.exp(rng.normal(0.0, 0.03, reps))
        values = [list(lv * np.exp(rng.normal(0.0, 0.01, 3))) for lv in rep_levels]
        scenario = control_name if control else f"synthetic.s{j}"
        metrics.append(_entry(f"{scenario} m{j}", [[float(x) for x in r] for r in values], not control, scenario))
    return {"memqual_version": "calibration", "metrics": metrics, "claims": [], "environment": {}}


def unblocked_compare(
    trials: int, seed: int, offset: float, common: bool, runs: int = 1, primaries: int = 10, controls: int = 26
) -> tuple[Rate, Rate, Rate]:
    """A/A outside blocks, 6 replicates a run, ``runs`` files a side, each
    run's host off by N(0, offset) per metric (``common``: one draw for
    every metric of the run): any primary slower/faster, exit 1, exit 3."""
    rng = np.random.default_rng(seed)
    flagged = exit1 = exit3 = 0
    n = primaries + controls
    for _ in range(trials):

        def draw() -> np.ndarray:
            return np.full(n, rng.normal(0.0, offset)) if common else rng.normal(0.0, offset, n)

        a = [_run_file(rng, primaries, controls, 6, draw()) for _ in range(runs)]
        b = [_run_file(rng, primaries, controls, 6, draw()) for _ in range(runs)]
        result = comparison.compare_runs(a, b, threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA)
        flagged += any(m.flagged for m in result.metrics if m.role == PRIMARY)
        status = result.exit_status()
        exit1 += status == 1
        exit3 += status == 3
    what = f"{runs} run(s) a side, offset {100 * offset:g} % {'common' if common else 'per metric'}"
    return (
        Rate(f"{what}: any primary slower/faster", flagged, trials, seed),
        Rate(f"{what}: exit 1", exit1, trials, seed),
        Rate(f"{what}: exit 3", exit3, trials, seed),
    )


# ---------------------------------------------------------------- history


def history_steps(trials: int, seed: int, drift: float, walk: bool = False, step: float = 1.0, runs: int = 8) -> Rate:
    """One series alone: ``runs`` runs of 4 replicates (2 % noise), each
    run moved by N(0, drift) (``walk``: a random walk of that step), a
    ``step`` from the middle run on: the share of series given a step (at
    alpha, one series alone: its family's first Holm level would be
    lower).  What the test gives with no family to lend it degrees of
    freedom."""
    rng = np.random.default_rng(seed)
    found = 0
    for _ in range(trials):
        moves = rng.normal(0.0, drift, runs)
        levels = np.cumsum(moves) if walk else moves
        series = []
        for i in range(runs):
            level = math.exp(levels[i]) * (step if i >= runs // 2 else 1.0)
            series.append([[float(level * math.exp(rng.normal(0.0, 0.02)))] for _ in range(4)])
        found += bool(change_points.change_points(series, threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA))
    kind = "random walk" if walk else "independent"
    return Rate(
        f"history, one series alone, {runs} runs, {100 * drift:g} % {kind} drift, step x{step:g}: a step",
        found,
        trials,
        seed,
    )


def history_family(
    trials: int,
    seed: int,
    drift: float | tuple[float, float],
    *,
    common: float = 0.0,
    step: float = 1.0,
    stepped: int = 10,
    members: int = 10,
    runs: int = 8,
) -> tuple[Rate, Rate]:
    """A family of ``members`` primaries through ``history.judge_family``
    (the family's prior, Holm, the verdicts): ``runs`` runs of 4
    replicates (2 % noise) each, every series' run moved by its own
    N(0, drift) (a pair: each series' drift log-uniform between the two)
    and every run by a ``common`` N(0, common) shared by all series, the
    first ``stepped`` series stepped by ``step`` from the middle run on.
    Returns the share of unstepped series given a step (false steps) and
    of stepped series given a step at the middle run (found)."""
    rng = np.random.default_rng(seed)
    false = nulls = found = alts = 0
    mid = runs // 2
    for _ in range(trials):
        shared = rng.normal(0.0, common, runs) if common else np.zeros(runs)
        family = []
        for g in range(members):
            sd = drift if isinstance(drift, float) else math.exp(rng.uniform(math.log(drift[0]), math.log(drift[1])))
            levels = shared + rng.normal(0.0, sd, runs)
            if g < stepped:
                levels[mid:] += math.log(step)
            reps = [[[float(math.exp(lv + rng.normal(0.0, 0.02)))] for _ in range(4)] for lv in levels]
            s = history.Series(f"m{g}", "s", "lower", [], [], "synthetic", role=PRIMARY)
            s.values, s.log = change_points.run_values(reps), True
            family.append(s)
        history.judge_family(family, threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA)
        for g, s in enumerate(family):
            if g < stepped and step != 1.0:
                alts += 1
                found += s.verdict == history.STEP and any(st.after == mid for st in s.steps)
            else:
                nulls += 1
                false += s.verdict == history.STEP
    spread = f"{100 * drift:g} %" if isinstance(drift, float) else f"{100 * drift[0]:g}-{100 * drift[1]:g} %"
    what = (
        f"history, {members} primaries, {runs} runs, {spread} independent drift"
        + (f" + {100 * common:g} % common" if common else "")
        + (f", {stepped} stepped x{step:g}" if step != 1.0 else ", no change")
    )
    return Rate(f"{what}: unchanged series given a step", false, nulls, seed), Rate(
        f"{what}: stepped series found", found, alts, seed
    )


# ---------------------------------------------------------------- looks on few blocks


def _look_decisions(
    records_a: Sequence[tuple[int, float]],
    records_b: Sequence[tuple[int, float]],
    *,
    threshold: float,
    alpha: float,
    sequential: Callable[..., Any] | None = None,
) -> list[Any]:
    """One primary's MetricComparison from (block, value) pairs, as
    compare_runs decides it (a family of one)."""
    blocks = [blk for blk, _ in records_a]
    ra, rb = [[v] for _, v in records_a], [[v] for _, v in records_b]
    test = ab_tests.ratio_test(ra, rb, blocks, blocks)
    given = sequential("m", test) if sequential else None
    decided, verdicts = families.decide(
        [test], [PRIMARY], ["lower"], threshold=threshold, alpha=alpha, sequential=[given]
    )
    return [
        comparison.MetricComparison(
            key="m",
            scenario="s",
            metric="m",
            unit="s",
            better="lower",
            comparison=families.metric_stats(
                test, ra, rb, decided[0], verdicts[0], threshold=threshold, sequential=given
            ),
            verdict=verdicts[0],
        )
    ]


def sequential_looks(
    trials: int, seed: int, looks: Sequence[int] = (3, 4, 5, 6), min_blocks: int = 0, alpha: float = DEFAULT_ALPHA
) -> Rate:
    """One metric, no effect, looked at on these block counts through the
    real Tracker (alpha on the budget's clock, the look at the last count
    spending what is left): the share of trials it was decided slower or
    faster.  ``min_blocks``: the Tracker's MIN_BLOCKS_SEQUENTIAL (0: its
    own)."""
    rng = np.random.default_rng(seed)
    wrong = 0
    last = looks[-1]
    for _ in range(trials):
        d = rng.normal(0.0, 0.03, last)
        tracker = until.Tracker(
            threshold=0.0, alpha=alpha, comparisons_of=_look_decisions, min_blocks_sequential=min_blocks
        )
        for k in looks:
            a = [(i + 1, 1.0) for i in range(k)]
            b = [(i + 1, float(math.exp(d[i]))) for i in range(k)]
            tracker.update(k, a, b, fraction=k / last)
        wrong += any(m.frozen in (SLOWER, FASTER) for m in tracker.metrics.values())
    rule = f"recursion from {min_blocks or until.MIN_BLOCKS_SEQUENTIAL} blocks"
    return Rate(
        f"one metric, looks on {list(looks)} blocks, {rule}, alpha {alpha:g}: slower or faster", wrong, trials, seed
    )


# ---------------------------------------------------------------- the drift alarm


def drift_alarm(trials: int, seed: int, blocks: int, alpha: float, move: float = 0.20, controls: int = 26) -> Rate:
    """Every control moved by ``move``, 2 % block noise, paired on
    ``blocks`` blocks, Holm over the controls at ``alpha``: a control flagged."""
    rng = np.random.default_rng(seed)
    caught = 0
    for _ in range(trials):
        tests = []
        for _j in range(controls):
            a = [[float(math.exp(x))] for x in rng.normal(0.0, 0.02 / math.sqrt(2), blocks)]
            b = [[float((1 + move) * math.exp(x))] for x in rng.normal(0.0, 0.02 / math.sqrt(2), blocks)]
            ids = list(range(blocks))
            tests.append(ab_tests.ratio_test(a, b, ids, ids))
        _, verdicts = families.decide(
            tests, [CONTROL] * controls, ["lower"] * controls, threshold=DEFAULT_THRESHOLD, alpha=alpha
        )
        caught += any(v in (SLOWER, FASTER) for v in verdicts)
    return Rate(
        f"controls moved {100 * move:g} %, {blocks} blocks, alpha {alpha:g}: drift caught", caught, trials, seed
    )


# ---------------------------------------------------------------- the controls' power


def controls_power(trials: int, sd: float, alpha: float, blocks: int, controls: int = 26) -> Rate:
    """control_power.power, what every comparison prints: ``controls``
    controls of block spread ``sd`` (of a block's log B/A) all moved by
    its 10 % drift, on ``blocks`` blocks, Holm at ``alpha``: drift caught
    (seed control_power.SEED)."""
    designs = [control_power.ControlDesign(f"c{i}", 2, 2, 2, sd / math.sqrt(2.0)) for i in range(controls)]
    found = control_power.power(
        control_power.on_blocks(designs, blocks), alpha=alpha, threshold=DEFAULT_THRESHOLD, trials=trials
    )
    return Rate(
        f"control power, {controls} controls, spread {100 * sd:g} %, alpha {alpha:g}, {blocks} blocks: "
        f"{100 * found.drift:g} % drift caught",
        round(found.power * trials),
        trials,
        found.seed,
    )


# ---------------------------------------------------------------- memqual compare on one look

PRIMARIES, OTHERS = 12, 112


def replicates(rng: np.random.Generator, n: int, spread: float, factor: float, drift: np.ndarray) -> list[list[float]]:
    """n replicates of 3 samples: a replicate-to-replicate spread (log
    normal), 1 % sample noise inside each, and a drift per block shared by
    A and B (the host's load over minutes)."""
    rep = rng.normal(0.0, spread, (n, 1))
    return [[float(x) for x in row] for row in factor * np.exp(drift[:, None] + rep + rng.normal(0.0, 0.01, (n, 3)))]


def compare_trial(
    rng: np.random.Generator,
    n: int,
    spread: float,
    effect: float,
    paired: bool,
    drift_sd: float = 0.0,
    others: int = OTHERS,
) -> tuple[list[Any], list[str]]:
    """One comparison: 12 primaries moved by ``effect`` on B and ``others``
    exploratory metrics unmoved, n replicates (blocks when ``paired``) a
    side: their ratio tests and roles."""
    tests = []
    blocks = list(range(n)) if paired else None
    for i in range(PRIMARIES + others):
        drift = rng.normal(0.0, drift_sd, n)
        ra = replicates(rng, n, spread, 1.0 + i, drift)
        rb = replicates(rng, n, spread, (1.0 + i) * (effect if i < PRIMARIES else 1.0), drift)
        tests.append(ab_tests.ratio_test(ra, rb, blocks, blocks))
    return tests, [PRIMARY] * PRIMARIES + [EXPLORATORY] * others


def compare_verdicts(tests: list[Any], roles: list[str], alpha: float = DEFAULT_ALPHA) -> list[str]:
    return families.decide(tests, roles, ["lower"] * len(tests), threshold=DEFAULT_THRESHOLD, alpha=alpha)[1]


def _design(n: int, paired: bool) -> str:
    return f"{n} blocks, paired" if paired else f"{n} a side, Welch"


def compare_flags(trials: int, n: int, paired: bool, seed: int = 19) -> Rate:
    """No effect, 12 primaries and 112 others, 3 % spread: any metric
    slower or faster."""
    rng = np.random.default_rng(seed)
    flagged = 0
    for _ in range(trials):
        verdicts = compare_verdicts(*compare_trial(rng, n, 0.03, 1.0, paired))
        flagged += any(v in (SLOWER, FASTER) for v in verdicts)
    return Rate(f"compare, no effect, {_design(n, paired)}: any metric flagged", flagged, trials, seed)


def compare_slower(trials: int, n: int, paired: bool, drift_sd: float = 0.0, seed: int = 20) -> tuple[Rate, Rate]:
    """B 10 % worse on every primary, 3 % spread (and ``drift_sd`` between
    blocks): the share of primaries found slower, and of the primary
    found least often."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(PRIMARIES, dtype=int)
    for _ in range(trials):
        verdicts = compare_verdicts(*compare_trial(rng, n, 0.03, 1.10, paired, drift_sd, others=0))
        counts += np.array([v == SLOWER for v in verdicts])
    what = f"compare, B 10 % worse, {_design(n, paired)}" + (f", {100 * drift_sd:g} % drift" if drift_sd else "")
    return (
        Rate(f"{what}: primaries slower (mean)", int(counts.sum()), trials * PRIMARIES, seed),
        Rate(f"{what}: the lowest primary slower", int(counts.min()), trials, seed),
    )


def compare_equivalent(trials: int, paired: bool, seed: int = 21) -> Rate:
    """B equal, 1 % spread, 6 a side: the share of primaries equivalent."""
    rng = np.random.default_rng(seed)
    found = 0
    for _ in range(trials):
        found += sum(v == EQUIVALENT for v in compare_verdicts(*compare_trial(rng, 6, 0.01, 1.0, paired, others=0)))
    return Rate(
        f"compare, B equal, 1 % spread, {_design(6, paired)}: primaries equivalent", found, trials * PRIMARIES, seed
    )


def compare_wrong_equivalence(trials: int, seed: int = 22) -> Rate:
    """B 6 % worse (outside the band), 1 % spread, 6 blocks: any primary
    equivalent."""
    rng = np.random.default_rng(seed)
    wrong = 0
    for _ in range(trials):
        wrong += any(v == EQUIVALENT for v in compare_verdicts(*compare_trial(rng, 6, 0.01, 1.06, True, others=0)))
    return Rate("compare, B 6 % worse, 6 blocks, paired: any primary equivalent", wrong, trials, seed)


def planned_looks(trials: int, seed: int = 23, planned: int = 10) -> tuple[Rate, Rate]:
    """A/A with blocks, a look after every block up to ``planned`` (a
    bisect probe's), alpha spent (k / planned)^2, a decided metric frozen:
    any primary flagged at any look; and the same looks each at the full
    alpha."""
    rng = np.random.default_rng(seed)
    spent_flags = naive_flags = 0
    for _ in range(trials):
        data = [
            (rng.normal(0.0, 0.03, planned) + rng.normal(0.0, 0.01, planned), rng.normal(0.0, 0.03, planned))
            for _ in range(PRIMARIES)
        ]
        spent_done = naive_done = False
        frozen: dict[int, str] = {}
        for look in range(2, planned + 1):
            blocks = list(range(look))
            tests = [
                ab_tests.ratio_test(
                    [[float(np.exp(x))] for x in a[:look]], [[float(np.exp(x))] for x in b[:look]], blocks, blocks
                )
                for a, b in data
            ]
            roles = [PRIMARY] * PRIMARIES
            level = ab_tests.spent_alpha(DEFAULT_ALPHA, look, planned)
            for i, v in enumerate(compare_verdicts(tests, roles, alpha=level)):
                if i not in frozen and v != UNDECIDED:
                    frozen[i] = v
            spent_done = spent_done or any(v in (SLOWER, FASTER) for v in frozen.values())
            naive = compare_verdicts(tests, roles, alpha=DEFAULT_ALPHA)
            naive_done = naive_done or any(v in (SLOWER, FASTER) for v in naive)
        spent_flags += spent_done
        naive_flags += naive_done
    return (
        Rate(f"planned looks to {planned}, alpha spent: any primary flagged", spent_flags, trials, seed),
        Rate(f"planned looks to {planned}, each at full alpha: any primary flagged", naive_flags, trials, seed),
    )


def compare_table(n: Callable[[int], int]) -> Iterator[Rate]:
    """The one-look table of docs/ab-calibration.md ("Measured")."""
    for paired in (False, True):
        yield compare_flags(n(800), 6, paired)
    yield from compare_slower(n(200), 6, False)
    yield from compare_slower(n(100), 6, True)
    yield from compare_slower(n(100), 8, True)
    yield from compare_slower(n(60), 8, False, drift_sd=0.10)
    yield from compare_slower(n(60), 8, True, drift_sd=0.10)
    for paired in (False, True):
        yield compare_equivalent(n(150), paired)
    yield compare_wrong_equivalence(n(200))
    yield from planned_looks(n(250))


# ---------------------------------------------------------------- the table


def history_table(n: Callable[[int], int]) -> Iterator[Rate]:
    """memqual history's figures: one series alone, then families."""
    for drift, walk, step, seed in (
        (0.0, False, 1.0, 421),
        (0.03, False, 1.0, 422),
        (0.05, False, 1.0, 423),
        (0.02, True, 1.0, 424),
        (0.0, False, 1.10, 425),
        (0.03, False, 1.10, 426),
    ):
        yield history_steps(n(2000), seed, drift, walk, step)
    fams: tuple[tuple[float | tuple[float, float], float, float, int, int, int], ...] = (
        (0.03, 0.0, 1.0, 0, 8, 441),
        (0.05, 0.0, 1.0, 0, 8, 442),
        (0.03, 0.03, 1.0, 0, 8, 443),
        ((0.005, 0.30), 0.0, 1.0, 0, 8, 444),
        (0.03, 0.0, 1.10, 10, 8, 445),
        (0.03, 0.0, 1.10, 1, 8, 446),
        (0.03, 0.0, 1.10, 5, 8, 451),
        ((0.005, 0.30), 0.0, 1.10, 10, 8, 447),
        (0.03, 0.0, 1.10, 10, 10, 450),
        (0.03, 0.0, 1.10, 10, 12, 448),
        (0.03, 0.0, 1.10, 10, 16, 449),
    )
    for spread, common, step, stepped, runs, seed in fams:
        false, found = history_family(n(300), seed, spread, common=common, step=step, stepped=stepped, runs=runs)
        if false.trials:
            yield false
        if step != 1.0:
            yield found


SECTIONS = ("drift", "unblocked", "history", "power", "looks", "table")


def table(scale: float = 1.0, only: Sequence[str] = SECTIONS) -> Iterator[Rate]:
    """Every figure, at ``scale`` times its trials, as it is measured;
    ``only``: these sections of it."""

    def n(trials: int) -> int:
        return max(20, int(trials * scale))

    if "drift" in only:
        yield from _drift_table(n)
    if "unblocked" in only:
        yield from _unblocked_table(n)
    if "history" in only:
        yield from history_table(n)
    if "power" in only:
        yield from _power_table(n)
    if "looks" in only:
        yield from _looks_table(n)
    if "table" in only:
        yield from compare_table(n)


def _drift_table(n: Callable[[int], int]) -> Iterator[Rate]:
    for blocks, seed in ((2, 401), (3, 402), (6, 403)):
        for level in (0.01, 0.0032):
            yield drift_alarm(n(500), seed, blocks, level)


def _unblocked_table(n: Callable[[int], int]) -> Iterator[Rate]:
    for offset, common, runs, seed in (
        (0.0, False, 1, 411),
        (0.03, False, 1, 412),
        (0.03, True, 1, 413),
        (0.0, False, 3, 414),
        (0.03, False, 3, 415),
        (0.03, True, 3, 416),
    ):
        yield from unblocked_compare(n(200 if runs == 1 else 400), seed, offset, common, runs)


def _power_table(n: Callable[[int], int]) -> Iterator[Rate]:
    for sd in (0.01, 0.02, 0.05):
        for level in (0.01, 0.0032, 0.001):
            for blocks in (2, 3, 4, 5, 6, 8):
                yield controls_power(n(200), sd, level, blocks)


def _looks_table(n: Callable[[int], int]) -> Iterator[Rate]:
    yield sequential_looks(n(2000), 431)
    yield sequential_looks(n(1000), 432, min_blocks=3)
    yield sequential_looks(n(3000), 433, looks=(3, 4, 5, 6, 7, 8, 9, 10))
    yield sequential_looks(n(3000), 434, looks=(8, 9, 10, 11, 12), min_blocks=8)
    yield sequential_looks(n(2000), 435, looks=(16, 17, 18, 19, 20))

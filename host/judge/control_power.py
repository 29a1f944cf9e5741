"""Can the negative controls say anything?  The chance that they would
have caught a host drift, measured by simulation through the real
decision code.

The share of simulated runs in which a 10 % drift of every control
(``DRIFT``) flags at least one, each control with the design and spread it
had, at the level the controls faced; below ``TARGET_POWER`` a run says
its controls cannot tell.  Why: docs/verdicts.md, "The negative controls'
power".
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

# The drift the controls must catch: every control's B / A 10 % off.
DRIFT = 0.10
# Below this chance of catching it, the controls' silence says nothing.
TARGET_POWER = 0.80
TRIALS = 400
SEED = 34


@dataclasses.dataclass(frozen=True)
class ControlDesign:
    """One control as its test saw it: blocks (paired) or replicates a
    side, and the standard error of its log ratio."""

    key: str
    n_blocks: int
    n_a: int
    n_b: int
    se: float

    @property
    def units(self) -> int:
        return self.n_blocks if self.n_blocks else min(self.n_a, self.n_b)

    @property
    def sd(self) -> float:
        """The spread of one unit's log ratio (paired: a block's B - A)."""
        if self.n_blocks:
            return self.se * math.sqrt(self.n_blocks)
        return self.se / math.sqrt(1.0 / self.n_a + 1.0 / self.n_b)


@dataclasses.dataclass(frozen=True)
class ControlPower:
    """The controls' chance of catching a drift of ``drift``, and on what."""

    controls: int
    units: int  # the fewest blocks (or replicates a side) among them
    paired: bool
    alpha: float
    drift: float
    power: float
    trials: int
    seed: int
    sd_median: float  # the controls' median spread of a unit's log ratio
    # Below the target: about how many blocks would reach it at this alpha
    # and spread (None: not searched, or more than NEEDED_UPTO).
    blocks_needed: int | None = None

    @property
    def sufficient(self) -> bool:
        return self.power >= TARGET_POWER

    def unit_text(self) -> str:
        return f"{self.units} block(s)" if self.paired else f"{self.units} replicate(s) a side"

    def line(self) -> str:
        """What the power says, in one line."""
        if self.controls == 0:
            return "no negative control was measured on both sides: nothing checks that the host held still"
        what = (
            f"{self.controls} negative control(s) on {self.unit_text()}, spread {self.sd_median:.1%} a unit: "
            f"a {self.drift:.0%} host drift would be caught in {self.power:.0%} of runs at alpha {self.alpha:.2g}"
        )
        if self.sufficient:
            return what
        need = f" (about {self.blocks_needed} blocks would reach it)" if self.blocks_needed else ""
        return f"{what}: below {TARGET_POWER:.0%}{need}, so the controls cannot tell whether the host drifted"

    def to_json(self) -> dict[str, Any]:
        return {
            "controls": self.controls,
            "units": self.units,
            "paired": self.paired,
            "alpha": self.alpha,
            "drift": self.drift,
            "power": self.power,
            "target": TARGET_POWER,
            "sufficient": self.sufficient,
            "trials": self.trials,
            "seed": self.seed,
            "sd_median": self.sd_median,
            "blocks_needed": self.blocks_needed,
        }


def alone(
    design: ControlDesign,
    *,
    alpha: float,
    threshold: float,
    drift: float = DRIFT,
    draws: int = 20000,
    seed: int = SEED,
) -> float:
    """One control's own power: the chance that it, moved by ``drift``
    with the spread it had on its units, is flagged at ``alpha`` (give
    Holm's first level, the family's alpha over its size, for a lower
    bound): its t beyond the two-sided critical value and its estimate
    beyond the margin, as ``families.decide`` flags.  Drawn, not
    integrated: the estimate as a normal and its spread as a scaled
    chi-square on the test's degrees of freedom (a paired t on blocks;
    the pooled t's for replicates a side, where Welch's is close)."""
    import numpy as np
    from scipy import special

    df = design.n_blocks - 1 if design.n_blocks else design.n_a + design.n_b - 2
    if df < 1 or design.se <= 0.0 or alpha <= 0.0:
        return 0.0
    rng = np.random.default_rng(seed)
    shift = math.log(1.0 + drift)
    estimate = rng.normal(shift, design.se, draws)
    se = design.se * np.sqrt(rng.chisquare(df, draws) / df)
    critical = float(special.stdtrit(df, 1.0 - alpha / 2.0))
    beyond = (estimate > math.log(1.0 + threshold)) | (estimate < math.log(1.0 - threshold))
    return float(np.mean((np.abs(estimate) / se > critical) & beyond))


def each(designs: Sequence[ControlDesign], found: ControlPower, *, threshold: float) -> dict[str, float]:
    """Every control's own power (``alone``) on the units and at the level
    the family's power ``found`` was taken at, Holm's first level over
    the family: what one control moved alone would be caught with."""
    if not designs or found.alpha <= 0.0:
        return {}
    level = found.alpha / len(designs)
    shaped = on_blocks(designs, found.units) if found.paired else list(designs)
    return {d.key: alone(d, alpha=level, threshold=threshold, drift=found.drift) for d in shaped}


def design_of(m: Any) -> ControlDesign | None:
    """A compared control's design, from its MetricComparison: the standard
    error from its 95 % t-interval on the log scale.  None when the test
    had no spread to go on (one unit) or no log-scale interval."""
    from scipy import special

    c = m.comparison
    n = c.n_blocks if c.n_blocks else min(c.n_replicates_a, c.n_replicates_b)
    if n < 2 or not (c.ci_low and c.ci_high and c.ci_low > 0 and math.isfinite(c.ci_high)):
        return None
    df = n - 1 if c.n_blocks else c.n_replicates_a + c.n_replicates_b - 2
    half = (math.log(c.ci_high) - math.log(c.ci_low)) / 2.0
    se = half / float(special.stdtrit(df, 0.5 + c.confidence / 2.0))
    return ControlDesign(m.key, c.n_blocks, c.n_replicates_a, c.n_replicates_b, se)


def power(
    designs: Sequence[ControlDesign],
    *,
    alpha: float,
    threshold: float,
    drift: float = DRIFT,
    trials: int = TRIALS,
    seed: int = SEED,
) -> ControlPower:
    """The share of ``trials`` simulated runs in which every control moved
    by ``drift`` flags at least one of them, through the real decision code
    (each control's family of controls, Holm at ``alpha``)."""
    import numpy as np

    from memqual.host.judge import families, primaries
    from memqual.host.judge.stats import ab_tests
    from memqual.host.judge.verdicts import FASTER, SLOWER

    designs = [d for d in designs if d.units >= 1]
    if not designs:
        return ControlPower(0, 0, False, alpha, drift, 0.0, 0, seed, 0.0)
    rng = np.random.default_rng(seed)
    shift = math.log(1.0 + drift)
    roles = [primaries.CONTROL] * len(designs)
    better = ["lower"] * len(designs)
    caught = 0
    for _ in range(trials):
        tests = []
        for d in designs:
            if d.n_blocks:
                blocks = list(range(d.n_blocks))
                # Paired: only a block's B - A matters, so A is the unit.
                b = rng.normal(shift, d.sd, d.n_blocks)
                tests.append(ab_tests.ratio_test([[1.0]] * d.n_blocks, [[math.exp(x)] for x in b], blocks, blocks))
            else:
                a = rng.normal(0.0, d.sd, d.n_a)
                b = rng.normal(shift, d.sd, d.n_b)
                tests.append(ab_tests.ratio_test([[math.exp(x)] for x in a], [[math.exp(x)] for x in b]))
        verdicts = families.decide(tests, roles, better, threshold=threshold, alpha=alpha)[1]
        caught += any(v in (SLOWER, FASTER) for v in verdicts)
    return ControlPower(
        controls=len(designs),
        units=min(d.units for d in designs),
        paired=all(d.n_blocks for d in designs),
        alpha=alpha,
        drift=drift,
        power=caught / trials,
        trials=trials,
        seed=seed,
        sd_median=float(np.median([d.sd for d in designs])),
    )


def designs_of(metrics: Sequence[Any]) -> list[ControlDesign]:
    """The designs of the compared controls among MetricComparisons, each
    on fewer than RELIABLE_UNITS units with a spread of at least the
    controls' median (see ``floored``)."""
    from memqual.host.judge.primaries import CONTROL

    return floored([d for m in metrics if m.role == CONTROL and m.comparable for d in [design_of(m)] if d])


# A spread from fewer units than this is taken at no less than the
# controls' median: from two blocks (one degree of freedom) a control's sd
# comes out below a fifth of its truth one time in six, and the power of a
# family of 26 would rest on its luckiest few.  Never lowering a spread
# keeps the power a lower bound.
RELIABLE_UNITS = 8


def floored(designs: Sequence[ControlDesign]) -> list[ControlDesign]:
    """The designs with a spread of at least the median of them all where
    they rest on fewer than RELIABLE_UNITS units."""
    if not designs:
        return []
    median = statistics.median(d.sd for d in designs)
    out = []
    for d in designs:
        if d.units < RELIABLE_UNITS and d.sd < median:
            scale = median / d.sd if d.sd > 0 else math.inf
            d = dataclasses.replace(d, se=d.se * scale if math.isfinite(scale) else median / math.sqrt(d.units))
        out.append(d)
    return out


def on_blocks(designs: Sequence[ControlDesign], blocks: int) -> list[ControlDesign]:
    """The paired designs as they were on ``blocks`` blocks, at the same spread."""
    out = []
    for d in designs:
        if d.n_blocks and blocks != d.n_blocks:
            d = dataclasses.replace(d, n_blocks=blocks, n_a=blocks, n_b=blocks, se=d.sd / math.sqrt(blocks))
        out.append(d)
    return out


def of_comparison(result: Any, alpha: float | None = None, **kwargs: Any) -> ControlPower:
    """The power of a RunComparison's compared controls, at ``alpha`` (the
    comparison's own when not given)."""
    return power(
        designs_of(result.metrics), alpha=result.alpha if alpha is None else alpha, threshold=result.threshold, **kwargs
    )


def over_looks(
    designs: Sequence[ControlDesign], looks: Sequence[tuple[int, int, float]], *, threshold: float, **kwargs: Any
) -> tuple[int | None, ControlPower]:
    """The best single look's power, over ``looks`` as (look, the controls'
    blocks, its level): a lower bound on the chance that some look flags
    a control (each look's group-sequential p is at most its raw p, and
    any look flagging is at least as likely as this one).  Returns that
    look and its power (look None: no look compared the controls)."""
    # No look that spent alpha on two blocks or more: nothing could flag.
    nothing = ControlPower(
        len(designs),
        min((d.units for d in designs), default=0),
        all(d.n_blocks for d in designs),
        0.0,
        kwargs.get("drift", DRIFT),
        0.0,
        0,
        kwargs.get("seed", SEED),
        float(statistics.median([d.sd for d in designs])) if designs else 0.0,
    )
    best: tuple[int | None, ControlPower] = (None, nothing)
    seen: dict[tuple[int, float], ControlPower] = {}
    for look, blocks, level in looks:
        if blocks < 2 or level <= 0.0:
            continue
        found = seen.get((blocks, level))
        if found is None:
            found = power(on_blocks(designs, blocks), alpha=level, threshold=threshold, **kwargs)
            seen[(blocks, level)] = found
        if best[0] is None or found.power >= best[1].power:
            best = (look, found)
    return best


def of_look(
    compared: Sequence[Any], at: tuple[int, int, float] | None, *, threshold: float
) -> tuple[int | None, ControlPower]:
    """The controls' power at the look just taken, on that look's
    comparisons (``compared``), ``at`` (the look, the controls' blocks
    then and the level it spent; None: no control ran): what the run
    writes of the look and what tells it whether the controls may leave
    the further blocks, simulated once for both.  The look, or None when
    it could flag nothing (no control, fewer than two blocks, no alpha
    spent)."""
    return over_looks(designs_of(compared), [at] if at is not None else [], threshold=threshold)


NEEDED_UPTO = 64


def with_blocks_needed(found: ControlPower, designs: Sequence[ControlDesign], *, threshold: float) -> ControlPower:
    """``found`` with, when it falls short on paired designs, about how many
    blocks would reach TARGET_POWER at its alpha and the same spreads
    (doubling, then halving the gap; 100 trials a step: about, not exactly)."""
    if found.sufficient or not found.paired or not designs or found.alpha <= 0:
        return found

    def enough(n: int) -> bool:
        return power(on_blocks(designs, n), alpha=found.alpha, threshold=threshold, trials=100).sufficient

    low, high = max(found.units, 2), max(found.units, 2) * 2
    while not enough(high):
        if high >= NEEDED_UPTO:
            return found
        low, high = high, min(2 * high, NEEDED_UPTO)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return dataclasses.replace(found, blocks_needed=high)

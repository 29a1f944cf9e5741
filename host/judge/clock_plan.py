"""The clock each scenario's test runs on under ``--clock auto``: the one on
which its primaries' measured block spreads (their rows' in the scenario
table, host/core/primary.py) decide them in fewer blocks.  A and B of a scenario always share it.

Why it is built so: docs/architecture.md, "Module notes",
host/judge/clock_plan.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Collection

from memqual.host.core import clock, scenario
from memqual.host.core.primary import GUEST_CLOCK, Primary, Spread

# About how many blocks equivalence at ``margin`` takes with a block spread
# ``sd``: the smallest n with n >= ((t(1 - alpha, n - 1) + t(1 - beta / 2,
# n - 1)) x sd / margin)^2, alpha 0.01 a side and power 0.8 at no change
# (both one-sided tests must pass, so beta halves).  The normal
# approximation (Z = 2.326 + 0.842 = 3.17) the margins' rule uses
# (host/core/primary.py) says half as many at a few blocks: at a 1.4 %
# spread and a 2 % margin it says 5, this says 10, and equivalence came in
# 35 % of A/As at 6 blocks and 95 % at 12 on synthetic truth
# (python tests/judge/test_margins_calibration.py 4000, seed 65).
BLOCKS_ALPHA = 0.01
BLOCKS_POWER = 0.8
BLOCKS_Z = 3.17
# Where even this many blocks would not do: the normal approximation's figure.
MOST_BLOCKS = 1000
# The first look that can decide a spread above zero is the third block's
# (a paired t on 2 blocks has one degree of freedom: docs/ab-calibration.md,
# "init_on_free=1 on icount").  A primary the wall clock decides there
# stays on it: a wall block costs several times less host time.
MIN_DECIDING_BLOCKS = 3
# Any icount label reads the same instruments (a primary keys on the kind).
ICOUNT_LABEL = clock.icount().label


def blocks_needed(spread: Spread | None, margin: float) -> float:
    """Blocks for equivalence at ``margin`` with this spread (a paired t
    over them, as the comparison runs it); infinite when it was never
    measured on that clock."""
    if spread is None:
        return math.inf
    return _blocks_for(spread.sd / margin)


@functools.cache
def _blocks_for(ratio: float) -> float:
    from scipy import stats  # only here: an e2e test's plan need not import it

    for n in range(MIN_DECIDING_BLOCKS, MOST_BLOCKS + 1):
        z = stats.t.ppf(1 - BLOCKS_ALPHA, n - 1) + stats.t.ppf(1 - (1 - BLOCKS_POWER) / 2, n - 1)
        if (z * ratio) ** 2 <= n:
            return float(n)
    return (BLOCKS_Z * ratio) ** 2


@dataclasses.dataclass(frozen=True)
class Choice:
    """Where one primary is decided under ``auto``, and why."""

    primary: Primary
    kind: str  # clock.WALL or clock.ICOUNT
    wall_blocks: float
    icount_blocks: float

    def line(self, plan: clock.Clock) -> str:
        """One line of the plan: the primary, the clock ``plan`` gives it
        (its label) and the blocks each clock's spread needs."""

        def blocks(n: float) -> str:
            return "not measured" if math.isinf(n) else f"about {max(n, 1):.0f} block(s)"

        on = plan.resolved(self.kind == clock.ICOUNT).label
        return (
            f"{self.primary.scenario} {named(self.primary, on)}: {on} "
            f"(equivalence needs {blocks(self.wall_blocks)} on wall, {blocks(self.icount_blocks)} on icount)"
        )


def named(primary: Primary, on: str, host_under_test: bool = False) -> str:
    """The primary's metric on ``on`` (on a host under test where
    ``host_under_test``), with its variant where its row has another
    primary of that metric."""
    row = scenario.find(primary.scenario)
    twins = row is not None and sum(p.metric == primary.metric for p in row.primaries) > 1
    return primary.named(on, host_under_test) if twins else primary.metric_on(on, host_under_test)


def choose(primary: Primary) -> Choice:
    """Icount where its spread there decides the primary in fewer blocks
    than the wall clock's and the wall clock cannot decide it at the
    first look that can; the wall clock otherwise (ties, unmeasured)."""
    wall = blocks_needed(primary.spread_wall, primary.margin_on(clock.WALL))
    on_icount = blocks_needed(primary.spread_icount, primary.margin_on(clock.ICOUNT))
    kind = clock.ICOUNT if on_icount < wall and wall > MIN_DECIDING_BLOCKS else clock.WALL
    return Choice(primary, kind, wall, on_icount)


def choices() -> tuple[Choice, ...]:
    return tuple(choose(p) for p in scenario.every_primary())


def icount_tests() -> frozenset[str]:
    """The e2e tests (``test_file_stem:Class.method``, the scenario rows'
    ``e2e``) that run on icount under ``auto``: those recording a primary
    decided there.  A test recording primaries of both kinds runs on
    icount: the guest's own timing is the one no other clock can give."""
    on_icount = {c.primary.scenario for c in choices() if c.kind == clock.ICOUNT}
    return frozenset(row.e2e for row in scenario.table() if row.name in on_icount and row.e2e)


def for_test(reference: str, plan: clock.Clock) -> clock.Clock:
    """The clock of the test ``reference`` (``test_file_stem:Class.method``)
    under ``plan``: a plan resolved (``auto``), any other clock as it is."""
    if not plan.auto:
        return plan
    return plan.resolved(reference in icount_tests())


def shares_host(row: scenario.Scenario[object]) -> bool:
    """Whether the guests of ``row`` may run beside other guests on icount:
    every primary it records is then read by the guest's own clock, a count
    of the guest's instructions that another guest's load on the host does
    not move, and it changes no host-wide state (no knob set).  A row with
    no primary, or one read by the host (its wall clock, ksmd's CPU time)
    or by a count the host paces (the floor's stall window), runs alone."""
    read = row.primaries
    return bool(read) and not row.knobs and all(p.instrument_on(ICOUNT_LABEL) == GUEST_CLOCK for p in read)


def beside_others_tests() -> frozenset[str]:
    """The e2e tests (``test_file_stem:Class.method``) whose every scenario
    row shares the host on icount (``shares_host``)."""
    rows: dict[str, list[scenario.Scenario[object]]] = {}
    for row in scenario.table():
        if row.e2e:
            rows.setdefault(row.e2e, []).append(row)
    return frozenset(test for test, its in rows.items() if all(shares_host(r) for r in its))


def runs_beside_others(reference: str, on: clock.Clock) -> bool:
    """Whether the test ``reference`` may run beside other such tests on
    the clock ``on`` (a plan is resolved first): only on icount, where
    what decides it is a count of its own guest's instructions."""
    return for_test(reference, on).icount and reference in beside_others_tests()


def describe_host_under_test(scenarios: Collection[str] | None = None) -> list[str]:
    """What ``memqual run`` prints for a host under test on icount: each
    primary (of ``scenarios``, the run's, where given) whose block spread
    was measured there (by an A/A, or by an A/B where the A/A's paired
    boots hide what moves it: its run's name says "against"), with the
    blocks equivalence at its margin there needs, and that the others
    were not."""
    lines = []
    for p in scenario.every_primary():
        spread = p.spread_host_under_test
        if spread is None or (scenarios is not None and p.scenario not in scenarios):
            continue
        margin = p.margin_on(ICOUNT_LABEL, host_under_test=True)
        blocks = max(blocks_needed(spread, margin), MIN_DECIDING_BLOCKS)  # a paired t decides from the third
        metric = named(p, ICOUNT_LABEL, host_under_test=True)
        # Most were measured by an A/A; one by two kernels (its run says so).
        source = "block spread of an A/B" if " against " in spread.run.what else "A/A block spread"
        lines.append(
            f"  {p.scenario} {metric}: {source} {100 * spread.sd:.2g} % over "
            f"{spread.blocks} blocks on a host under test: equivalence within {100 * margin:g} % in about "
            f"{blocks:.0f} block(s)"
        )
    others = "the other primaries" if lines else "every primary"
    lines.append(f"  {others}: no A/A spread measured on a host under test (docs/host-under-test.md)")
    return lines


def describe(plan: clock.Clock) -> list[str]:
    """What ``memqual run`` prints of an ``auto`` plan: each primary's
    clock and the blocks each clock's spread needs."""
    if not plan.auto:
        return []
    return [f"  {c.line(plan)}" for c in choices()]

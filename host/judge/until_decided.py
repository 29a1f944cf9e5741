"""``memqual run --until-decided``: when has a two-kernel run measured
enough, with the optional stopping accounted for, and which scenarios are
worth another block?

Why it is built so: docs/architecture.md, "Module notes", host/judge/until_decided.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memqual.host.judge.exit_status import ExitStatus, exit_rule

if TYPE_CHECKING:
    from memqual.host.judge.comparison import MetricComparison
    from memqual.host.judge.stats import ab_tests
    from memqual.host.judge.stats.group_sequential import Path
    from memqual.host.judge.verdicts import MetricStats

DECIDED = "decided"
UNDECIDED = "undecided"
# A scenario is left out once its primary needs more than this many times
# the blocks the budget can still give it: an estimate of the spread from
# 2-4 blocks is itself off by a factor of 2 or more.
FUTILITY_MARGIN = 2.0
# A need is judged from the first look on (two blocks).  Their spread has
# one degree of freedom, as likely a quarter of the true one as twice it,
# but waiting for a third block of everything costs more: measured through
# the real loop (docs/ab-calibration.md), judging from 2 blocks found a
# floor-like 8 % change in 17 % of runs against 7.5 % from 3 blocks, and
# 10 % changes on six noisy primaries in 5-35 % against 2-23 %.
MIN_BLOCKS_TO_JUDGE = 2
# A look on fewer blocks than this takes its Bonferroni share (the t's own
# p, exact at any degrees of freedom) and leaves no boundary for the later
# looks: the recursion treats the statistic as a Brownian motion's, and
# the t of a few blocks, through its p, is not one jointly -- one metric
# looked at on 3-6 blocks crossed the recursion's boundaries 1.25-1.7 times
# as often as its alpha, and still 1.15-1.27 times on 8-12 blocks (7-11
# degrees of freedom).  Matching the recursion's correlation between looks
# to the t's did not remove it (1.6 % at alpha 1 % on 3-10 blocks).  On
# 16-20 blocks the rate is alpha's (docs/ab-calibration.md, "Looks on few
# blocks", ``python -m memqual.host.cli.calibrate``).
MIN_BLOCKS_SEQUENTIAL = 16


@dataclasses.dataclass(frozen=True)
class AtLook:
    """A metric as one look compared it: what the deciding table shows of
    the look that decided it (or of its last look while undecided)."""

    look: int
    level: float  # the alpha that look spent
    verdict: str  # that look's: slower ... undecided, not comparable, runs differ
    stats: MetricStats

    def to_json(self) -> dict[str, Any]:
        return {"look": self.look, "level": self.level, **self.stats.to_json()}

    @classmethod
    def from_json(cls, data: Any, verdict: str) -> AtLook:
        from memqual.host.judge.verdicts import MetricStats

        return cls(int(data["look"]), float(data.get("level") or 0.0), verdict, MetricStats.from_json(data))


@dataclasses.dataclass
class MetricProgress:
    key: str
    history: list[tuple[int, bool, str]] = dataclasses.field(default_factory=list)  # (look, decided, verdict)
    scenario: str = ""
    role: str = "primary"
    frozen: str | None = None  # the verdict of the look that decided it
    decided_at: int | None = None
    blocks_needed: int | None = None
    blocks: int = 0  # the blocks it was compared on at the last look
    comparable: bool = True  # its arms' regimes matched at the last look
    # The score's paths not crossed at its looks so far, under no effect,
    # for the difference (two-sided) and the TOST (one-sided).
    difference: Path | None = None
    equivalence: Path | None = None
    # (look, blocks, nominal p of the difference's boundary, of the TOST's)
    boundaries: list[tuple[int, int, float, float]] = dataclasses.field(default_factory=list)
    # Its figures at the look that decided it (frozen with it), or at the
    # last look that compared it: what the deciding table shows.
    at_look: AtLook | None = None

    @property
    def decided(self) -> bool:
        return self.frozen is not None or (bool(self.history) and self.history[-1][1])

    @property
    def deciding_look(self) -> int | None:
        """The look that decided the metric (the first from which it stayed
        decided, for a history given without freezing)."""
        if self.decided_at is not None:
            return self.decided_at
        needed = None
        for look, decided, _ in self.history:
            if decided and needed is None:
                needed = look
            elif not decided:
                needed = None
        return needed

    @property
    def verdict(self) -> str:
        """As said: the frozen verdict, else the last look's text (an
        undecided one with what it would need)."""
        if self.frozen is not None:
            return self.frozen
        return self.history[-1][2] if self.history else ""

    @property
    def decision(self) -> str:
        """The verdict alone: the frozen one, else the last look's."""
        from memqual.host.judge.verdicts import UNDECIDED

        if self.frozen is not None:
            return self.frozen
        return self.at_look.verdict if self.at_look is not None else UNDECIDED

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenario": self.scenario,
            "role": self.role,
            "state": DECIDED if self.decided else UNDECIDED,
            "verdict": self.verdict,
            "decision": self.decision,
            "rounds_needed": self.deciding_look,
            "blocks_needed": self.blocks_needed,
            "blocks": self.blocks,
            "history": [{"look": r, "decided": d, "verdict": v} for r, d, v in self.history],
            "boundaries": [
                {"look": r, "blocks": n, "nominal_p": b, "nominal_p_equivalence": q} for r, n, b, q in self.boundaries
            ],
            "at_look": self.at_look.to_json() if self.at_look is not None else None,
        }

    @classmethod
    def from_json(cls, data: Any) -> MetricProgress:
        """What ``to_json`` wrote (until-decided.json's ``metrics``): a
        finished run's looks, for its page again.  A file from before
        ``decision`` was written: a decided metric's verdict is its word,
        an undecided one is undecided."""
        from memqual.host.judge.regime import NOT_COMPARABLE
        from memqual.host.judge.verdicts import UNDECIDED

        decided = data.get("state") == DECIDED
        decision = str(data.get("decision") or (data.get("verdict") if decided else UNDECIDED))
        at = data.get("at_look")
        return cls(
            key=str(data["key"]),
            history=[(int(h["look"]), bool(h["decided"]), str(h["verdict"])) for h in data.get("history") or []],
            scenario=str(data.get("scenario") or ""),
            role=str(data.get("role") or "primary"),
            frozen=decision if decided else None,
            decided_at=int(data["rounds_needed"]) if decided and data.get("rounds_needed") is not None else None,
            blocks_needed=None if data.get("blocks_needed") is None else int(data["blocks_needed"]),
            blocks=int(data.get("blocks") or 0),
            comparable=decision != NOT_COMPARABLE,
            boundaries=[
                (int(b["look"]), int(b["blocks"]), float(b["nominal_p"]), float(b["nominal_p_equivalence"]))
                for b in data.get("boundaries") or []
            ],
            at_look=AtLook.from_json(at, decision) if at else None,
        )


def compare_so_far(
    records_a: list[Any],
    records_b: list[Any],
    *,
    threshold: float,
    alpha: float,
    sequential: Callable[[str, ab_tests.RatioTest, float], tuple[float, float] | None] | None = None,
) -> list[MetricComparison]:
    """The MetricComparisons of the run so far at this level (empty when
    nothing is comparable yet: a failed block is undecided, not an error),
    on the ``sequential`` p-values where given: each arm's records merged
    into typed metric entries and compared once, at a host under test's
    margins where both arms' records ran on one."""
    from memqual.host.core.errors import BadInput
    from memqual.host.core.record import merge_rounds
    from memqual.host.judge import comparison
    from memqual.host.judge.results import metrics_of

    try:
        return comparison.compare_metrics(
            metrics_of(merge_rounds(records_a)),
            metrics_of(merge_rounds(records_b)),
            threshold=threshold,
            alpha=alpha,
            sequential=sequential,
            host_under_test=on_host_under_test(records_a) and on_host_under_test(records_b),
        )
    except BadInput:
        return []


def on_host_under_test(records: list[Any]) -> bool:
    """Whether an arm's records all ran on a host under test (each names
    it in its environment, as results.json's environment does)."""
    return bool(records) and all(r.environment.get("host_under_test") for r in records)


@dataclasses.dataclass(frozen=True)
class Look:
    """One look: when it fell and the share of alpha it spent."""

    look: int
    fraction: float  # of the budget's wall time spent (1.0: the last look)
    level: float  # the alpha this look spent
    tests: int  # the comparable metrics it saw

    def to_json(self) -> dict[str, Any]:
        return {"look": self.look, "fraction": round(self.fraction, 4), "alpha": self.level, "metrics": self.tests}

    @classmethod
    def from_json(cls, data: Any) -> Look:
        return cls(int(data["look"]), float(data["fraction"]), float(data["alpha"]), int(data.get("metrics") or 0))


@dataclasses.dataclass(frozen=True)
class LookResult:
    """What one look found: when it fell and the alpha it spent, the
    metrics it compared (its one comparison of the arms), and whether
    every primary is decided now."""

    look: Look
    compared: tuple[MetricComparison, ...]
    all_decided: bool

    @property
    def level(self) -> float:
        return self.look.level


@dataclasses.dataclass(frozen=True)
class Futile:
    """A scenario left out of the further blocks, and why."""

    scenario: str
    needed: int | None  # blocks its primary would need (None: more than 200)
    could_have: int  # blocks it would have had by the budget's end
    beside: int = 0  # the scenarios kept, closer to a decision, it would share blocks with

    def reason(self) -> str:
        need = "more than 200" if self.needed is None else f"about {self.needed}"
        where = f" beside the {self.beside} closer to a decision" if self.beside else ""
        return f"{self.scenario}: needs {need} blocks, the budget gives it about {self.could_have}{where}"


@dataclasses.dataclass
class Tracker:
    """The metrics' progress over the looks of one run."""

    threshold: float
    alpha: float
    metrics: dict[str, MetricProgress] = dataclasses.field(default_factory=dict)
    last_look: int = 0
    controls_flagged: set[str] = dataclasses.field(default_factory=set)
    looks: list[Look] = dataclasses.field(default_factory=list)
    futile: dict[str, Futile] = dataclasses.field(default_factory=dict)
    # False: each look tests at its own share of alpha (Bonferroni over the
    # looks), as the calibration's reference.
    group_sequential: bool = True
    # Where a look's MetricComparisons come from: ``compare_so_far`` (the run's
    # records merged and compared) unless given; the calibration gives its
    # synthetic blocks' (host/run/calibrate.py).
    comparisons_of: Callable[..., list[Any]] | None = None
    min_blocks_sequential: int = 0  # 0: MIN_BLOCKS_SEQUENTIAL

    @property
    def fraction_spent(self) -> float:
        return self.looks[-1].fraction if self.looks else 0.0

    @property
    def alpha_left(self) -> float:
        return max(0.0, self.alpha - sum(look.level for look in self.looks))

    def level_at(self, fraction: float) -> float:
        """The alpha a look at this fraction of the budget would spend."""
        from memqual.host.judge.stats import ab_tests

        return min(self.alpha_left, ab_tests.spent_alpha_by_time(self.alpha, self.fraction_spent, fraction))

    def update(self, look: int, records_a: list[Any], records_b: list[Any], fraction: float = 1.0) -> LookResult:
        """Take the run after block ``look``, at ``fraction`` of the budget
        spent (1.0 on the last look): the arms compared once, each metric
        not frozen yet moved on."""
        from memqual.host.judge.primaries import PRIMARY

        self.last_look = look
        fraction = max(fraction, self.fraction_spent)
        level = self.level_at(fraction)
        sequential = self.sequential_p if self.group_sequential else None
        source = self.comparisons_of or compare_so_far
        now = (
            source(records_a, records_b, threshold=self.threshold, alpha=level, sequential=sequential)
            if level > 0
            else []
        )
        taken = Look(look, fraction, level, len(now))
        self.looks.append(taken)
        for m in now:
            self.take(look, level, m)
        if self.group_sequential:
            self.add_boundaries(look, now, level)
        primaries = [p for p in self.metrics.values() if p.role == PRIMARY]
        return LookResult(taken, tuple(now), bool(primaries) and all(p.decided for p in primaries))

    def take(self, look: int, level: float, m: MetricComparison) -> None:
        """One metric as this look compared it, unless frozen before."""
        from memqual.host.judge import comparison, verdicts
        from memqual.host.judge.primaries import CONTROL
        from memqual.host.judge.regime import NOT_COMPARABLE

        progress = self.metrics.setdefault(m.key, MetricProgress(m.key, scenario=m.scenario, role=m.role))
        if progress.frozen is not None:
            progress.history.append((look, True, progress.frozen))
            return
        # A metric whose regimes differ is not decided: a later look may
        # find them matched; a look outside blocks (a block failed)
        # describes, it decides nothing.  Any other verdict is a
        # crossing -- of the difference's boundary (slower, faster, or
        # changed inside the margin) or the TOST's (equivalent) -- and
        # freezes the metric whatever its ratio: the recursion takes a
        # path that crossed as stopped.
        decided = m.verdict not in (verdicts.UNDECIDED, NOT_COMPARABLE, verdicts.RUNS_DIFFER)
        progress.history.append((look, decided, comparison.verdict_text(m)))
        progress.blocks_needed = m.comparison.blocks_needed
        progress.blocks = m.comparison.n_blocks
        progress.comparable = m.verdict != NOT_COMPARABLE
        progress.at_look = AtLook(look, level, m.verdict, m.comparison)
        if decided:
            progress.frozen, progress.decided_at = m.verdict, look
            if m.role == CONTROL and m.flagged:
                self.controls_flagged.add(m.key)

    def paths(self, key: str) -> tuple[Path, Path]:
        """A metric's paths so far (difference, TOST); new ones before its first look."""
        from memqual.host.judge.stats.group_sequential import Path

        progress = self.metrics.get(key)
        difference = progress.difference if progress and progress.difference else Path(two_sided=True)
        equivalence = progress.equivalence if progress and progress.equivalence else Path(two_sided=False)
        return difference, equivalence

    def sequential_p(
        self, key: str, test: ab_tests.RatioTest, margin: float | None = None
    ) -> tuple[float, float] | None:
        """A metric's p-values at this look on the increment scale: the
        chance under no effect of a statistic this extreme now and none
        beyond the boundaries of its looks before; its TOST at its own
        ``margin`` (a primary's, host/judge/primaries.py), else the
        threshold.  None (the raw p) for a frozen metric, an untestable
        one, and a look on fewer than MIN_BLOCKS_SEQUENTIAL blocks."""
        progress = self.metrics.get(key)
        units = test.units
        least = self.min_blocks_sequential or MIN_BLOCKS_SEQUENTIAL
        if (progress and progress.frozen is not None) or not test.testable or units < least:
            return None
        difference, equivalence = self.paths(key)
        if units < difference.information:
            return None
        p, q = test.p_difference(), test.p_equivalence(self.threshold if margin is None else margin)
        return difference.p_value(units, p), equivalence.p_value(units, q)

    def add_boundaries(self, look: int, now: list[Any], level: float) -> None:
        """Each metric tested on the sequential scale at this look takes the
        boundary of the Bonferroni share it would have had: the look's
        level over the comparable members of its family.  Holm's levels
        are never below that share, so a metric beyond this boundary was
        rejected; a share's boundary is the most severe one the metric
        could have faced, and the largest region "not crossed" for the
        looks after, which makes their p-values the largest."""
        from memqual.host.judge import families

        members: dict[str, int] = {}
        for m in now:
            if m.comparable:
                members[m.role] = members.get(m.role, 0) + 1
        for m in now:
            progress = self.metrics.get(m.key)
            if progress is None or progress.frozen is not None or m.comparison.p_sequential is None:
                continue
            share = families.family_alpha(m.role, level) / members[m.role]
            units = m.comparison.units
            difference, equivalence = self.paths(m.key)
            z_difference = difference.boundary(units, share)
            z_equivalence = equivalence.boundary(units, share)
            progress.difference = difference.after(units, z_difference)
            progress.equivalence = equivalence.after(units, z_equivalence)
            progress.boundaries.append(
                (look, units, difference.nominal(z_difference), equivalence.nominal(z_equivalence))
            )

    def undecided(self) -> list[MetricProgress]:
        return [m for m in self.metrics.values() if not m.decided]

    def undecided_scenarios(self) -> set[str]:
        """The scenarios with a primary still undecided."""
        from memqual.host.judge.primaries import PRIMARY

        return {m.scenario for m in self.metrics.values() if m.role == PRIMARY and not m.decided}

    def worth_a_block(self, left_s: float, block_s: Callable[[set[str]], float]) -> set[str]:
        """The undecided scenarios another block should run: those whose
        primaries could be decided in what is left of the budget.

        Scenarios are taken cheapest to decide first (fewest blocks
        needed); one is kept when, with it, every kept scenario's need is
        within FUTILITY_MARGIN times the blocks it has plus those that fit
        in ``left_s`` at ``block_s(kept)`` seconds a block.  The others are
        left out for good (``futile``).  A need not judged yet (a primary
        on fewer than MIN_BLOCKS_TO_JUDGE blocks, or not comparable) keeps
        its scenario."""
        from memqual.host.judge.primaries import PRIMARY

        need: dict[str, tuple[int, int | None]] = {}  # scenario -> (blocks now, blocks needed)
        for m in self.metrics.values():
            if m.role != PRIMARY or m.decided or m.scenario in self.futile:
                continue
            # A metric whose regimes differ has no need to judge: it runs
            # on, as a later look may find its regimes matched.
            known = m.blocks >= MIN_BLOCKS_TO_JUDGE and m.comparable
            wanted = m.blocks_needed if known else m.blocks
            now, worst = need.get(m.scenario, (m.blocks, 0))
            if worst is None or (known and wanted is None):
                need[m.scenario] = (min(now, m.blocks), None)
            else:
                need[m.scenario] = (min(now, m.blocks), max(worst, wanted or 0))

        def fits(kept: list[str]) -> bool:
            cost = block_s(set(kept))
            more = int(max(0.0, left_s) // cost) if cost > 0 else 0
            for scenario in kept:
                now, needed = need[scenario]
                if needed is None or needed > FUTILITY_MARGIN * (now + more):
                    return False
            return True

        kept: list[str] = []
        order = sorted(need, key=lambda s: (need[s][1] is None, need[s][1] or 0, s))
        for scenario in order:
            if need[scenario][1] is not None and fits([*kept, scenario]):
                kept.append(scenario)
        for scenario in order:
            if scenario not in kept:
                # What it would have had beside the scenarios kept, all of
                # them closer to a decision.
                cost = block_s({*kept, scenario})
                more = int(max(0.0, left_s) // cost) if cost > 0 else 0
                self.futile[scenario] = Futile(scenario, need[scenario][1], need[scenario][0] + more, len(kept))
        return set(kept)

    def progress_line(self) -> str:
        """The last look in one line: its share of alpha, and the primaries
        decided and not."""
        from memqual.host.judge.primaries import PRIMARY

        primaries = sorted((m for m in self.metrics.values() if m.role == PRIMARY), key=lambda m: m.key)
        decided = [f"{m.scenario} {m.verdict}" for m in primaries if m.decided]
        level = self.looks[-1].level if self.looks else 0.0
        return (
            f"look {self.last_look}: alpha {level:.2g} spent, {len(decided)} of {len(primaries)} primaries decided"
            + (f" ({', '.join(decided)})" if decided else "")
        )

    def exit_status(self) -> ExitStatus:
        """The exit rule on the looks' decisions: a negative control moved
        (the host drifted), a primary decided slower, or neither."""
        from memqual.host.judge.primaries import PRIMARY
        from memqual.host.judge.verdicts import SLOWER

        slower = any(m.role == PRIMARY and m.frozen == SLOWER for m in self.metrics.values())
        return exit_rule(host_drifted=bool(self.controls_flagged), slower=slower)

    def futile_reasons(self, scenarios: set[str]) -> list[str]:
        return [self.futile[s].reason() for s in sorted(scenarios) if s in self.futile]

    def to_json(self, stopped: str, budget_min: float) -> dict[str, Any]:
        from memqual.host.judge.primaries import PRIMARY

        primaries = [m for m in self.metrics.values() if m.role == PRIMARY]
        return {
            "rounds": self.last_look,
            "looks": self.last_look,
            "stopped": stopped,
            "budget_min": budget_min,
            "threshold": self.threshold,
            "alpha": self.alpha,
            "alpha_spending": "alpha t^2 by the time t of the budget has gone (the last look spends what is left)",
            "alpha_by_look": [look.level for look in self.looks],
            "look_times": [look.to_json() for look in self.looks],
            "decided": sum(1 for m in self.metrics.values() if m.decided),
            "undecided": len(self.undecided()),
            "primaries_decided": sum(1 for m in primaries if m.decided),
            "primaries_undecided": sum(1 for m in primaries if not m.decided),
            "undecided_scenarios": sorted(self.undecided_scenarios()),
            "left_out": [f.reason() for f in self.futile.values()],
            "host_drifted": bool(self.controls_flagged),
            "controls_flagged": sorted(self.controls_flagged),
            "metrics": [self.metrics[k].to_json() for k in sorted(self.metrics)],
        }

    @classmethod
    def from_json(cls, data: Any) -> Tracker:
        """The looks' state ``to_json`` wrote: what a finished run decided,
        for its page again (who was left out, and why, stays text)."""
        tracker = cls(threshold=float(data["threshold"]), alpha=float(data["alpha"]))
        tracker.last_look = int(data.get("rounds") or 0)
        tracker.looks = [Look.from_json(x) for x in data.get("look_times") or []]
        tracker.controls_flagged = {str(k) for k in data.get("controls_flagged") or []}
        for m in data.get("metrics") or []:
            progress = MetricProgress.from_json(m)
            tracker.metrics[progress.key] = progress
        return tracker

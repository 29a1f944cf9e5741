"""``memqual run --until-decided``: when has a two-kernel run measured
enough, with the optional stopping accounted for?

The run loop calls ``Tracker.update(look, records_a, records_b)`` after
every block (one A and one B guest of every scenario still running; the
look is the count of blocks so far) and adds blocks only for
``undecided_scenarios()``, until ``update`` says every primary is decided
or the budget is spent.  At each look the run so far is compared as
``memqual compare`` would (host/judge/comparison.py: families, Holm over the
primaries, TOST for equivalence), and a metric is **decided** when its
verdict is ``slower``, ``faster`` or ``equivalent``.  A decided metric is
frozen: its verdict is the one of the look that decided it, and later
blocks of other scenarios do not re-decide it.

Looking after every block and stopping when something is decided is
optional stopping: at a fixed alpha every look would be another chance
of a wrong decision.  So each look spends only its share of alpha
(``ab_tests.spent_alpha``: the power spending function alpha (k / K)^2 over
K planned looks, close to O'Brien-Fleming's boundaries, little early and
most late), and the shares sum to alpha: however the looks fall, the
chance of any wrong decision (a change where there is none, or
equivalence where there is a change beyond the threshold) over the whole
run is at most alpha, per family.  Past the K planned looks nothing is
left to spend and nothing more is decided.  The false-positive rate this
gives is measured in tests/test_ab_calibration.py (docs/ab-calibration.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

DECIDED = "decided"
UNDECIDED = "undecided"
# The looks an until-decided run plans for (blocks of every scenario): the
# spending function spreads alpha over these.
PLANNED_LOOKS = 10


@dataclasses.dataclass
class MetricProgress:
    key: str
    history: list[tuple[int, bool, str]] = dataclasses.field(default_factory=list)  # (look, decided, verdict)
    scenario: str = ""
    role: str = "primary"
    frozen: str | None = None  # the verdict of the look that decided it
    decided_at: int | None = None
    blocks_needed: int | None = None

    @property
    def decided(self) -> bool:
        return self.frozen is not None or (bool(self.history) and self.history[-1][1])

    @property
    def rounds_needed(self) -> int | None:
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
        if self.frozen is not None:
            return self.frozen
        return self.history[-1][2] if self.history else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenario": self.scenario,
            "role": self.role,
            "state": DECIDED if self.decided else UNDECIDED,
            "verdict": self.verdict,
            "rounds_needed": self.rounds_needed,
            "blocks_needed": self.blocks_needed,
            "history": [{"look": r, "decided": d, "verdict": v} for r, d, v in self.history],
        }


def _results_of(records: list[Any]) -> dict[str, Any]:
    """What compare_results needs of a results.json, from records."""
    from memqual.host.core.record import merge_rounds
    from memqual.host.judge.results import memqual_version, metrics_of

    return {
        "memqual_version": memqual_version(),
        "metrics": metrics_of(merge_rounds(records)),
        "claims": [],
        "environment": {},
    }


def decisions(records_a: list[Any], records_b: list[Any], *, threshold: float, alpha: float) -> list[Any]:
    """The MetricComparisons of the run so far at this level (empty when
    nothing is comparable yet: a failed block is undecided, not an error)."""
    from memqual.host.core.errors import BadInput
    from memqual.host.judge import comparison

    try:
        result = comparison.compare_results(
            _results_of(records_a), _results_of(records_b), threshold=threshold, alpha=alpha
        )
    except BadInput:
        return []
    return result.metrics


@dataclasses.dataclass
class Tracker:
    """The metrics' progress over the looks of one run."""

    threshold: float
    alpha: float
    planned_looks: int = PLANNED_LOOKS
    metrics: dict[str, MetricProgress] = dataclasses.field(default_factory=dict)
    rounds: int = 0
    controls_flagged: set[str] = dataclasses.field(default_factory=set)

    def alpha_at(self, look: int) -> float:
        from memqual.host.core import ab_tests

        return ab_tests.spent_alpha(self.alpha, look, self.planned_looks)

    def update(self, look: int, records_a: list[Any], records_b: list[Any]) -> bool:
        """Take the run after block ``look``; True when every primary is decided."""
        from memqual.host.judge import comparison

        self.rounds = look
        level = self.alpha_at(look)
        now = decisions(records_a, records_b, threshold=self.threshold, alpha=level) if level > 0 else []
        for m in now:
            progress = self.metrics.setdefault(m.key, MetricProgress(m.key, scenario=m.scenario, role=m.role))
            if progress.frozen is not None:
                progress.history.append((look, True, progress.frozen))
                continue
            # A metric whose regimes differ is not decided: a later look may find them matched.
            decided = m.verdict not in (comparison.UNDECIDED, comparison.NOT_COMPARABLE)
            text = comparison.verdict_text(m)
            progress.history.append((look, decided, text))
            progress.blocks_needed = m.comparison.blocks_needed
            if decided:
                progress.frozen, progress.decided_at = m.verdict, look
                if m.role == comparison.CONTROL and m.flagged:
                    self.controls_flagged.add(m.key)
        primaries = [p for p in self.metrics.values() if p.role == comparison.PRIMARY]
        return bool(primaries) and all(p.decided for p in primaries)

    def undecided(self) -> list[MetricProgress]:
        return [m for m in self.metrics.values() if not m.decided]

    def undecided_scenarios(self) -> set[str]:
        """The scenarios with a primary still undecided: the ones that need
        another block."""
        from memqual.host.judge.comparison import PRIMARY

        return {m.scenario for m in self.metrics.values() if m.role == PRIMARY and not m.decided}

    def to_json(self, stopped: str, budget_min: float) -> dict[str, Any]:
        from memqual.host.judge.comparison import PRIMARY

        primaries = [m for m in self.metrics.values() if m.role == PRIMARY]
        return {
            "rounds": self.rounds,
            "looks": self.rounds,
            "stopped": stopped,
            "budget_min": budget_min,
            "threshold": self.threshold,
            "alpha": self.alpha,
            "alpha_spending": f"alpha (k / {self.planned_looks})^2 over {self.planned_looks} planned looks",
            "alpha_by_look": [self.alpha_at(k) for k in range(1, self.rounds + 1)],
            "decided": sum(1 for m in self.metrics.values() if m.decided),
            "undecided": len(self.undecided()),
            "primaries_decided": sum(1 for m in primaries if m.decided),
            "primaries_undecided": sum(1 for m in primaries if not m.decided),
            "undecided_scenarios": sorted(self.undecided_scenarios()),
            "host_drifted": bool(self.controls_flagged),
            "controls_flagged": sorted(self.controls_flagged),
            "metrics": [self.metrics[k].to_json() for k in sorted(self.metrics)],
        }

"""``memqual run --until-decided``: when has a two-kernel run measured
enough?

After every round (A and B once each) the run so far is compared as
``memqual compare`` would (host/compare.py: replicate-level tests, Holm
over every metric).  A metric is **decided** when

- its verdict is ``slower`` or ``faster`` (significant after Holm and
  beyond the threshold), or
- its 95% CI of B / A lies wholly inside the threshold band (the kernels
  do not differ by as much as the threshold: the same rule that makes a
  bisect probe good, host/bisect/decide.py).

Anything else -- underpowered, or a CI that reaches past the band's edge --
is undecided and asks for another round, until every metric is decided or
the budget is spent.  What each metric needed is kept: the first round
after which it stayed decided.  (Looking after every round is optional
stopping; the CI rule does not correct for it, which is one reason a
decision needs at least two replicates a side.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memqual.host.bisect.decide import SAME, band_verdict

DECIDED = "decided"
UNDECIDED = "undecided"


@dataclasses.dataclass
class MetricProgress:
    key: str
    history: list[tuple[int, bool, str]] = dataclasses.field(default_factory=list)  # (round, decided, verdict)

    @property
    def decided(self) -> bool:
        return bool(self.history) and self.history[-1][1]

    @property
    def rounds_needed(self) -> int | None:
        """The first round from which the metric stayed decided."""
        needed = None
        for round_no, decided, _ in self.history:
            if decided and needed is None:
                needed = round_no
            elif not decided:
                needed = None
        return needed

    def to_json(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else (0, False, "")
        return {
            "key": self.key,
            "state": DECIDED if self.decided else UNDECIDED,
            "verdict": last[2],
            "rounds_needed": self.rounds_needed,
            "history": [{"round": r, "decided": d, "verdict": v} for r, d, v in self.history],
        }


def _results_of(records: list[Any]) -> dict[str, Any]:
    """What compare_results needs of a results.json, from records."""
    from memqual.host.record import merge_rounds
    from memqual.host.results import memqual_version, metrics_of

    return {
        "memqual_version": memqual_version(),
        "metrics": metrics_of(merge_rounds(records)),
        "claims": [],
        "environment": {},
    }


def decisions(
    records_a: list[Any], records_b: list[Any], *, threshold: float, alpha: float
) -> dict[str, tuple[bool, str]]:
    """key -> (decided, verdict) for the metrics both sides have."""
    from memqual.host import compare
    from memqual.host.errors import BadInput

    try:
        result = compare.compare_results(
            _results_of(records_a), _results_of(records_b), threshold=threshold, alpha=alpha
        )
    except BadInput:
        return {}  # nothing comparable yet (a failed round): undecided, not an error
    out = {}
    for m in result.metrics:
        c = m.comparison
        same = band_verdict(c.ci_low, c.ci_high, threshold) == SAME and min(c.n_replicates_a, c.n_replicates_b) >= 2
        decided = m.verdict in (compare.SLOWER, compare.FASTER) or (m.verdict == compare.NO_DIFFERENCE and same)
        text = m.verdict if m.verdict != compare.UNDERPOWERED else f"underpowered (needs {c.replicates_needed} a side)"
        out[m.key] = (decided, text)
    return out


@dataclasses.dataclass
class Tracker:
    """The metrics' progress over the rounds of one run."""

    threshold: float
    alpha: float
    metrics: dict[str, MetricProgress] = dataclasses.field(default_factory=dict)
    rounds: int = 0

    def update(self, round_no: int, records_a: list[Any], records_b: list[Any]) -> bool:
        """Take the run after round ``round_no``; True when all is decided."""
        self.rounds = round_no
        now = decisions(records_a, records_b, threshold=self.threshold, alpha=self.alpha)
        for key, (decided, verdict) in now.items():
            self.metrics.setdefault(key, MetricProgress(key)).history.append((round_no, decided, verdict))
        return bool(now) and all(decided for decided, _ in now.values())

    def undecided(self) -> list[MetricProgress]:
        return [m for m in self.metrics.values() if not m.decided]

    def to_json(self, stopped: str, budget_min: float) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "stopped": stopped,
            "budget_min": budget_min,
            "threshold": self.threshold,
            "alpha": self.alpha,
            "decided": sum(1 for m in self.metrics.values() if m.decided),
            "undecided": len(self.undecided()),
            "metrics": [self.metrics[k].to_json() for k in sorted(self.metrics)],
        }

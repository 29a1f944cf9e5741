"""The deciding table: each metric's decision as it set the exit status.

Why it is built so: docs/architecture.md, "Module notes", host/judge/decisions.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from memqual.host.judge.comparison import MetricComparison, RunComparison, short_labels, verdict_text
from memqual.host.judge.exit_status import ExitStatus
from memqual.host.judge.primaries import CONTROL, PRIMARY
from memqual.host.judge.regime import NOT_COMPARABLE
from memqual.host.judge.sequential_run import AddedBlock, SequentialRun
from memqual.host.judge.until_decided import MetricProgress
from memqual.host.judge.verdicts import EQUIVALENT, FASTER, SLOWER, UNDECIDED

ONE_LOOK = "one comparison at alpha"
SEQUENTIAL = "the looks of --until-decided"
# A metric the looks never compared (measured only after them, or never
# comparable at a look): the descriptive table is all there is of it.
NOT_LOOKED_AT = "not looked at"


@dataclasses.dataclass(frozen=True)
class Decision:
    """One metric's decision and what it rests on."""

    key: str
    label: str
    scenario: str
    metric: str
    unit: str
    better: str
    role: str
    verdict: str  # slower, faster, equivalent, undecided, not comparable
    text: str  # the verdict as said (an undecided one with what it would need)
    look: int | None  # the look that decided it; None while undecided
    looks: int  # the looks that compared it
    blocks: int  # blocks (paired) or units a side at that look
    paired: bool
    minutes: float | None  # when that look fell (--until-decided)
    ratio: float
    ci_low: float
    ci_high: float
    a_median: float
    b_median: float
    p: float  # the p that faced the level: a look's group-sequential p' where there was one
    level: float  # the level it faced in its family (Holm's or BH's share of the look's alpha)
    test: str  # "difference" or "equivalence (TOST)": which p and level
    nominal_p: float | None  # the raw-p boundary of the look (group-sequential looks only)
    margin: float  # the threshold: a change counts beyond it, equivalence is within it

    @property
    def decided(self) -> bool:
        return self.verdict in (SLOWER, FASTER, EQUIVALENT)

    def to_json(self) -> dict[str, Any]:
        def finite(x: float | None) -> float | None:
            return x if x is not None and math.isfinite(x) else None

        return {
            "key": self.key,
            "scenario": self.scenario,
            "metric": self.metric,
            "role": self.role,
            "verdict": self.verdict,
            "verdict_text": self.text,
            "look": self.look,
            "looks": self.looks,
            "blocks": self.blocks,
            "paired": self.paired,
            "minutes": self.minutes,
            "ratio": finite(self.ratio),
            "ci": [finite(self.ci_low), finite(self.ci_high)],
            "p": self.p,
            "level": self.level,
            "test": self.test,
            "nominal_p_boundary": self.nominal_p,
            "margin": self.margin,
        }


@dataclasses.dataclass(frozen=True)
class LookRow:
    """One look of --until-decided as the table lists it."""

    look: int
    minutes: float | None  # when it fell
    fraction: float  # of the budget's clock
    alpha: float  # what it spent
    metrics: int  # the comparable metrics it saw
    decided: tuple[str, ...]  # the labels of the metrics it decided
    next_block: AddedBlock | None  # the block added after it

    def to_json(self) -> dict[str, Any]:
        return {
            "look": self.look,
            "minutes": self.minutes,
            "fraction": round(self.fraction, 4),
            "alpha": self.alpha,
            "metrics": self.metrics,
            "decided": list(self.decided),
            "next_block": self.next_block.to_json() if self.next_block is not None else None,
        }


@dataclasses.dataclass(frozen=True)
class DecidingTable:
    """Every metric's decision, how they were made, and the exit status they set."""

    decided_by: str  # ONE_LOOK or SEQUENTIAL
    alpha: float
    margin: float
    rows: tuple[Decision, ...]
    exit_status: ExitStatus
    host_drifted: bool
    looks: tuple[LookRow, ...] = ()
    stopped: str = ""
    sequential: bool = False

    def of_role(self, role: str) -> list[Decision]:
        return [r for r in self.rows if r.role == role]

    @property
    def regressions(self) -> list[Decision]:
        return [r for r in self.rows if r.role == PRIMARY and r.verdict == SLOWER]

    @property
    def controls_flagged(self) -> list[Decision]:
        return [r for r in self.rows if r.role == CONTROL and r.verdict in (SLOWER, FASTER)]

    def to_json(self) -> dict[str, Any]:
        return {
            "decided_by": self.decided_by,
            "alpha": self.alpha,
            "margin": self.margin,
            "exit_status": int(self.exit_status),
            "host_drifted": self.host_drifted,
            "stopped": self.stopped or None,
            "looks": [look.to_json() for look in self.looks],
            "rows": [r.to_json() for r in self.rows],
        }


def _row(m: MetricComparison, label: str, threshold: float) -> dict[str, Any]:
    """The figures a row takes from the full comparison (names, medians)."""
    c = m.comparison
    return {
        "key": m.key,
        "label": label,
        "scenario": m.scenario,
        "metric": m.metric,
        "unit": m.unit,
        "better": m.better,
        "role": m.role,
        "a_median": c.a.median,
        "b_median": c.b.median,
        # The margin the metric was judged against: a primary's own, else the threshold.
        "margin": c.margin or threshold,
    }


def _test_of(verdict: str, p: float, p_eq: float, level: float, level_eq: float) -> tuple[float, float, str]:
    """The p and level a verdict rests on: the TOST's for equivalence, the
    difference's otherwise (undecided: the difference's, the nearer to a
    change)."""
    if verdict == EQUIVALENT:
        return p_eq, level_eq, "equivalence (TOST)"
    return p, level, "difference"


def one_look(result: RunComparison) -> DecidingTable:
    """A single comparison's decisions (``memqual compare``, a run of fixed blocks)."""
    labels = short_labels(result.metrics)
    rows = []
    for m in result.metrics:
        c = m.comparison
        rows.append(
            _of_whole_run(
                m,
                _row(m, labels[m.key], result.threshold),
                _test_of(m.verdict, c.p_value, c.p_equivalence, c.alpha_difference, c.alpha_equivalence),
                verdict=m.verdict,
                text=verdict_text(m),
                look=1 if m.verdict in (SLOWER, FASTER, EQUIVALENT) else None,
                looks=1 if m.comparable else 0,
            )
        )
    return DecidingTable(
        ONE_LOOK,
        result.alpha,
        result.threshold,
        tuple(rows),
        result.exit_status(),
        result.host_drifted,
    )


def _finite(x: float) -> float:
    """A figure as a page takes it: NaN for no finite value."""
    return x if math.isfinite(x) else math.nan


def _of_whole_run(
    m: MetricComparison,
    base: dict[str, Any],
    test: tuple[float, float, str],
    *,
    verdict: str,
    text: str,
    look: int | None,
    looks: int,
) -> Decision:
    """A metric decided on the whole run's comparison, not a look's: its
    figures, and the p, level and test (``_test_of``) it rests on."""
    c = m.comparison
    p, level, test_name = test
    return Decision(
        **base,
        verdict=verdict,
        text=text,
        look=look,
        looks=looks,
        blocks=c.units,
        paired=c.paired,
        minutes=None,
        ratio=c.ratio,
        ci_low=c.ci_low,
        ci_high=c.ci_high,
        p=p,
        level=level,
        test=test_name,
        nominal_p=None,
    )


def _not_looked_at(m: MetricComparison, base: dict[str, Any]) -> Decision:
    """A metric no look compared: the whole run's figures, undecided (or not comparable)."""
    return _of_whole_run(
        m,
        base,
        (m.comparison.p_value, 0.0, "difference"),
        verdict=NOT_COMPARABLE if not m.comparable else UNDECIDED,
        text=verdict_text(m) if not m.comparable else f"{UNDECIDED} ({NOT_LOOKED_AT})",
        look=None,
        looks=0,
    )


def _looked_at(t: MetricProgress, base: dict[str, Any], run: SequentialRun) -> Decision:
    """A metric at the look that decided it, or at its last look."""
    at = t.at_look
    assert at is not None
    c = at.stats
    verdict = t.decision
    decided = t.decided and verdict in (SLOWER, FASTER, EQUIVALENT)
    p, level, test = _test_of(
        verdict,
        c.p_value if c.p_sequential is None else c.p_sequential,
        c.p_equivalence if c.p_equivalence_sequential is None else c.p_equivalence_sequential,
        c.alpha_difference,
        c.alpha_equivalence,
    )
    nominal = None
    for look, _, difference, equivalence in t.boundaries:
        if look == at.look:
            nominal = equivalence if verdict == EQUIVALENT else difference
    return Decision(
        **base,
        verdict=verdict,
        text=t.verdict or UNDECIDED,
        look=t.deciding_look if decided else None,
        looks=len(t.history),
        blocks=c.n_blocks or t.blocks,
        paired=c.paired,
        minutes=run.minutes_at(at.look),
        ratio=_finite(c.ratio),
        ci_low=_finite(c.ci_low),
        ci_high=_finite(c.ci_high),
        p=p,
        level=level,
        test=test,
        nominal_p=nominal,
    )


def sequential(result: RunComparison, run: SequentialRun) -> DecidingTable:
    """The looks' decisions (``run``), named and ordered as the full
    comparison ``result`` names them; the exit status the looks'."""
    labels = short_labels(result.metrics)
    tracked = run.tracker.metrics
    rows = []
    for m in result.metrics:
        t = tracked.get(m.key)
        base = _row(m, labels[m.key], result.threshold)
        rows.append(_looked_at(t, base, run) if t is not None and t.at_look is not None else _not_looked_at(m, base))
    looks = tuple(
        LookRow(
            look=look.look,
            minutes=run.minutes_at(i),
            fraction=look.fraction,
            alpha=look.level,
            metrics=look.tests,
            decided=tuple(
                sorted(labels.get(t.key, t.key) for t in tracked.values() if t.decided and t.deciding_look == look.look)
            ),
            next_block=run.added_after(look.look),
        )
        for i, look in enumerate(run.tracker.looks, start=1)
    )
    return DecidingTable(
        SEQUENTIAL,
        run.tracker.alpha,
        run.tracker.threshold,
        tuple(rows),
        run.exit_status,
        bool(run.tracker.controls_flagged),
        looks,
        run.stopped,
        sequential=True,
    )

"""The deciding table: each metric's decision as it set the exit status.

Why it is built so: docs/architecture.md, "Module notes", host/judge/decisions.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from memqual.host.judge.comparison import MetricComparison, RunComparison, short_labels, verdict_text
from memqual.host.judge.primaries import CONTROL, PRIMARY
from memqual.host.judge.regime import NOT_COMPARABLE
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
class DecidingTable:
    """Every metric's decision, how they were made, and the exit status they set."""

    decided_by: str  # ONE_LOOK or SEQUENTIAL
    alpha: float
    margin: float
    rows: tuple[Decision, ...]
    exit_status: int
    host_drifted: bool
    looks: tuple[Mapping[str, Any], ...] = ()  # until-decided.json's looks, one dict each
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
            "exit_status": self.exit_status,
            "host_drifted": self.host_drifted,
            "stopped": self.stopped or None,
            "looks": list(self.looks),
            "rows": [r.to_json() for r in self.rows],
        }


def _row(m: MetricComparison, label: str, threshold: float, figures: Mapping[str, Any] | None) -> dict[str, Any]:
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
        p, level, test = _test_of(m.verdict, c.p_value, c.p_equivalence, c.alpha_difference, c.alpha_equivalence)
        rows.append(
            Decision(
                **_row(m, labels[m.key], result.threshold, None),
                verdict=m.verdict,
                text=verdict_text(m),
                look=1 if m.verdict in (SLOWER, FASTER, EQUIVALENT) else None,
                looks=1 if m.comparable else 0,
                blocks=c.units,
                paired=c.paired,
                minutes=None,
                ratio=c.ratio,
                ci_low=c.ci_low,
                ci_high=c.ci_high,
                p=p,
                level=level,
                test=test,
                nominal_p=None,
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


def _float(x: Any, default: float = math.nan) -> float:
    return float(x) if isinstance(x, (int, float)) else default


def sequential(result: RunComparison, summary: Mapping[str, Any], exit_status: int) -> DecidingTable:
    """The looks' decisions (until-decided.json as ``summary``), named and
    ordered as the full comparison ``result`` names them; ``exit_status``
    the looks' (the Tracker's)."""
    labels = short_labels(result.metrics)
    tracked = {str(m.get("key")): m for m in summary.get("metrics") or []}
    wall = list(summary.get("look_wall_s") or [])
    rows = []
    for m in result.metrics:
        t = tracked.get(m.key)
        at = (t or {}).get("at_look") or None
        base = _row(m, labels[m.key], result.threshold, at)
        if t is None or at is None:
            c = m.comparison
            rows.append(
                Decision(
                    **base,
                    verdict=NOT_COMPARABLE if not m.comparable else UNDECIDED,
                    text=verdict_text(m) if not m.comparable else f"{UNDECIDED} ({NOT_LOOKED_AT})",
                    look=None,
                    looks=0,
                    blocks=c.units,
                    paired=c.paired,
                    minutes=None,
                    ratio=c.ratio,
                    ci_low=c.ci_low,
                    ci_high=c.ci_high,
                    p=c.p_value,
                    level=0.0,
                    test="difference",
                    nominal_p=None,
                )
            )
            continue
        text = str(t.get("verdict") or UNDECIDED)
        verdict = text.split(" ", 1)[0] if text.split(" ", 1)[0] in (SLOWER, FASTER, EQUIVALENT, UNDECIDED) else text
        if verdict not in (SLOWER, FASTER, EQUIVALENT, UNDECIDED):
            verdict = NOT_COMPARABLE
        decided = t.get("state") == "decided" and verdict in (SLOWER, FASTER, EQUIVALENT)
        look = int(t["rounds_needed"]) if decided and t.get("rounds_needed") is not None else None
        at_look = int(at.get("look") or 0)
        p_raw = at.get("p_sequential") if at.get("p_sequential") is not None else at.get("p_value")
        p_eq = (
            at.get("p_equivalence_sequential")
            if at.get("p_equivalence_sequential") is not None
            else at.get("p_equivalence")
        )
        p, level, test = _test_of(
            verdict,
            _float(p_raw, 1.0),
            _float(p_eq, 1.0),
            _float(at.get("alpha_difference"), 0.0),
            _float(at.get("alpha_equivalence"), 0.0),
        )
        nominal = None
        for b in t.get("boundaries") or []:
            if b.get("look") == at_look:
                nominal = _float(b.get("nominal_p_equivalence" if verdict == EQUIVALENT else "nominal_p"))
        ci = at.get("ci") or [None, None]
        rows.append(
            Decision(
                **base,
                verdict=verdict,
                text=text,
                look=look,
                looks=len(t.get("history") or []),
                blocks=int(at.get("n_blocks") or 0) or int(t.get("blocks") or 0),
                paired=bool(at.get("paired")),
                minutes=(wall[at_look - 1] / 60.0) if 0 < at_look <= len(wall) else None,
                ratio=_float(at.get("ratio")),
                ci_low=_float(ci[0]),
                ci_high=_float(ci[1]),
                p=p,
                level=level,
                test=test,
                nominal_p=nominal,
            )
        )
    looks = []
    added = {int(a.get("block", 0)): a for a in summary.get("added_blocks") or []}
    for i, look in enumerate(summary.get("look_times") or []):
        number = int(look.get("look") or i + 1)
        decided_here = sorted(
            labels.get(str(m.get("key")), str(m.get("key")))
            for m in tracked.values()
            if m.get("state") == "decided" and m.get("rounds_needed") == number
        )
        looks.append(
            {
                "look": number,
                "minutes": (wall[i] / 60.0) if i < len(wall) else None,
                "fraction": look.get("fraction"),
                "alpha": look.get("alpha"),
                "metrics": look.get("metrics"),
                "decided": decided_here,
                "next_block": added.get(number + _first_block(summary)),
            }
        )
    return DecidingTable(
        SEQUENTIAL,
        _float(summary.get("alpha"), result.alpha),
        _float(summary.get("threshold"), result.threshold),
        tuple(rows),
        exit_status,
        bool(summary.get("host_drifted")),
        tuple(looks),
        str(summary.get("stopped") or ""),
        sequential=True,
    )


def _first_block(summary: Mapping[str, Any]) -> int:
    """The blocks before the first look (--rounds): the block added after
    look k is block k + that."""
    added = summary.get("added_blocks") or []
    total = int(summary.get("blocks") or 0)
    return total - len(added)

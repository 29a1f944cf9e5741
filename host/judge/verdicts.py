"""The verdicts of a comparison and what each shows: the words (slower,
faster, equivalent, changed, undecided, runs differ), the families'
defaults, ``MetricStats`` (what the test of one metric found) and the
texts a table's cell and a page's line give it.  docs/claims-and-report.md
("memqual compare") is the manual.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from memqual.host.judge.primaries import CONTROL, EXPLORATORY, PRIMARY
from memqual.host.judge.regime import NOT_COMPARABLE

if TYPE_CHECKING:
    from memqual.host.core import descriptive

# A comparison's defaults, in this module rather than in stats so that
# `memqual --help` does not load numpy and scipy.
DEFAULT_THRESHOLD = 0.05
# The family-wise error level of an A/B decision: memqual compare's and
# --until-decided's families (Holm over a dozen or so primaries) and the
# history's change points, per family.  A claim's verdict and a bisect
# probe answer one question each and have levels of their own
# (claims.model.CLAIM_ALPHA, bisect_evidence.PROBE_ALPHA).
DEFAULT_ALPHA = 0.01
CORRECTION = {PRIMARY: "holm", CONTROL: "holm", EXPLORATORY: "benjamini-hochberg at alpha/4"}
# The share of alpha the exploratory family gets (see the module docstring).
EXPLORATORY_ALPHA_SHARE = 0.25

FASTER = "faster"
SLOWER = "slower"
EQUIVALENT = "equivalent"
# Shown to differ from A (the test of no change rejected at its level) with
# an estimate inside the margin, and not shown inside it: a decision (under
# --until-decided the metric crossed its boundary and is frozen there), not
# a regression.
CHANGED = "changed"
UNDECIDED = "undecided"
# Two runs of one side each, not in blocks: the test of their replicates
# says whether the two runs differ, which is a description, not a decision
# about the kernels (run-to-run variance is not in it).
RUNS_DIFFER = "runs differ"
# NOT_COMPARABLE is listed with the verdicts but is none: no decision was made.
VERDICTS = (SLOWER, FASTER, EQUIVALENT, CHANGED, UNDECIDED, RUNS_DIFFER, NOT_COMPARABLE)
ROLES = (PRIMARY, CONTROL, EXPLORATORY)


@dataclasses.dataclass(frozen=True)
class MetricStats:
    """What the test of one metric found: the pooled samples' summaries,
    the ratio B / A the test estimates (a geometric mean ratio of
    replicate medians, per block when paired) with its 95 % t-interval, the
    raw and corrected p of a difference and of equivalence, and the levels
    those corrected p faced."""

    a: descriptive.Summary
    b: descriptive.Summary
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    p_equivalence: float
    n_replicates_a: int
    n_replicates_b: int
    n_blocks: int  # 0 when unpaired
    p_method: str
    p_adjusted: float | None = None
    p_equivalence_adjusted: float | None = None
    alpha_difference: float = 0.0  # the level the raw p faced in its family
    alpha_equivalence: float = 0.0
    blocks_needed: int | None = None  # units a side that would decide it (undecided only)
    # The increment-scale p of a look in a sequence (--until-decided), what
    # the family's correction ran on; None for a single comparison.
    p_sequential: float | None = None
    p_equivalence_sequential: float | None = None
    # The threshold band's half-width, shown with every verdict.
    margin: float = 0.0
    # What the test's units are: "block" (paired), "run" (several runs a
    # side, one value a run), "replicate" (a replicate a unit: a bisect
    # probe outside blocks), "descriptive" (one run a side outside blocks:
    # the runs' replicates, which say whether the two runs differ, not
    # whether the kernels do).
    unit_kind: str = "replicate"

    @property
    def paired(self) -> bool:
        return self.n_blocks > 0

    @property
    def units(self) -> int:
        """The independent units a side the test rests on (blocks when paired)."""
        return self.n_blocks if self.paired else min(self.n_replicates_a, self.n_replicates_b)

    def to_json(self) -> dict[str, Any]:
        def finite(x: float | None) -> float | None:
            return x if x is not None and math.isfinite(x) else None

        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "ratio": finite(self.ratio),
            "ci": [finite(self.ci_low), finite(self.ci_high)],
            "confidence": self.confidence,
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "p_equivalence": self.p_equivalence,
            "p_equivalence_adjusted": self.p_equivalence_adjusted,
            "alpha_difference": self.alpha_difference,
            "alpha_equivalence": self.alpha_equivalence,
            "n_replicates_a": self.n_replicates_a,
            "n_replicates_b": self.n_replicates_b,
            "n_blocks": self.n_blocks,
            "paired": self.paired,
            "p_method": self.p_method,
            "blocks_needed": self.blocks_needed,
            "margin": self.margin,
            "unit_kind": self.unit_kind,
            **(
                {"p_sequential": self.p_sequential, "p_equivalence_sequential": self.p_equivalence_sequential}
                if self.p_sequential is not None
                else {}
            ),
        }

    @classmethod
    def from_json(cls, data: Any) -> MetricStats:
        """What ``to_json`` wrote (a null figure: not finite); ValueError,
        TypeError or KeyError on anything else."""
        from memqual.host.core.descriptive import Summary, float_or_nan

        def optional(key: str) -> float | None:
            return None if data.get(key) is None else float_or_nan(data[key])

        low, high = data.get("ci") or (None, None)
        return cls(
            a=Summary.from_json(data["a"]),
            b=Summary.from_json(data["b"]),
            ratio=float_or_nan(data.get("ratio")),
            ci_low=float_or_nan(low),
            ci_high=float_or_nan(high),
            confidence=float_or_nan(data.get("confidence", 0.95)),
            p_value=float_or_nan(data.get("p_value", 1.0)),
            p_equivalence=float_or_nan(data.get("p_equivalence", 1.0)),
            n_replicates_a=int(data.get("n_replicates_a") or 0),
            n_replicates_b=int(data.get("n_replicates_b") or 0),
            n_blocks=int(data.get("n_blocks") or 0),
            p_method=str(data.get("p_method") or ""),
            p_adjusted=optional("p_adjusted"),
            p_equivalence_adjusted=optional("p_equivalence_adjusted"),
            alpha_difference=float_or_nan(data.get("alpha_difference", 0.0)),
            alpha_equivalence=float_or_nan(data.get("alpha_equivalence", 0.0)),
            blocks_needed=None if data.get("blocks_needed") is None else int(data["blocks_needed"]),
            p_sequential=optional("p_sequential"),
            p_equivalence_sequential=optional("p_equivalence_sequential"),
            margin=float_or_nan(data.get("margin", 0.0)),
            unit_kind=str(data.get("unit_kind") or "replicate"),
        )


def stats_verdict_text(verdict: str, c: MetricStats) -> str:
    """A verdict with its margin (a table's cell); for ``undecided`` about
    how many units would decide it.  ``verdict_meaning`` says in full what
    the test showed."""
    band = f"±{c.margin * 100:.3g}%"
    if verdict in (SLOWER, FASTER, EQUIVALENT, CHANGED):
        return f"{verdict} ({band})"
    if verdict == RUNS_DIFFER:
        return f"{verdict} (descriptive)"
    if verdict != UNDECIDED:
        return verdict
    unit = "blocks" if c.paired else ("runs a side" if c.unit_kind == "run" else "a side")
    if c.unit_kind == "descriptive":
        return f"{UNDECIDED} (one run a side: descriptive)"
    if min(c.n_replicates_a, c.n_replicates_b) < 2 and not c.paired:
        return f"{UNDECIDED} (no spread yet: needs 2 or more {unit})"
    if c.blocks_needed is None:
        return f"{UNDECIDED} (on the threshold's edge: more than 200 {unit})"
    return f"{UNDECIDED} (needs about {c.blocks_needed} {unit})"


def verdict_meaning(verdict: str, c: MetricStats) -> str:
    """What a verdict's test showed, in words that do not overstate it:
    ``slower`` is a change shown against no change with an estimate
    beyond the margin, not a change shown to exceed the margin."""
    band = f"±{c.margin * 100:.3g} %"
    change = f"{(c.ratio - 1.0) * 100:+.1f} %" if math.isfinite(c.ratio) else "?"
    if verdict in (SLOWER, FASTER):
        return (
            f"{verdict}: shown to differ from A, estimate {change} beyond the {band} margin "
            "(not tested against the margin itself)"
        )
    if verdict == EQUIVALENT:
        return f"{verdict}: the interval shown inside the {band} margin"
    if verdict == CHANGED:
        return f"{verdict}: shown to differ from A, estimate {change} inside the {band} margin, not shown inside it"
    if verdict == RUNS_DIFFER:
        return (
            f"{verdict}: these two runs differ by {change} on their replicates; with one run a side outside "
            "blocks the run-to-run variance is not in the test, so this describes the runs and decides nothing"
        )
    if verdict == UNDECIDED and c.unit_kind == "descriptive":
        return f"{verdict}: one run a side outside blocks ({change}); several runs a side or an interleaved run decide"
    if verdict == UNDECIDED:
        return f"{verdict}: neither a change nor equivalence within the {band} margin shown"
    return verdict

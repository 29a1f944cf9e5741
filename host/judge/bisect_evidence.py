"""The evidence of one bisect probe against the reference (K1) for one
metric, at one look (``evidence_of``): decided as ``memqual compare``
decides a metric (``families.decide_one``) at the look's share of alpha
(``ab_tests.spent_alpha`` over the probe's planned looks, so a probe's
looks together make a wrong decision at most alpha of the time).  The
search that uses it is host/run/bisect/decide.py; the rates are measured in
tests/run/test_bisect_calibration.py (docs/ab-calibration.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from memqual.host.judge import families
from memqual.host.judge.stats import ab_tests
from memqual.host.judge.verdicts import CHANGED, UNDECIDED, MetricStats, stats_verdict_text

# The error level of one probe's decisions over all its looks.  A bisect
# decides one metric, not a family, so the conventional 5 % rather than
# compare's 1 % over a dozen primaries (verdicts.DEFAULT_ALPHA); measured in
# tests/run/test_bisect_calibration.py (docs/ab-calibration.md).
PROBE_ALPHA = 0.05


@dataclasses.dataclass(frozen=True)
class Evidence:
    """A probe's kernel against the reference (K1) for one metric, at one
    look: the decision and what it rests on (``stats`` None before both
    sides have a measurement)."""

    verdict: str  # slower, faster, equivalent, undecided
    stats: MetricStats | None
    look: int  # the units (blocks when paired) the look rests on
    alpha: float  # the share of alpha this look spent
    paired: bool = False  # K1 and the probe measured in the same blocks

    @property
    def ratio(self) -> float | None:
        return _finite(self.stats.ratio) if self.stats else None

    @property
    def ci_low(self) -> float | None:
        return _finite(self.stats.ci_low) if self.stats else None

    @property
    def ci_high(self) -> float | None:
        return _finite(self.stats.ci_high) if self.stats else None

    @property
    def n_reference(self) -> int:
        return self.stats.n_replicates_a if self.stats else 0

    @property
    def n_probe(self) -> int:
        return self.stats.n_replicates_b if self.stats else 0

    @property
    def n_blocks(self) -> int:
        return self.stats.n_blocks if self.stats else 0

    @property
    def blocks_needed(self) -> int | None:
        return self.stats.blocks_needed if self.stats else None

    @property
    def decided(self) -> bool:
        return self.verdict != UNDECIDED

    def text(self) -> str:
        """The verdict, with what an undecided probe would need."""
        if self.stats is None:
            return f"{UNDECIDED} (no measurement of both kernels yet)"
        if self.paired and not self.stats.paired and self.verdict == UNDECIDED:
            return f"{UNDECIDED} (one block: needs 2 or more blocks)"
        return stats_verdict_text(self.verdict, self.stats)

    def to_json(self) -> dict[str, Any]:
        s = self.stats
        return {
            "verdict": self.verdict,
            "text": self.text(),
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "n_reference": self.n_reference,
            "n_probe": self.n_probe,
            "n_blocks": self.n_blocks,
            "look": self.look,
            "paired": self.paired,
            "alpha": self.alpha,
            "p_value": s.p_value if s else None,
            "p_equivalence": s.p_equivalence if s else None,
            "blocks_needed": self.blocks_needed,
            "method": s.p_method if s else "",
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def look_alpha(alpha: float, look: int, planned: int) -> float:
    """The level a probe's look faces: its increment of alpha (k / K)^2 over
    the K planned looks (the blocks a probe may take)."""
    return ab_tests.spent_alpha(alpha, look, planned)


def evidence_of(
    reference: Sequence[Sequence[float]],
    probe: Sequence[Sequence[float]],
    reference_blocks: Sequence[int] | None = None,
    probe_blocks: Sequence[int] | None = None,
    *,
    threshold: float,
    alpha: float,
    planned: int,
    better: str = "lower",
) -> Evidence:
    """The probe decided against the reference at this look (its units:
    the blocks shared by both sides when paired, else the smaller side's
    replicates), at the look's share of ``alpha``."""
    paired = bool(reference_blocks) and bool(probe_blocks)
    look = len(set(reference_blocks or ()) & set(probe_blocks or ())) if paired else min(len(reference), len(probe))
    level = look_alpha(alpha, look, planned) if look else 0.0
    if not reference or not probe:
        return Evidence(UNDECIDED, None, look, level, paired)
    try:
        found, verdict = families.decide_one(
            reference,
            probe,
            reference_blocks if paired else None,
            probe_blocks if paired else None,
            better=better,
            threshold=threshold,
            alpha=level,
        )
    except ValueError:  # a side with no samples
        return Evidence(UNDECIDED, None, look, level, paired)
    # Past the planned looks nothing is left to spend: nothing is decided.
    # A probe shown to differ with an estimate inside the margin is neither
    # good nor bad: it stays undecided and gets more blocks (its looks are
    # Bonferroni over the planned ones, which needs no freezing).
    if level <= 0.0 or verdict == CHANGED:
        verdict = UNDECIDED
    return Evidence(verdict, found, look, level, paired)

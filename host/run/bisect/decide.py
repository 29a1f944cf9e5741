"""The decisions of a statistical bisect, apart from running anything.

Two pure pieces, unit-tested on synthetic results (tests/run/test_bisect.py,
tests/run/test_bisect_calibration.py):

- ``evidence_of``: a probe against the reference (K1) for the bisected
  metric, decided as ``memqual compare`` decides a metric
  (``comparison.decide_one``: a paired t-test on the blocks' log(B/A) when
  both sides name their blocks, Welch's otherwise, TOST for equivalence):
  ``slower`` or ``faster`` (significant and beyond the threshold),
  ``equivalent`` (the two one-sided tests put B/A inside the threshold
  band), or ``undecided`` with about how many blocks would decide it.
  A probe is looked at after every block, so each look faces only its
  share of alpha (``ab_tests.spent_alpha`` over the probe's planned looks:
  a probe has a fixed most blocks, so its looks are known ahead, where
  ``--until-decided`` spends on its budget's clock): the chance that a probe's looks ever make a
  wrong decision stays at most alpha.
- ``Bisection``: git bisect's search over a series K1..Kn whose K1 is good.
  Kn is checked first; then the untested kernel nearest the middle of the
  range between the last good and the first bad, until that range has no
  kernel left to test.  A probe moves the search only once it is decided:
  ``equivalent`` is good, a change the way Kn changed is bad, a change the
  other way is skipped (not this step).  A probe still undecided when its
  budget ends is skipped too (``git bisect skip``): the search goes on
  around it, and the answer is then a set of kernels, one of which is the
  first bad.  With no skips this takes at most 1 + ceil(log2(n - 1))
  probes, within the ceil(log2(n)) + 1 the issue asks for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from memqual.host.judge.comparison import (
    CHANGED,
    EQUIVALENT,
    FASTER,
    SLOWER,
    UNDECIDED,
    MetricStats,
    stats_verdict_text,
)

GOOD = "good"
BAD = "bad"
SKIP = "skip"

VERDICTS = (SLOWER, FASTER, EQUIVALENT, UNDECIDED)
# The error level of one probe's decisions over all its looks.  A bisect
# decides one metric, not a family, so the conventional 5 % rather than
# compare's 1 % over a dozen primaries; measured in
# tests/run/test_bisect_calibration.py (docs/ab-calibration.md).
DEFAULT_ALPHA = 0.05


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
    from memqual.host.core import ab_tests

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
    from memqual.host.judge import comparison

    paired = bool(reference_blocks) and bool(probe_blocks)
    look = len(set(reference_blocks or ()) & set(probe_blocks or ())) if paired else min(len(reference), len(probe))
    level = look_alpha(alpha, look, planned) if look else 0.0
    if not reference or not probe:
        return Evidence(UNDECIDED, None, look, level, paired)
    try:
        found, verdict = comparison.decide_one(
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


def classify(evidence: Evidence, step: str | None = None) -> str:
    """The probe's place against the reference: for the last kernel
    (``step`` None) its verdict; for a probe inside the series GOOD
    (equivalent to K1), BAD (changed the way Kn changed), SKIP (changed
    the other way: not this step, and no place in a one-step search), or
    UNDECIDED."""
    verdict = evidence.verdict
    if step is None or verdict == UNDECIDED:
        return verdict
    if verdict == EQUIVALENT:
        return GOOD
    return BAD if verdict == step else SKIP


@dataclasses.dataclass
class Outcome:
    """What the search found, in words and indices (0-based)."""

    kind: str  # "first bad", "range" (skips in the way), "no step", "undecided ends", "incomplete"
    first_bad: int | None = None
    candidates: tuple[int, ...] = ()  # one of these is the first bad (kind "range")
    last_good: int | None = None
    note: str = ""


@dataclasses.dataclass
class Bisection:
    """git bisect over n kernels, index 0 good by definition.  ``marks``
    holds GOOD, BAD or SKIP per probed index; the caller probes what
    ``next_probe`` names and calls ``mark``."""

    n: int
    marks: dict[int, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError("a bisect needs at least 2 kernels")
        self.marks = {int(k): v for k, v in self.marks.items()}
        self.marks[0] = GOOD

    def mark(self, index: int, verdict: str) -> None:
        if verdict not in (GOOD, BAD, SKIP):
            raise ValueError(f"mark {verdict!r}: good, bad or skip")
        if not 0 < index < self.n:
            raise ValueError(f"index {index} outside 1..{self.n - 1}")
        self.marks[index] = verdict

    @property
    def probes(self) -> int:
        return len(self.marks) - 1  # index 0 is given, not probed

    def _bounds(self) -> tuple[int, int] | None:
        """(last good, first bad) around the step, or None before Kn is bad."""
        if self.marks.get(self.n - 1) != BAD:
            return None
        bad = min(i for i, v in self.marks.items() if v == BAD)
        good = max(i for i, v in self.marks.items() if v == GOOD and i < bad)
        return good, bad

    def remaining(self) -> list[int]:
        bounds = self._bounds()
        if bounds is None:
            return [] if self.n - 1 in self.marks else [self.n - 1]
        good, bad = bounds
        return [i for i in range(good + 1, bad) if i not in self.marks]

    def next_probe(self) -> int | None:
        """The next index to probe, or None when the search is over."""
        if self.n - 1 not in self.marks:
            return self.n - 1
        left = self.remaining()
        if not left:
            return None
        bounds = self._bounds()
        assert bounds is not None  # kernels are left: a good lies below a bad
        good, bad = bounds
        middle = (good + bad) / 2
        # The untested kernel nearest the middle; with skips this walks
        # around them as git bisect does.  Ties go to the lower index.
        return min(left, key=lambda i: (abs(i - middle), i))

    def steps_left(self) -> int:
        """Probes still needed at most if none is skipped (git's "roughly N steps")."""
        left = len(self.remaining())
        return math.ceil(math.log2(left + 1)) if left else 0

    def outcome(self) -> Outcome:
        last = self.marks.get(self.n - 1)
        if last is None:
            return Outcome("incomplete", note="the last kernel is not probed yet")
        if last == GOOD:
            return Outcome("no step", note="the first and the last kernel do not differ by the threshold")
        if last == SKIP:
            return Outcome(
                "undecided ends",
                note="the first and the last kernel could not be told apart or shown the same within the budget",
            )
        if self.remaining():
            return Outcome("incomplete", note="kernels are left to probe")
        bounds = self._bounds()
        assert bounds is not None  # the last kernel is bad and none is left between
        good, bad = bounds
        between = tuple(i for i in range(good + 1, bad) if self.marks.get(i) == SKIP)
        # A good found above a bad means the series is not one clean step.
        disorder = [i for i, v in self.marks.items() if v == GOOD and i > bad]
        note = (
            f"good after the first bad at {', '.join(f'K{i + 1}' for i in disorder)}: not one clean step"
            if disorder
            else ""
        )
        if between:
            return Outcome("range", candidates=(*between, bad), last_good=good, note=note)
        return Outcome("first bad", first_bad=bad, last_good=good, note=note)


def max_probes(n: int) -> int:
    """The bound the issue sets for a series of n: ceil(log2(n)) + 1."""
    return math.ceil(math.log2(n)) + 1

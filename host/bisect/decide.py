"""The decisions of a statistical bisect, apart from running anything.

Two pure pieces, unit-tested on synthetic results (tests/test_bisect.py):

- ``band_verdict``: where a confidence interval of a ratio lies against the
  threshold band [1 - t, 1 + t].  Wholly inside: the two kernels do not
  differ by as much as the threshold ("equivalent", the name memqual
  compare gives the same decision); wholly above or below: they
  do ("higher", "lower"); across an edge: not yet decided.  This is an
  equivalence rule, not a significance test: "equivalent" needs evidence too, so
  a probe measured with too few replicates stays undecided instead of
  passing as good by default.
- ``Bisection``: git bisect's search over a series K1..Kn whose K1 is good.
  Kn is checked first; then the untested kernel nearest the middle of the
  range between the last good and the first bad, until that range has no
  kernel left to test.  A kernel whose probe was not decided within its
  budget is skipped (``git bisect skip``): the search goes on around it,
  and the answer is then a set of kernels, one of which is the first bad.
  With no skips this takes at most 1 + ceil(log2(n - 1)) probes, within
  the ceil(log2(n)) + 1 the issue asks for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

GOOD = "good"
BAD = "bad"
SKIP = "skip"

SAME = "equivalent"
HIGHER = "higher"
LOWER = "lower"
UNDECIDED = "undecided"

# A CI from one replicate a side shows only the noise inside one guest
# (host/stats.ci_method): it must not decide a probe.
MIN_REPLICATES = 2


def band_verdict(ci_low: float | None, ci_high: float | None, threshold: float) -> str:
    """SAME, HIGHER, LOWER or UNDECIDED for a CI of a ratio B / A."""
    if ci_low is None or ci_high is None or not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return UNDECIDED
    low_edge, high_edge = 1.0 - threshold, 1.0 + threshold
    if ci_low > high_edge:
        return HIGHER
    if ci_high < low_edge:
        return LOWER
    if ci_low >= low_edge and ci_high <= high_edge:
        return SAME
    return UNDECIDED


@dataclasses.dataclass(frozen=True)
class Evidence:
    """A probe's kernel against the reference (K1) for one metric."""

    ratio: float | None  # pooled median probe / reference
    ci_low: float | None
    ci_high: float | None
    n_reference: int  # independent replicates a side
    n_probe: int
    p_value: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evidence_of(
    reference: Sequence[Sequence[float]], probe: Sequence[Sequence[float]], *, seed: int | None = None
) -> Evidence:
    """The two-stage bootstrap CI of probe / reference (memqual.host.stats)."""
    from memqual.host import stats

    def _finite(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    kwargs = {} if seed is None else {"seed": seed}
    if not reference or not probe:
        return Evidence(None, None, None, len(reference), len(probe))
    comp = stats.compare_replicates(reference, probe, **kwargs)
    return Evidence(
        ratio=_finite(comp.ratio),
        ci_low=_finite(comp.ci_low),
        ci_high=_finite(comp.ci_high),
        n_reference=comp.n_replicates_a,
        n_probe=comp.n_replicates_b,
        p_value=comp.p_value,
    )


def classify(
    evidence: Evidence, threshold: float, step: str | None = None, min_replicates: int = MIN_REPLICATES
) -> str:
    """UNDECIDED, or the probe's place against the reference: for the last
    kernel (``step`` None) SAME/HIGHER/LOWER; for a probe inside the series
    GOOD (same as K1), BAD (moved the way Kn moved) or SKIP (moved the
    other way: not this step, and no place in a one-step search)."""
    if min(evidence.n_reference, evidence.n_probe) < min_replicates:
        return UNDECIDED
    verdict = band_verdict(evidence.ci_low, evidence.ci_high, threshold)
    if step is None or verdict == UNDECIDED:
        return verdict
    if verdict == SAME:
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

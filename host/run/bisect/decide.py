"""The search of a statistical bisect, apart from running anything:
``Bisection``, git bisect's search over a series K1..Kn whose K1 is good,
moved by each probe's evidence (host/judge/bisect_evidence.py, ``evidence_of``).

Why it is built so: docs/architecture.md, "Module notes", host/run/bisect/decide.py.
"""

from __future__ import annotations

import dataclasses
import math

from memqual.host.judge.bisect_evidence import Evidence
from memqual.host.judge.verdicts import EQUIVALENT, FASTER, SLOWER, UNDECIDED

GOOD = "good"
BAD = "bad"
SKIP = "skip"

VERDICTS = (SLOWER, FASTER, EQUIVALENT, UNDECIDED)


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

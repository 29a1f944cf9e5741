"""The verdict badges every page shows: one colour per verdict, of a claim
and of a comparison, a verdict as a coloured pill (``Badge``) and the row
of boxes that counts the verdicts (``Count``), as typed values the
templates (host/report/templates/macros.html.j2) lay out.

Nothing here returns markup: escaping is the templates'.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

from memqual.host.judge.claims.model import DIRECTION_ONLY, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, UNDERPOWERED
from memqual.host.judge.regime import NOT_COMPARABLE
from memqual.host.judge.verdicts import CHANGED, EQUIVALENT, FASTER, RUNS_DIFFER, SLOWER, UNDECIDED

GREY = "#6b7280"

# One colour per verdict, of a claim (memqual.host.judge.claims) and of a comparison
# (memqual.host.judge.comparison); "underpowered" and "undecided" share one colour.
VERDICT_COLOURS = {
    REPRODUCED: "#1a7f37",
    DIRECTION_ONLY: "#b7791f",
    NOT_REPRODUCED: "#c62828",
    UNDERPOWERED: "#7c3aed",
    NOT_MEASURABLE: GREY,
    FASTER: "#15803d",
    SLOWER: "#b91c1c",
    EQUIVALENT: "#0e7490",
    UNDECIDED: "#7c3aed",
    NOT_COMPARABLE: GREY,
    CHANGED: "#b7791f",
    RUNS_DIFFER: GREY,
}


@dataclasses.dataclass(frozen=True)
class Badge:
    """A verdict as a coloured pill (macros.html.j2's ``badge``)."""

    text: str
    colour: str


def badge(verdict: str, text: str | None = None) -> Badge:
    """The pill of ``verdict`` in its colour, saying ``text`` instead of the
    verdict's name when given."""
    return Badge(text or verdict, VERDICT_COLOURS.get(verdict, GREY))


@dataclasses.dataclass(frozen=True)
class Count:
    """How many claims or metrics got one verdict: a box of the badges row."""

    verdict: str
    n: int
    colour: str


def counts(verdicts: Iterable[str], order: Sequence[str]) -> tuple[Count, ...]:
    """One box per verdict of ``order``, zero included."""
    tally = collections.Counter(verdicts)
    return tuple(Count(v, tally.get(v, 0), VERDICT_COLOURS.get(v, GREY)) for v in order)

"""The scenario table: each subject declares its scenarios as rows
(``Scenario``), and finds nothing else's.  A row gives the scenario's name
(the ``scenario`` of its records), its Avocado tags, its sizes per profile
(the subject's own typed row for quick, full and ab), the host knobs it
changes (host/core/knobs.py), its report section and its primary metrics
(their reasons and margins are host/judge/primaries.py's rows), and the
e2e test that records it.  Rows are
found through the ``memqual.scenarios`` entry points, as report sections
are (pyproject.toml): core imports no subject.  CONTRIBUTING.md, "A new
scenario".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from memqual.host.core import clock, profiles
from memqual.host.core.errors import BadInput
from memqual.host.core.knobs import KnobSet

SCENARIOS_GROUP = "memqual.scenarios"
SizesRow = TypeVar("SizesRow")


@dataclasses.dataclass(frozen=True)
class Scenario(Generic[SizesRow]):
    """One row of the table.  ``sizes``: one row per profile (every one of
    profiles.PROFILES), or none for a scenario that runs the same in all.
    ``section``: the name of its ``memqual.report_sections`` entry point,
    if it has one.  ``primaries``: the metrics of its records that a
    comparison decides on.  ``e2e``: the test that records it,
    ``test_file_stem:Class.method``, which carries its tags.
    ``icount_sizes``: the profiles whose sizes differ on the icount clock
    (host/core/clock.py), where every vCPU takes turns in one host thread."""

    name: str
    tags: tuple[str, ...] = ()
    sizes: Mapping[str, SizesRow] = dataclasses.field(default_factory=dict)
    knobs: tuple[KnobSet, ...] = ()
    section: str = ""
    primaries: tuple[str, ...] = ()
    e2e: str = ""
    icount_sizes: Mapping[str, SizesRow] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        subject, dot, rest = self.name.partition(".")
        if not (subject and dot and rest):
            raise ValueError(f"scenario {self.name!r}: name it subject.scenario")
        if self.sizes and set(self.sizes) != set(profiles.PROFILES):
            raise ValueError(f"scenario {self.name}: sizes for {sorted(self.sizes)}, not for {list(profiles.PROFILES)}")

    @property
    def subject(self) -> str:
        return self.name.partition(".")[0]

    def sizes_for(self, profile: str | None = None, icount: bool | None = None) -> SizesRow:
        """Its sizes in ``profile`` on the wall or the icount clock (default:
        the run's, profiles.current() and clock.current())."""
        if not self.sizes:
            raise BadInput(f"scenario {self.name} has no sizes per profile")
        name = profile or profiles.current()
        on_icount = clock.current().icount if icount is None else icount
        return self.icount_sizes.get(name, self.sizes[name]) if on_icount else self.sizes[name]


def load(group: str = SCENARIOS_GROUP) -> tuple[Scenario[object], ...]:
    """Every declared row, by name.  Each entry point names a subject and
    a tuple of its rows; a row of another subject, or a name twice, is a
    mistake of the declaration."""
    points = sorted(entry_points(group=group), key=lambda ep: ep.name)
    if not points:
        # Every subject declares rows: none found is an install that
        # predates the table, and a start would restore no knob set.
        raise BadInput(f"no scenario rows found (entry points {group}): the installed metadata is stale; run ./setup")
    rows: dict[str, Scenario[object]] = {}
    for point in points:
        for row in point.load():
            if not isinstance(row, Scenario) or row.subject != point.name:
                raise ValueError(f"entry point {group}:{point.name} declares {row!r}, not a {point.name}.* Scenario")
            if row.name in rows:
                raise ValueError(f"scenario {row.name} declared twice")
            rows[row.name] = row
    return tuple(rows[name] for name in sorted(rows))


@functools.cache
def table() -> tuple[Scenario[object], ...]:
    """The declared rows, read once per process."""
    return load()


def find(name: str) -> Scenario[object] | None:
    return next((row for row in table() if row.name == name), None)


def knob_sets(rows: tuple[Scenario[object], ...] | None = None) -> tuple[KnobSet, ...]:
    """Every knob set a row says it changes, once each: what a start puts
    back after a killed run (knobs.restore_every_stale)."""
    found: dict[str, KnobSet] = {}
    for row in table() if rows is None else rows:
        for knob_set in row.knobs:
            found.setdefault(knob_set.name, knob_set)
    return tuple(found[name] for name in sorted(found))

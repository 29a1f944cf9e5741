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
import re
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
    (host/core/clock.py), where every vCPU takes turns in one host thread.
    ``kernel_paths``: the guest kernel's source paths whose code this
    scenario's guests run and few others do, as MAINTAINERS' ``F:`` lines
    (``kernel_path_matches``); a patch that touches only these runs only
    the scenarios naming them (host/run/patch_scope.py).  Code every guest
    runs (the page allocator, virtio's core) is named by no row, and
    host-only code (the host's KSM, hugetlbfs, KVM) by none either: a
    patched guest kernel does not change it."""

    name: str
    tags: tuple[str, ...] = ()
    sizes: Mapping[str, SizesRow] = dataclasses.field(default_factory=dict)
    knobs: tuple[KnobSet, ...] = ()
    section: str = ""
    primaries: tuple[str, ...] = ()
    e2e: str = ""
    icount_sizes: Mapping[str, SizesRow] = dataclasses.field(default_factory=dict)
    kernel_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        subject, dot, rest = self.name.partition(".")
        if not (subject and dot and rest):
            raise ValueError(f"scenario {self.name!r}: name it subject.scenario")
        for pattern in self.kernel_paths:
            if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
                raise ValueError(f"scenario {self.name}: kernel path {pattern!r}: give it relative to the tree's top")
        if self.sizes and set(self.sizes) != set(profiles.PROFILES):
            raise ValueError(f"scenario {self.name}: sizes for {sorted(self.sizes)}, not for {list(profiles.PROFILES)}")

    @property
    def subject(self) -> str:
        return self.name.partition(".")[0]

    def exercises(self, path: str) -> bool:
        """Whether ``path`` (relative to the kernel tree's top) is one of
        this scenario's kernel_paths."""
        return kernel_paths_pattern(self.kernel_paths).fullmatch(path) is not None

    def sizes_for(self, profile: str | None = None, icount: bool | None = None) -> SizesRow:
        """Its sizes in ``profile`` on the wall or the icount clock (default:
        the run's, profiles.current() and clock.current())."""
        if not self.sizes:
            raise BadInput(f"scenario {self.name} has no sizes per profile")
        name = profile or profiles.current()
        on_icount = clock.current().icount if icount is None else icount
        return self.icount_sizes.get(name, self.sizes[name]) if on_icount else self.sizes[name]


def kernel_path_matches(pattern: str, path: str) -> bool:
    """MAINTAINERS' ``F:`` pattern against a file's path: a trailing ``/``
    is a folder and everything below it (``virt/kvm/``); otherwise the
    whole path, where ``*`` and ``?`` stay inside one folder
    (``drivers/virtio/virtio_*.c``, ``include/*/ksm.h``) as get_maintainer.pl
    reads them."""
    if pattern.endswith("/"):
        return path.startswith(pattern)
    return _glob(pattern).fullmatch(path) is not None


@functools.cache
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(_glob_text(pattern))


def _glob_text(pattern: str) -> str:
    return "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern)


@functools.cache
def kernel_paths_pattern(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One expression whose ``fullmatch`` is ``kernel_path_matches`` of any
    of ``patterns``: a patch of tens of thousands of files is scoped by one
    match a file and row, not one a pattern."""
    if not patterns:
        return re.compile(r"(?!)")  # matches nothing
    return re.compile(
        "|".join(f"(?:{re.escape(p)}.*)" if p.endswith("/") else f"(?:{_glob_text(p)})" for p in patterns), re.DOTALL
    )


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

"""The scenario table: each subject declares its scenarios as rows
(``Scenario``), and finds nothing else's.  A row is all the project knows
of a scenario: its name (its records' ``scenario``), Avocado tags, e2e
test, sizes per profile, host knobs (host/core/knobs.py), guest kernel
paths, report section, primaries with their measured spreads
(host/core/primary.py), whether it is a negative control, and the regime
its metrics compare under.  The judge, the reports and the run read the
rows and name no scenario.  Rows are found through the
``memqual.scenarios`` entry points (pyproject.toml): core imports no
subject.  CONTRIBUTING.md, "A new scenario"."""

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
from memqual.host.core.primary import Primary, Regime

SCENARIOS_GROUP = "memqual.scenarios"
SizesRow = TypeVar("SizesRow")


@dataclasses.dataclass(frozen=True)
class Scenario(Generic[SizesRow]):
    """One row of the table.  ``sizes``: one row per profile (every one of
    profiles.PROFILES), or none for a scenario that runs the same in all.
    ``section``: the name of the ``memqual.report_sections`` entry point
    that draws its records, if one does.  ``primaries``: the metrics of
    its records that a comparison decides on, each with its reason,
    instrument, margin and measured spreads (host/core/primary.py).
    ``control``: a negative control, host-only work no guest kernel can
    move (a comparison flags the host when it moves).  ``regime``: the
    condition its metrics compare under, if any.  ``e2e``: the test that
    records it, ``test_file_stem:Class.method``, which carries its tags.
    ``icount_sizes``: the profiles whose sizes differ on the icount clock
    (host/core/clock.py), where every vCPU takes turns in one host thread.
    ``kernel_paths``: the guest kernel's source paths whose code this
    scenario's guests run and few others do, as MAINTAINERS' ``F:`` lines
    (``kernel_path_matches``); a patch that touches only these runs only
    the scenarios naming them (host/run/patch_scope.py).  Code every guest
    runs (the page allocator, virtio's core) is named by no row, and
    host-only code (the host's KSM, hugetlbfs, KVM) by none either: a
    patched guest kernel does not change it.  ``host_paths``: the same for
    the host kernel, the code that does the host's work this scenario's
    primaries measure (its guests' exits and nested faults in KVM, ksmd,
    QEMU's madvise), made of host/core/host_code.py's groups; a host patch
    that touches only these runs only the scenarios naming them
    (``memqual run --host-patch``, host/run/host_scope.py).
    ``on_a_host_under_test``: its test runs under ``--host-kernel`` though
    not all it measures is its guests' own clock (host/judge/clock_plan.py
    ``shares_host``): it drives its guests' host through that host itself
    (``Machine.host_ssh``: L1's knobs and ksmd, its guest QEMU's RSS), or
    it reads its guests alone.  ``off_a_host_under_test``: the row's own
    words for why its test does not run there, where its instruments and
    knobs would not say it right.  Which rows run there:
    host/judge/host_under_test_plan.py."""

    name: str
    tags: tuple[str, ...] = ()
    sizes: Mapping[str, SizesRow] = dataclasses.field(default_factory=dict)
    knobs: tuple[KnobSet, ...] = ()
    section: str = ""
    primaries: tuple[Primary, ...] = ()
    e2e: str = ""
    icount_sizes: Mapping[str, SizesRow] = dataclasses.field(default_factory=dict)
    kernel_paths: tuple[str, ...] = ()
    control: bool = False
    regime: Regime | None = None
    host_paths: tuple[str, ...] = ()
    on_a_host_under_test: bool = False
    off_a_host_under_test: str = ""

    def __post_init__(self) -> None:
        subject, dot, rest = self.name.partition(".")
        if not (subject and dot and rest):
            raise ValueError(f"scenario {self.name!r}: name it subject.scenario")
        if self.on_a_host_under_test and self.off_a_host_under_test:
            raise ValueError(f"scenario {self.name}: on a host under test, or off it with a reason, not both")
        for pattern in (*self.kernel_paths, *self.host_paths):
            if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
                raise ValueError(f"scenario {self.name}: kernel path {pattern!r}: give it relative to the tree's top")
        if self.sizes and set(self.sizes) - {profiles.SMOKE} != set(profiles.SIZED):
            raise ValueError(f"scenario {self.name}: sizes for {sorted(self.sizes)}, not for {list(profiles.SIZED)}")
        self._bind_to_row()

    def _bind_to_row(self) -> None:
        """Its primaries and regime name this row: the judge reads them
        without the row at hand."""
        for part in (*self.primaries, self.regime):
            if part is not None and part.scenario not in ("", self.name):
                raise ValueError(f"scenario {self.name}: {part.metric} is {part.scenario}'s")
        if self.control and self.primaries:
            raise ValueError(f"scenario {self.name}: a negative control decides no primary")
        # One metric may be two primaries of two variants (ksmd's cost with
        # and without smart scan), never the same one twice.
        keys = [(p.metric, p.variant) for p in self.primaries]
        if len(set(keys)) != len(keys):
            raise ValueError(f"scenario {self.name}: a primary named twice in {keys}")
        # frozen: the bound copies replace the given ones once, here
        object.__setattr__(self, "primaries", tuple(dataclasses.replace(p, scenario=self.name) for p in self.primaries))
        if self.regime is not None:
            object.__setattr__(self, "regime", dataclasses.replace(self.regime, scenario=self.name))

    @property
    def subject(self) -> str:
        return self.name.partition(".")[0]

    def exercises(self, path: str) -> bool:
        """Whether ``path`` (relative to the kernel tree's top) is one of
        this scenario's kernel_paths."""
        return kernel_paths_pattern(self.kernel_paths).fullmatch(path) is not None

    def exercises_on_host(self, path: str) -> bool:
        """Whether ``path`` (relative to the host kernel tree's top) is one
        of this scenario's host_paths."""
        return kernel_paths_pattern(self.host_paths).fullmatch(path) is not None

    def sizes_for(self, profile: str | None = None, icount: bool | None = None) -> SizesRow:
        """Its sizes in ``profile`` on the wall or the icount clock (default:
        the run's, profiles.current() and clock.current())."""
        if not self.sizes:
            raise BadInput(f"scenario {self.name} has no sizes per profile")
        name = profile or profiles.current()
        on_icount = clock.current().icount if icount is None else icount
        if name == profiles.SMOKE and name not in self.sizes:
            name = profiles.AB
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


@functools.cache
def _by_name() -> dict[str, Scenario[object]]:
    return {row.name: row for row in table()}


def find(name: str) -> Scenario[object] | None:
    return _by_name().get(name)


def every_primary() -> tuple[Primary, ...]:
    """Every row's primaries, in the table's order."""
    return tuple(p for row in table() for p in row.primaries)


def knob_sets(rows: tuple[Scenario[object], ...] | None = None) -> tuple[KnobSet, ...]:
    """Every knob set a row says it changes, once each: what a start puts
    back after a killed run (knobs.restore_every_stale)."""
    found: dict[str, KnobSet] = {}
    for row in table() if rows is None else rows:
        for knob_set in row.knobs:
            found.setdefault(knob_set.name, knob_set)
    return tuple(found[name] for name in sorted(found))

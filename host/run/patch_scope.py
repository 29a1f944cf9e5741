"""Which scenarios a kernel patch can move: the files it touches against
each scenario row's ``kernel_paths`` (host/core/scenario.py), the way
MAINTAINERS' ``F:`` lines and get_maintainer.pl scope a patch by file.

Every touched file named by some row: those rows run, with the negative
controls.  A file no row names (mm/page_alloc.c, a header every guest
includes), a Kconfig or scripts/ change (the config of every scenario may
move), or no file at all: everything runs.  Only files no guest kernel
builds (Documentation/, MAINTAINERS): nothing to qualify.
docs/patch-qualification.md, "A patch qualifies what it touches".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memqual.host.core.profiles import AB, FULL
from memqual.host.core.scenario import Scenario, kernel_paths_pattern

if TYPE_CHECKING:  # the image builder (with cryptography) is a --patch run's alone
    from memqual.images.kernel_arms import PatchArms

EVERYTHING = "everything"
SCOPED = "scoped"
NOTHING = "nothing"
ONLY = "only"  # --only given: its tags decide alone
GUEST = "guest"  # which kernel a patch changes: the guests' (memqual run --patch)
HOST = "host"  # or the host's (memqual run --host-patch, host/run/host_scope.py)
# What no guest kernel builds: its documentation and the tree's own papers
# (a Kconfig under Documentation/ is still a config input: CONFIG_INPUTS).
NOT_BUILT = (
    "Documentation/",
    "LICENSES/",
    "MAINTAINERS",
    "CREDITS",
    "README",
    "COPYING",
    ".mailmap",
    ".get_maintainer.ignore",
    ".gitignore",
    "*/.gitignore",
)
# What changes the config the scenarios' kernels are built with (as
# images/kernel_patches.py's CONFIG_INPUTS, which decides when a patched
# build assembles its config again).
CONFIG_INPUTS = re.compile(r"(^|/)Kconfig[^/]*$|^scripts/|/configs/")
# The boot checks of the guest kernel itself (tag kernel-checks): every
# patched kernel's once-per-arm job runs them, whatever its scope.
KERNEL_CHECKS_FILE = "test_boot.py"


@dataclasses.dataclass(frozen=True)
class Side:
    """The kernel a patch changes, as its scope reads the rows and says so."""

    name: str  # GUEST or HOST
    kernel: str  # the kernel a patch of this side builds, in words
    config: str  # the config a Kconfig change moves, in words
    field: str  # the rows' field that names its paths
    paths: Callable[[Scenario[Any]], tuple[str, ...]]

    def exercises(self, row: Scenario[Any], path: str) -> bool:
        return kernel_paths_pattern(self.paths(row)).fullmatch(path) is not None


GUEST_SIDE = Side(GUEST, "guest kernel", "every scenario's kernel has", "kernel_paths", lambda row: row.kernel_paths)
HOST_SIDE = Side(HOST, "host kernel", "both host kernels have", "host_paths", lambda row: row.host_paths)


@dataclasses.dataclass(frozen=True)
class TestScope:
    """The tests a scoped run is limited to (``memqual run --patch`` of a
    patch that touches only some scenarios' code), as avocado references:
    its blocks' tests, and the files whose once-per-arm checks it runs."""

    blocks: tuple[str, ...]
    checks: tuple[str, ...]

    def references(self, selection: str) -> tuple[str, ...]:
        return self.checks if selection == "once" else self.blocks


@dataclasses.dataclass(frozen=True)
class Chosen:
    """A scenario a scoped run keeps, and the touched files that chose it."""

    scenario: str
    files: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A scenario a host patch's run would select but cannot run: its test
    cannot run under a host under test (host/judge/host_under_test_plan.py),
    and why.  A scoped run leaves it out; an unscoped one sees it skipped."""

    scenario: str
    reason: str


def dropped_text(dropped: Sequence[Dropped]) -> str:
    """The dropped scenarios grouped by their reason, in one line:
    ``memslots.kvm, memslots.kvm_lookup (it has no primary ...)``."""
    by_reason: dict[str, list[str]] = {}
    for d in dropped:
        by_reason.setdefault(d.reason, []).append(d.scenario)
    return "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())


@dataclasses.dataclass(frozen=True)
class PatchScope:
    kind: str  # EVERYTHING, SCOPED or NOTHING
    files: tuple[str, ...]  # what the patch touches
    reason: str  # why, in a few words
    chosen: tuple[Chosen, ...] = ()  # SCOPED: the scenarios kept
    controls: tuple[str, ...] = ()  # SCOPED: the negative controls kept beside them
    # SCOPED: the e2e tests of the kept scenarios and of the controls, as
    # ``test_file_stem:Class.method`` (Scenario.e2e)
    tests: tuple[str, ...] = ()
    control_tests: tuple[str, ...] = ()
    side: str = GUEST  # the kernel the patch changes
    only: tuple[str, ...] = ()  # HOST: --only's tags, which the scope narrows further
    # HOST: the scenarios it would keep whose tests a host under test cannot run
    dropped: tuple[Dropped, ...] = ()

    def line(self) -> str:
        """The one line ``memqual run --patch`` (``--host-patch``) prints."""
        if self.side == HOST:
            return self.host_line()
        if self.kind == SCOPED:
            names = ", ".join(c.scenario for c in self.chosen)
            return (
                f"the patch touches only code {names} exercise: running those and the negative controls "
                f"({', '.join(self.controls) or 'none'}); --all-scenarios runs every scenario"
            )
        if self.kind == NOTHING:
            return f"nothing to qualify: {self.reason}; --all-scenarios runs every scenario anyway (an A/A)"
        if self.kind == ONLY:
            return f"running what --only selects: {self.reason}, the patch's scope is not applied"
        return f"running every scenario: {self.reason}"

    def host_line(self) -> str:
        """The line of a host patch's scope, which --only narrows rather
        than replaces (no negative control rides along: the controls read
        this machine's /dev/kvm, which a host under test leaves out), with
        the scenarios left out because a host under test cannot run them."""
        selects = f" --only {' '.join(self.only)} selects" if self.only else ""
        if self.kind == NOTHING:
            # --all-scenarios keeps the rows a host under test cannot run out too
            anyway = "" if self.dropped else f"; --all-scenarios runs every scenario{selects} anyway"
            return f"nothing to qualify: {self.reason}{anyway}"
        left_out = ""
        if self.dropped and self.kind == SCOPED:
            left_out = f"; not run, as a host under test cannot run them: {dropped_text(self.dropped)}"
        elif self.dropped:
            left_out = f"; skipped under a host under test: {dropped_text(self.dropped)}"
        if self.kind == SCOPED:
            names = ", ".join(c.scenario for c in self.chosen)
            among = f" (of those{selects})" if self.only else ""
            return (
                f"the host patch touches host code {names} exercise{among}: running those{left_out}; "
                f"--all-scenarios runs every scenario{selects}"
            )
        return f"running every scenario{selects}: {self.reason}{left_out}"

    def test_scope(self, tests_dir: str = "e2e") -> TestScope | None:
        """The avocado references a SCOPED run is limited to (each test
        anchored, as blocks.test_reference), and its once-per-arm checks:
        the kernel's boot checks and those of the kept scenarios' files."""
        if self.kind != SCOPED:
            return None
        blocks = sorted({f"{tests_dir}/{_reference(t)}" for t in (*self.tests, *self.control_tests)})
        files = sorted({KERNEL_CHECKS_FILE, *(t.partition(":")[0] + ".py" for t in self.tests)})
        return TestScope(tuple(blocks), tuple(f"{tests_dir}/{f}" for f in files))

    def to_json(self) -> dict[str, Any]:
        dropped = {"dropped": {d.scenario: d.reason for d in self.dropped}} if self.side == HOST else {}
        return {
            "kind": self.kind,
            "files": list(self.files),
            "reason": self.reason,
            "scenarios": {c.scenario: list(c.files) for c in self.chosen},
            "controls": list(self.controls),
            "side": self.side,
            **dropped,
            "line": self.line(),
        }


def runs_in(row: Scenario[Any], profile: str) -> bool:
    """Whether a row's test runs in ``profile``'s blocks: the ab profile
    keeps the tests tagged ab, quick leaves out those tagged slow."""
    if profile == AB:
        return "ab" in row.tags
    return profile == FULL or "slow" not in row.tags


def not_built(path: str) -> bool:
    return not CONFIG_INPUTS.search(path) and kernel_paths_pattern(NOT_BUILT).fullmatch(path) is not None


def unscoped(files: tuple[str, ...], rows: Sequence[Scenario[Any]], side: Side) -> PatchScope | None:
    """What the files alone decide, before any row is chosen: no file or
    a config input (everything), only files no kernel builds (nothing), a
    file no row names on ``side`` (everything); None when every file built
    is named by some row."""
    if not files:
        return PatchScope(EVERYTHING, files, "the patch touches no file", side=side.name)
    config = [f for f in files if CONFIG_INPUTS.search(f)]
    if config:
        return PatchScope(EVERYTHING, files, f"{config[0]} can change the config {side.config}", side=side.name)
    built = built_files(files)
    if not built:
        return PatchScope(NOTHING, files, f"{', '.join(files)}: no {side.kernel} builds any of it", side=side.name)
    named = kernel_paths_pattern(tuple(p for row in rows for p in side.paths(row)))  # any row's, in one match
    unnamed = [f for f in built if named.fullmatch(f) is None]
    if unnamed:
        more = f" (and {len(unnamed) - 1} more)" if len(unnamed) > 1 else ""
        return PatchScope(EVERYTHING, files, f"{unnamed[0]}{more} is in no scenario's {side.field}", side=side.name)
    return None


def built_files(files: Sequence[str]) -> tuple[str, ...]:
    """The files of a patch some kernel builds (not its documentation)."""
    return tuple(f for f in files if not not_built(f))


def chosen_by(files: Sequence[str], row: Scenario[Any], side: Side) -> Chosen | None:
    """The row with the ``files`` it names on ``side``, or None: it names none."""
    named = tuple(f for f in files if side.exercises(row, f))
    return Chosen(row.name, named) if named else None


def scope_of(files: Sequence[str], rows: Sequence[Scenario[Any]], profile: str = AB) -> PatchScope:
    """The scope of a patch touching ``files`` over the scenario ``rows``
    that run in ``profile``."""
    files = tuple(files)
    early = unscoped(files, rows, GUEST_SIDE)
    if early is not None:
        return early
    built = built_files(files)
    found = [chosen_by(built, row, GUEST_SIDE) for row in rows if not row.control]
    chosen = [c for c in found if c is not None]
    kept = [c for c in chosen if runs_in(_row(rows, c.scenario), profile)]
    if not kept:
        names = ", ".join(c.scenario for c in chosen)
        return PatchScope(
            EVERYTHING, files, f"the scenarios that exercise it ({names}) do not run in the {profile} profile"
        )
    controls = [row for row in rows if row.control and runs_in(row, profile)]
    return PatchScope(
        SCOPED,
        files,
        "every file it touches is in the kernel_paths of the scenarios kept",
        tuple(kept),
        tuple(r.name for r in controls),
        tests_of(_row(rows, c.scenario) for c in kept),
        tests_of(controls),
    )


def tests_of(rows: Iterable[Scenario[Any]]) -> tuple[str, ...]:
    """The e2e tests that record ``rows`` (``Scenario.e2e``), each once, sorted."""
    return tuple(sorted({row.e2e for row in rows} - {""}))


def _reference(test: str) -> str:
    """``test_balloon:BalloonTiming.test_x`` as an anchored avocado reference
    below the tests' folder: ``test_balloon.py:BalloonTiming.test_x$``."""
    stem, _, rest = test.partition(":")
    return f"{stem}.py:{rest}$"


def _row(rows: Sequence[Scenario[Any]], name: str) -> Scenario[Any]:
    return next(r for r in rows if r.name == name)


@dataclasses.dataclass(frozen=True)
class PatchRun:
    """What ``memqual run --patch`` built and runs: A and B and the patches
    (``arms``) and which scenarios it covers (``scope``).  Its record is
    OUTPUT/patch.json and comparison.json's ``patch``; the run's A/B is
    named by it."""

    arms: PatchArms
    scope: PatchScope

    def to_json(self) -> dict[str, Any]:
        return {**self.arms.to_json(), "scope": self.scope.to_json()}

    def arm_names(self) -> tuple[str, str]:
        """A and B as the comparison names them: each kernel, B with its patches."""
        return arm_names(self.arms.a.name, self.arms.b.name, [p.subject for p in self.arms.patches])


def arm_names(a: str, b: str, subjects: Sequence[str], prefix: str = "") -> tuple[str, str]:
    """A and B of a patch's A/B as the comparison names them: each kernel
    (a host kernel's after ``prefix``, "host "), B with its patches'
    subject lines."""
    titles = "; ".join(subjects) or "a second source"
    return f"A {prefix}{a}", f"B {prefix}{b} (+ {titles})"


def arm_names_of(record: Mapping[str, Any], prefix: str = "") -> tuple[str, str]:
    """``arm_names`` from a patch's record (patch.json, host-patch.json):
    its ``a`` and ``b`` kernels by name and its ``patches``' subjects."""
    subjects = [str(p["subject"]) for p in record["patches"]]
    return arm_names(str(record["a"]["name"]), str(record["b"]["name"]), subjects, prefix)

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memqual.host.core.profiles import AB, FULL
from memqual.host.core.scenario import Scenario, kernel_paths_pattern

if TYPE_CHECKING:  # the image builder (with cryptography) is a --patch run's alone
    from memqual.images.kernel_arms import PatchArms

EVERYTHING = "everything"
SCOPED = "scoped"
NOTHING = "nothing"
ONLY = "only"  # --only given: its tags decide alone
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

    def line(self) -> str:
        """The one line ``memqual run --patch`` prints."""
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
        return {
            "kind": self.kind,
            "files": list(self.files),
            "reason": self.reason,
            "scenarios": {c.scenario: list(c.files) for c in self.chosen},
            "controls": list(self.controls),
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


def scope_of(files: Sequence[str], rows: Sequence[Scenario[Any]], profile: str = AB) -> PatchScope:
    """The scope of a patch touching ``files`` over the scenario ``rows``
    that run in ``profile``."""
    files = tuple(files)
    if not files:
        return PatchScope(EVERYTHING, files, "the patch touches no file")
    config = [f for f in files if CONFIG_INPUTS.search(f)]
    if config:
        return PatchScope(EVERYTHING, files, f"{config[0]} can change the config every scenario's kernel has")
    built = [f for f in files if not not_built(f)]
    if not built:
        return PatchScope(NOTHING, files, f"{', '.join(files)}: no guest kernel builds any of it")
    named = kernel_paths_pattern(tuple(p for row in rows for p in row.kernel_paths))  # any row's, in one match
    unnamed = [f for f in built if named.fullmatch(f) is None]
    if unnamed:
        more = f" (and {len(unnamed) - 1} more)" if len(unnamed) > 1 else ""
        return PatchScope(EVERYTHING, files, f"{unnamed[0]}{more} is in no scenario's kernel_paths")
    chosen = [
        Chosen(row.name, tuple(f for f in built if row.exercises(f)))
        for row in rows
        if not row.control and any(row.exercises(f) for f in built)
    ]
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
        tuple(sorted({_row(rows, c.scenario).e2e for c in kept} - {""})),
        tuple(sorted({r.e2e for r in controls} - {""})),
    )


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
        titles = "; ".join(p.subject for p in self.arms.patches) or "a second source"
        return f"A {self.arms.a.name}", f"B {self.arms.b.name} (+ {titles})"

"""Which scenarios a host kernel patch can move, and what a ``memqual run
--host-patch`` built and runs: a patch's files against each row's
``host_paths`` (host/core/host_code.py's groups), by a guest patch's rule
(host/run/patch_scope.py), but --only narrows the scope, only the rows a
host under test runs are kept (host/judge/host_under_test_plan.py), the
rest named with why, and a patch that leaves nothing to run (or touches
only what no kernel builds) is refused before any build.
docs/host-under-test.md, "Qualifying a host patch".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memqual.host.core.profiles import AB
from memqual.host.core.scenario import Scenario
from memqual.host.judge import host_under_test_plan
from memqual.host.run.patch_scope import (
    EVERYTHING,
    HOST,
    HOST_SIDE,
    NOTHING,
    SCOPED,
    Chosen,
    Dropped,
    PatchScope,
    arm_names,
    built_files,
    chosen_by,
    dropped_text,
    runs_in,
    tests_of,
    unscoped,
)

if TYPE_CHECKING:  # the image builder (with cryptography) is a --host-patch run's alone
    from memqual.images.kernel_arms import PatchArms

TEXTS = "host-patch"  # OUTPUT/host-patch/ holds the patches' texts, OUTPUT/host-patch.json the record
HOST_ARM = "host "  # how the comparison names a host patch's arms: "A host NAME"
SHA_SHOWN = 12  # the sha256 prefix that names a patch, as `memqual kernel build` prints it


def selected(row: Scenario[Any], profile: str, only: Sequence[str]) -> bool:
    """Whether the run would run ``row``'s test: it runs in ``profile`` and
    --only, when given, names one of its tags."""
    return runs_in(row, profile) and (not only or bool(set(only) & set(row.tags)))


def selection(profile: str, only: Sequence[str]) -> str:
    """What selects the run's rows, in words: ``--only fault in the ab profile``."""
    return f"--only {' '.join(only)} in the {profile} profile" if only else f"the {profile} profile"


def unselected_reason(chosen: Sequence[Chosen], profile: str, only: Sequence[str]) -> str:
    """Why a patch whose host code some rows exercise has nothing to run."""
    names = ", ".join(c.scenario for c in chosen)
    return f"only {names} exercise the host code it touches, and {selection(profile, only)} runs none of them"


def host_scope_of(
    files: Sequence[str], rows: Sequence[Scenario[Any]], profile: str = AB, only: Sequence[str] = ()
) -> PatchScope:
    """The scope of a host patch touching ``files`` over the scenario
    ``rows`` that run in ``profile``, that --only's tags (``only``) select
    and whose tests a host under test runs (host/judge/host_under_test_plan.py;
    the others are the scope's ``dropped``).  NOTHING: the caller refuses
    the run."""
    files, only = tuple(files), tuple(only)
    early = unscoped(files, rows, HOST_SIDE)
    if early is not None:
        return on_a_host_under_test(dataclasses.replace(early, only=only), rows, profile)
    found = [chosen_by(built_files(files), row, HOST_SIDE) for row in rows]
    chosen = [c for c in found if c is not None]
    by_name = {row.name: row for row in rows}
    kept = [c for c in chosen if selected(by_name[c.scenario], profile, only)]
    if not kept:
        return PatchScope(NOTHING, files, unselected_reason(chosen, profile, only), side=HOST, only=only)
    dropped = dropped_of([by_name[c.scenario] for c in kept], rows)
    gone = {d.scenario for d in dropped}
    runs = [c for c in kept if c.scenario not in gone]
    if not runs:
        names = ", ".join(c.scenario for c in kept)
        reason = f"only {names} exercise the host code it touches, and a host under test runs none of them: "
        return PatchScope(NOTHING, files, reason + dropped_text(dropped), side=HOST, only=only, dropped=dropped)
    return PatchScope(
        SCOPED,
        files,
        "every file it touches is in the host_paths of the scenarios kept",
        tuple(runs),
        tests=tests_of(by_name[c.scenario] for c in runs),
        side=HOST,
        only=only,
        dropped=dropped,
    )


def dropped_of(kept: Sequence[Scenario[Any]], rows: Sequence[Scenario[Any]]) -> tuple[Dropped, ...]:
    """Those of the ``kept`` rows whose tests a host under test cannot run
    (their siblings among ``rows`` included), each with why."""
    table = tuple(rows)
    reasons = ((row.name, host_under_test_plan.why_not(row, table)) for row in kept)
    return tuple(Dropped(name, reason) for name, reason in reasons if reason)


def on_a_host_under_test(scope: PatchScope, rows: Sequence[Scenario[Any]], profile: str) -> PatchScope:
    """An unscoped host patch's ``scope`` (EVERYTHING) with the rows the run
    selects that a host under test skips named (``dropped``), refused
    (NOTHING) when it would skip every one of them; NOTHING stays as it is."""
    if scope.kind != EVERYTHING:
        return scope
    chosen = [row for row in rows if selected(row, profile, scope.only)]
    dropped = dropped_of(chosen, rows)
    if chosen and len(dropped) == len(chosen):
        none = f"a host under test runs none of the scenarios {selection(profile, scope.only)} selects"
        reason = f"{scope.reason}, but {none}: "
        return dataclasses.replace(scope, kind=NOTHING, reason=reason + dropped_text(dropped), dropped=dropped)
    return dataclasses.replace(scope, dropped=dropped)


def every_scenario(
    files: Sequence[str], reason: str, rows: Sequence[Scenario[Any]], profile: str = AB, only: Sequence[str] = ()
) -> PatchScope:
    """A host patch's scope when nothing narrows it (--all-scenarios, two
    sources whose differences are not listed), with the rows a host under
    test skips named."""
    scope = PatchScope(EVERYTHING, tuple(files), reason, side=HOST, only=tuple(only))
    return on_a_host_under_test(scope, rows, profile)


@dataclasses.dataclass(frozen=True)
class HostPatchRun:
    """What ``memqual run --host-patch`` built and runs: host kernels A and
    B and the patches (``arms``), the sources and Kconfig fragments they
    were built from, and which scenarios it covers (``scope``).  Its record
    is OUTPUT/host-patch.json and comparison.json's ``host_patch``; the
    run's A/B is named by it, as a guest patch's is by its PatchRun."""

    arms: PatchArms
    scope: PatchScope
    sources: tuple[str, ...]
    fragments: tuple[str, ...]

    def axis(self) -> str:
        """What moved between A and B, in one line: each patch by its file's
        name and sha256 prefix, on the source A was built from."""
        a, b = self.arms.a, self.arms.b
        second = f" (B from {b.source})" if b.source != a.source else ""
        if not self.arms.patches:
            return f"host kernel source: {a.source} against {b.source}"
        named = ", ".join(f"{p.path.name} (sha256 {p.sha256[:SHA_SHOWN]})" for p in self.arms.patches)
        word = "host patch" if len(self.arms.patches) == 1 else "host patches"
        return f"{word}: {named}, on {a.source}{second}"

    def arm_names(self) -> tuple[str, str]:
        """A and B as the comparison names them: each host kernel, B with
        its patches' subject lines."""
        return arm_names(self.arms.a.name, self.arms.b.name, [p.subject for p in self.arms.patches], HOST_ARM)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.arms.to_json(TEXTS),
            "host_kernel": [self.arms.a.name, self.arms.b.name],
            "sources": list(self.sources),
            "config_fragments": list(self.fragments),
            "axis": self.axis(),
            "scope": self.scope.to_json(),
        }

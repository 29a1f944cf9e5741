"""``memqual run --host-patch FILE``: a host-side patch (KVM, mm) qualified
as an A/B of host kernels.  Host kernels A (the source as it is) and B (with
the patches) are built as ``memqual run --patch`` builds guest kernels
(images/kernel_arms.py), with images/host.config on top, and the run is
then ``--host-kernel A --host-kernel B``'s, limited to the scenarios whose
host_paths the patch touches (host/run/host_scope.py) and named by the
patch (``host_patch_run``, as ``--patch`` hands over its PatchRun)
(docs/host-under-test.md, "Qualifying a host patch")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from memqual.host.cli.command import Option, Run
from memqual.host.cli.kernel import (
    SOURCES_NOT_LISTED,
    built_lines,
    keep_record,
    say_progress,
    show_escaped,
    tests_prefix,
    touched_files,
)
from memqual.host.cli.run import config_from_args, output_directory, planned
from memqual.host.core import scenario
from memqual.host.core.errors import BadInput
from memqual.host.run import host_scope
from memqual.host.run.config import job_profile
from memqual.host.run.patch_scope import NOTHING, PatchScope
from memqual.host.run.signals import terminate_as_exception
from memqual.images.kernel_config import read_fragment
from memqual.images.kernel_patches import read_patch
from memqual.images.kernel_sources import HOST_SOURCE

if TYPE_CHECKING:
    from memqual.images.kernel_arms import PatchArms

# The host kernels' names in the run-option checks made before the builds.
STAND_INS = ["host-patch-A", "host-patch-B"]


def configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host-patch",
        action="append",
        default=[],
        metavar="FILE",
        help="qualify a host kernel patch (KVM, mm): host kernel A is --host-kernel-source as it is, B with the "
        "patch (repeatable, in order), both built with images/host.config (memqual kernel build), then run as "
        "--host-kernel A --host-kernel B; the scenarios whose host_paths it touches run, of those --only selects "
        "(--all-scenarios: every one; docs/host-under-test.md)",
    )
    parser.add_argument(
        "--host-kernel-source",
        action="append",
        default=[],
        metavar="SOURCE",
        help=f"with --host-patch: the source the host kernels are built from (debian:X.Y, a folder or DIR@REV; "
        f"default {HOST_SOURCE}: Debian's linux-source-6.1, the memslot host kernels' source); twice: A from "
        "the first, B from the second",
    )
    parser.add_argument(
        "--host-kernel-config",
        action="append",
        default=[],
        metavar="FRAGMENT",
        help="with --host-patch: a Kconfig fragment for both host kernels, on top of images/host.config",
    )


def refuse_beside(args: argparse.Namespace) -> None:
    """The options a host patch cannot go with, and the counts it needs:
    one line each, before anything is read or built."""
    if args.host_kernel:
        raise BadInput(
            "give --host-patch/--host-kernel-source or --host-kernel, not both: --host-patch builds both host kernels"
        )
    if getattr(args, "patch", None) or getattr(args, "kernel_source", None):
        raise BadInput(
            "give --host-patch/--host-kernel-source or --patch/--kernel-source, not both: "
            "a run compares one kernel axis, the host's or the guest's"
        )
    if len(args.host_kernel_source) > 2:
        raise BadInput("give --host-kernel-source at most twice (A and B)")
    if len(args.host_kernel_source) == 1 and not args.host_patch:
        raise BadInput(
            "one --host-kernel-source compares nothing: give --host-patch FILE, or --host-kernel-source twice"
        )


def as_host(exc: BadInput) -> BadInput:
    """A patch's or a fragment's refusal as this option names it: read_patch
    and read_fragment name the options of ``--patch`` and ``kernel build``."""
    text = str(exc)
    for guest, host in (("--patch ", "--host-patch "), ("--config ", "--host-kernel-config ")):
        if text.startswith(guest):
            return BadInput(host + text.removeprefix(guest))
    return exc


def check_inputs(args: argparse.Namespace) -> None:
    """Every patch and fragment read and checked as the build will read
    them (a file, a unified diff, CONFIG_X=value lines), before any build."""
    try:
        for path in args.host_patch:
            read_patch(path)
        for path in args.host_kernel_config:
            read_fragment(path)
    except BadInput as exc:
        raise as_host(exc) from None


def check_run(args: argparse.Namespace, output: Path) -> None:
    """The run's other options, checked before builds that may take an
    hour: the same checks, with two names standing in for the host kernels
    (and the scope's tests, ``args.test_scope``, for the budget)."""
    stand_in = argparse.Namespace(**{**vars(args), "output": str(output), "host_kernel": list(STAND_INS)})
    checked = config_from_args(stand_in)
    if args.until_decided:
        # a budget that cannot hold the run is refused before the builds
        planned(stand_in, checked)


def scope_of(args: argparse.Namespace) -> PatchScope:
    """Which scenarios the run covers: those whose host_paths the patches
    (and a second source's differences) touch, of those --only selects in
    the run's profile; all of those with --all-scenarios
    (host/run/host_scope.py)."""
    try:
        files = touched_files(args.host_kernel_source, args.host_patch)
    except BadInput as exc:
        raise as_host(exc) from None
    rows, profile, only = scenario.table(), job_profile(args.profile, 2), args.only or ()
    if files is None:
        return host_scope.every_scenario((), SOURCES_NOT_LISTED, rows, profile, only)
    if getattr(args, "all_scenarios", False):  # run --patch's option, on the same parser
        return host_scope.every_scenario(files, "--all-scenarios given", rows, profile, only)
    return host_scope.host_scope_of(files, rows, profile, only)


def take_scope(args: argparse.Namespace) -> PatchScope:
    """The scope, refused in one line when it leaves nothing the patch can
    move; its tests handed to the run (``args.test_scope``) when --tests is
    a folder (a file names its own tests)."""
    scope = scope_of(args)
    if scope.kind == NOTHING:
        raise BadInput(scope.line())
    args.test_scope = scope.test_scope(tests_prefix(Path(args.tests))) if Path(args.tests).is_dir() else None
    return scope


def build_hosts(sources: list[str], patches: list[str], fragments: list[str]) -> PatchArms:
    """A then B through ``memqual run --patch``'s build; a patch that does
    not apply is named as --host-patch."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_arms import arms

    try:
        with terminate_as_exception():
            return arms(sources, patches, fragments, say=say_progress)
    except BadInput as exc:
        raise as_host(exc) from None


def show(built: PatchArms) -> None:
    """A and B (cached or built, how long), the patches, what differs."""
    for line in built_lines(built, "host "):
        show_escaped(line)
    show_escaped(f"running as --host-kernel {built.a.name} --host-kernel {built.b.name}")


def run_with_host_patch(args: argparse.Namespace, inner: Run) -> int:
    """Build host kernels A and B, keep what names the patch in
    OUTPUT/host-patch.json (the texts in OUTPUT/host-patch/), and hand the
    two kernels' names to the run as --host-kernel twice, with its scope
    (``test_scope``) and what it built (``host_patch_run``)."""
    if not args.host_patch and not args.host_kernel_source:
        if args.host_kernel_config:
            raise BadInput("--host-kernel-config is for the host kernels --host-patch builds: give --host-patch FILE")
        return inner(args)
    refuse_beside(args)
    check_inputs(args)
    output = output_directory(args, "memqual-results")
    scope = take_scope(args)
    check_run(args, output)
    show_escaped(scope.line())
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_build import HOST_CONFIG

    sources = list(args.host_kernel_source) or [HOST_SOURCE]
    fragments = [str(HOST_CONFIG), *args.host_kernel_config]
    built = build_hosts(sources, args.host_patch, fragments)
    args.output = str(output)
    args.host_kernel = [built.a.name, built.b.name]
    # the run takes the value itself; host-patch.json is the users' record of it
    args.host_patch_run = host_scope.HostPatchRun(built, scope, tuple(sources), tuple(fragments))
    keep_record(output, host_scope.TEXTS, built, args.host_patch_run.to_json())
    show(built)
    return inner(args)


RUN_HOST_PATCH = Option("run", configure_run, run_with_host_patch)

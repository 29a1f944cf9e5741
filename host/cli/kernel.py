"""``memqual kernel build|list``: guest kernels built from source (Debian's
linux-source, a folder, a git revision) with memqual's guest config, as an
unprivileged user, cached (memqual.images.kernel_build)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command, Option, Run, dispatch
from memqual.host.cli.run import config_from_args, output_directory, planned
from memqual.host.core import scenario
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT, write_private_atomic
from memqual.host.core.printable import one_line
from memqual.host.run import patch_scope
from memqual.host.run.config import job_profile
from memqual.host.run.signals import terminate_as_exception
from memqual.images.built_kernels import listing
from memqual.images.kernel_import import import_kernel
from memqual.images.kernel_patches import read_patch
from memqual.images.kernel_sources import source_diff_files

if TYPE_CHECKING:
    from memqual.images.built_kernels import BuiltKernel
    from memqual.images.kernel_arms import PatchArms

DESCRIPTION = """Build a guest kernel and its modules from SOURCE with memqual's guest
config (images/guest.config on x86_64_defconfig + kvm_guest.config), the
patches applied in order and --config fragments on top; unpacking, patching
and compiling run as an unprivileged user (nobody, or $MEMQUAL_BUILD_USER).
Cached by the source's hash, every patch, the config and the compiler.
Prints the kernel's name and the options that boot it."""

IMPORT_DESCRIPTION = """Copy a bzImage and its installed modules into memqual's cache as a kernel
named by its release and the hash of the copy.  The name, the cache's
bzImage and the original bzImage (while its bytes are the same) then work
wherever a kernel is given: --debian-kernel, --host-kernel (a host under
test needs kvm and kvm_amd as modules)."""


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="kernel_command", required=True)
    build = actions.add_parser(
        "build", help="build a guest kernel from source (or find it cached)", description=DESCRIPTION
    )
    build.add_argument("source", metavar="SOURCE", help="debian:X.Y (Debian's linux-source-X.Y), a folder, or DIR@REV")
    build.add_argument("--patch", action="append", default=[], metavar="FILE", help="a patch (-p1), in order")
    build.add_argument(
        "--config", action="append", default=[], metavar="FRAGMENT", help="a Kconfig fragment on top of memqual's"
    )
    build.add_argument("--jobs", "-j", type=cliargs.count, default=None, help="make -j (default: the CPUs)")
    build.add_argument("--force", action="store_true", help="rebuild even when cached")
    build.add_argument("--json", action="store_true", help="print the record as one JSON object")
    build.set_defaults(handler=_build)
    imported = actions.add_parser(
        "import",
        help="make a kernel built elsewhere (a bzImage and its installed modules) one of memqual's",
        description=IMPORT_DESCRIPTION,
    )
    imported.add_argument("bzimage", metavar="BZIMAGE", type=Path, help="the kernel (arch/x86/boot/bzImage)")
    imported.add_argument(
        "--modules",
        type=Path,
        metavar="DIR",
        help="its installed modules, lib/modules/RELEASE (default /lib/modules/RELEASE, where make modules_install "
        "puts them)",
    )
    imported.add_argument("--config", type=Path, metavar="FILE", help="its .config, kept beside it")
    imported.add_argument("--json", action="store_true", help="print the record as one JSON object")
    imported.set_defaults(handler=_import)
    listing = actions.add_parser("list", help="list the kernels built or imported here")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=_list)


def say_progress(text: str) -> None:
    """A build's progress line: make's file names and failure text are the
    tree's, a step's name the patch's file name."""
    print(one_line(text), file=sys.stderr, flush=True)


def show_escaped(text: str) -> None:
    """One line of what was built: a patch's subject and file names, a
    source's label, .config values, a build's paths come from input memqual
    does not trust, so each control character is shown as an escape."""
    print(one_line(text))


def _build(args: argparse.Namespace) -> int:
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_build import build

    # SIGTERM/SIGHUP end the build like Ctrl-C: make's process group and
    # the build folder go with it (the default action would leave make
    # running in a session of its own).
    with terminate_as_exception():
        kernel = build(args.source, args.patch, args.config, jobs=args.jobs, force=args.force, say=say_progress)
    if args.json:
        print(json.dumps(kernel.to_json(), indent=2))
        return 0
    state = (
        "cached"
        if kernel.cached
        else f"built in {kernel.build_s:.0f} s ({'incremental' if kernel.incremental else 'full'}, -j{kernel.jobs})"
    )
    show_escaped(f"{kernel.name}: {kernel.release} from {kernel.source}, {state}")
    for line in step_lines(kernel):
        show_escaped(line)
    for patch in kernel.patches:
        show_escaped(f"  patch {patch.subject} ({', '.join(patch.files)}; sha256 {patch.sha256[:12]})")
    for line in kernel.config_unmet:
        show_escaped(f"  config not kept: {line}")
    show_escaped(f"  --guest-kernel {kernel.bzimage} --guest-modules {kernel.modules}")
    return 0


def _import(args: argparse.Namespace) -> int:
    with terminate_as_exception():
        kernel = import_kernel(args.bzimage, args.modules, args.config)
    if args.json:
        print(json.dumps(kernel.to_json(), indent=2))
        return 0
    show_escaped(f"{kernel.name}: {kernel.release} {kernel.source}{', already imported' if kernel.cached else ''}")
    show_escaped(f"  --debian-kernel {kernel.name} or --host-kernel {kernel.name}")
    return 0


def _list(args: argparse.Namespace) -> int:
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built

    kernels = listing()
    if args.json:
        print(json.dumps([k.to_json() for k in kernels], indent=2))
        return 0
    for kernel in kernels:
        patches = ", ".join(p.subject for p in kernel.patches) or "no patch"
        show_escaped(f"{kernel.name}  {kernel.source}  {patches}")
    return 0


COMMAND = Command(
    "kernel",
    "build guest kernels from source (Debian's, a folder, a git revision) or import one",
    configure,
    dispatch,
    DESCRIPTION,
)


# ------------------------------------------------------------ memqual run --patch


def configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--patch",
        action="append",
        default=[],
        metavar="FILE",
        help="qualify a kernel patch: A is --kernel-source as it is, B with the patch (repeatable, in order); "
        "both built with memqual's guest config (memqual kernel build) and compared as two kernels",
    )
    parser.add_argument(
        "--kernel-source",
        action="append",
        default=[],
        metavar="SOURCE",
        help="with --patch: the source A and B are built from (debian:X.Y, a folder or DIR@REV; default the "
        "default Debian kernel's); twice: A from the first, B from the second",
    )
    parser.add_argument(
        "--kernel-config", action="append", default=[], metavar="FRAGMENT", help="a Kconfig fragment for both arms"
    )
    parser.add_argument(
        "--all-scenarios",
        action="store_true",
        help="with --patch: run every scenario, not only those whose kernel_paths the patch touches (and the "
        "negative controls); --only, when given, decides alone.  With --host-patch: every scenario --only "
        "selects, not only those whose host_paths the patch touches",
    )


def step_lines(kernel: BuiltKernel) -> list[str]:
    """Each build step's wall time (and its processes' CPU time where it
    was counted), ccache's hits and misses, and the balloon driver variant."""
    lines = []
    for step, seconds in kernel.steps_s.items():
        cpu = kernel.cpu_s.get(step)
        lines.append(f"  {step}: {seconds:.0f} s" + (f", {cpu:.0f} s CPU" if cpu is not None else ""))
    if kernel.ccache:
        lines.append(f"  ccache: {kernel.ccache['hits']} hits, {kernel.ccache['misses']} misses")
    variant = kernel.balloon_variant
    lines.append(f"  balloon driver variant: {variant or 'none (' + str(kernel.balloon_variant_unavailable) + ')'}")
    return lines


def controls_left_out(only: Sequence[str]) -> tuple[list[str], str]:
    """The negative control scenarios that --only's tags leave out of the
    run (all of them, when no tag of theirs is given; none without --only),
    and the one tag that would bring them back and nothing else."""
    rows = scenario.table()
    controls = [r for r in rows if r.control]
    if not only or not controls or any(set(only) & set(r.tags) for r in controls):
        return [], ""
    shared = set.intersection(*(set(r.tags) for r in controls)) - {"ab"}
    alone = sorted(t for t in shared if all(r.control for r in rows if t in r.tags))
    return [r.name for r in controls], alone[0] if alone else ""


# Why a scope cannot be read from two sources (touched_files: None).
SOURCES_NOT_LISTED = "two sources whose differences are not listed (two revisions of one repository are)"


def touched_files(sources: Sequence[str], patches: Sequence[str]) -> tuple[str, ...] | None:
    """Every file the patches (and, for two sources, their differences)
    touch, each once; None when two sources' differences are not listed."""
    # every file any patch may touch (images/patch_files.py), each once;
    # a dict: a list's "not in" made a patch of many files quadratic
    files: dict[str, None] = {}
    if len(sources) == 2:
        between = source_diff_files(sources[0], sources[1])
        if between is None:
            return None
        files.update(dict.fromkeys(between))
    for path in patches:
        files.update(dict.fromkeys(read_patch(path).files))
    return tuple(files)


def patch_scope_of(args: argparse.Namespace) -> patch_scope.PatchScope:
    """What the run covers: the scenarios whose kernel_paths the patches
    (and a second source's differences) touch, with the negative controls;
    everything when --all-scenarios asks for it; --only's tags alone when
    given (host/run/patch_scope.py)."""
    files = touched_files(args.kernel_source, args.patch)
    if files is None:
        return patch_scope.PatchScope(patch_scope.EVERYTHING, (), SOURCES_NOT_LISTED)
    if args.only:
        return patch_scope.PatchScope(patch_scope.ONLY, tuple(files), f"--only {' '.join(args.only)} given")
    if args.all_scenarios:
        return patch_scope.PatchScope(patch_scope.EVERYTHING, tuple(files), "--all-scenarios given")
    return patch_scope.scope_of(tuple(files), scenario.table(), job_profile(args.profile, 2))


def tests_prefix(tests: Path) -> str:
    """The tests' folder as avocado's references name it (relative to the
    repository, where avocado runs)."""
    try:
        return str(tests.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(tests)


def run_with_patch(args: argparse.Namespace, inner: Run) -> int:
    """Build A and B, hand them to the two-kernel run as --guest-kernel and
    --guest-modules with what it built and covers (``patch_run``), and
    keep what names the patch in OUTPUT/patch.json (with the patch's text
    in OUTPUT/patch/)."""
    if not args.patch and not args.kernel_source:
        return inner(args)
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_arms import arms

    if args.guest_kernel or args.guest_modules or args.debian_kernel or args.kernel_build:
        raise BadInput("give --patch/--kernel-source or the kernels (--guest-kernel, --debian-kernel), not both")

    output = output_directory(args, "memqual-results")
    # The run's other options are checked before builds that may take an
    # hour: the same checks, with this file standing in for both kernels.

    stand_in = Path(__file__)
    checked = config_from_args(
        argparse.Namespace(
            **{
                **vars(args),
                "output": str(output),
                "guest_kernel": [str(stand_in)] * 2,
                "guest_modules": [str(stand_in.parent)] * 2,
            }
        )
    )
    scope = patch_scope_of(args)
    show_escaped(scope.line())
    if scope.kind == "nothing":
        return 0  # before any build: no guest kernel can differ
    # a scope names tests below the tests' folder (--tests naming one file: no scope)
    args.test_scope = scope.test_scope(tests_prefix(Path(args.tests))) if Path(args.tests).is_dir() else None
    if args.until_decided:
        # a budget that cannot hold the run is refused before builds that may take an hour
        planned(args, dataclasses.replace(checked, scope=args.test_scope))
    left_out, tag = controls_left_out(args.only or ())
    if left_out:
        # said before the builds: the run's verdicts would rest on the
        # interleaving of A and B alone
        show_escaped(
            f"--only {' '.join(args.only)} leaves out every negative control ({', '.join(left_out)}): "
            "nothing will check that the host held still" + (f"; add --only {tag} to keep them" if tag else "")
        )
    with terminate_as_exception():
        built = arms(args.kernel_source, args.patch, args.kernel_config, say=say_progress)
    args.output = str(output)
    args.guest_kernel = [str(built.a.bzimage), str(built.b.bzimage)]
    args.guest_modules = [str(built.a.modules), str(built.b.modules)]
    # the run takes the value itself; patch.json is the users' record of it
    args.patch_run = patch_scope.PatchRun(built, scope)
    keep_record(output, "patch", built, args.patch_run.to_json())
    for line in built_lines(built):
        show_escaped(line)
    return inner(args)


def keep_record(output: Path, name: str, built: PatchArms, record: dict[str, Any]) -> None:
    """What names a patch run in OUTPUT: each patch's text in OUTPUT/NAME/
    (``1-FILE``, in the order applied) and ``record`` as OUTPUT/NAME.json."""
    (output / name).mkdir(parents=True, exist_ok=True)
    for patch, text_name in zip(built.patches, built.text_names(), strict=True):
        write_private_atomic(output / name / text_name, patch.data, 0o644)
    write_private_atomic(output / f"{name}.json", (json.dumps(record, indent=2) + "\n").encode(), 0o644)


def built_lines(built: PatchArms, what: str = "") -> list[str]:
    """A and B (cached, or built and how long, step by step), the patches
    and what differs between them; ``what`` names the kernels ("host ")."""
    lines = []
    for label, kernel in (("A", built.a), ("B", built.b)):
        state = "cached" if kernel.cached else f"built in {kernel.build_s:.0f} s"
        lines.append(f"{what}{label}: {kernel.name} ({kernel.source}; {state})")
        lines += step_lines(kernel) if not kernel.cached else []
    for patch in built.patches:
        lines.append(f"{what}patch: {patch.subject} ({', '.join(patch.files)}; sha256 {patch.sha256[:12]})")
    same = "none (the same bzImage and modules)"
    lines.append(f"config differences between {what}A and B: {'; '.join(built.config_diff) or 'none'}")
    lines.append(f"built differences between {what}A and B: {'; '.join(built.built_diff) or same}")
    return lines


RUN_PATCH = Option("run", configure_run, run_with_patch)

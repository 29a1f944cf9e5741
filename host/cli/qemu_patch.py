"""``memqual run --qemu-patch FILE``: a QEMU patch qualified as an A/B of
two QEMUs built from one Debian source (images/qemu_build.py): A as it is
(or with --qemu-base-patch), B with the patches too; the run is then ``--qemu A --qemu B``'s, its texts and
builds kept in OUTPUT/qemu-patch.json and OUTPUT/qemu-patch/
(docs/qemu-builds.md, "A QEMU patch as an A/B")."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from memqual.host.cli.command import Option, Run
from memqual.host.cli.run import config_from_args, output_directory, planned
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.printable import one_line
from memqual.host.run.signals import terminate_as_exception
from memqual.images.kernel_patches import Patch, read_patch

# The QEMUs' names in the run-option checks made before the builds.
STAND_INS = ["qemu-patch-A", "qemu-patch-B"]
RECORD = "qemu-patch"


def configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--qemu-patch",
        action="append",
        default=[],
        metavar="FILE",
        help="qualify a QEMU patch: QEMU A is Debian's qemu source (--qemu-source) as it is, B with the patch "
        "(repeatable, in order), both built by memqual qemu build, then run as --qemu A --qemu B "
        "(docs/qemu-builds.md)",
    )
    parser.add_argument(
        "--qemu-base-patch",
        action="append",
        default=[],
        metavar="FILE",
        help="with --qemu-patch: a patch both QEMUs carry, applied first (memqual's outer-QEMU fix, say: "
        "docs/patches/qemu-0001-...), so that B differs from A by --qemu-patch alone",
    )
    parser.add_argument(
        "--qemu-source",
        metavar="VERSION",
        help="with --qemu-patch: the qemu source version both are built from (default: the system QEMU's source)",
    )


def refuse_beside(args: argparse.Namespace) -> None:
    if getattr(args, "qemu", None):
        raise BadInput("give --qemu-patch or --qemu, not both: --qemu-patch builds both QEMUs")
    if getattr(args, "patch", None) or getattr(args, "host_patch", None):
        raise BadInput("give one patch axis: --qemu-patch, --patch (guest kernel) or --host-patch (host kernel)")


def named_as(exc: BadInput, option: str) -> BadInput:
    """A refusal as ``memqual qemu build``'s options name it ("--patch ...",
    "--version ...") as this command's options do."""
    text = str(exc)
    if text.startswith("--patch "):
        return BadInput(f"{option} " + text.removeprefix("--patch "))
    if text.startswith("--version "):
        return BadInput("--qemu-source " + text.removeprefix("--version "))
    return exc


def read_patches(paths: list[str], option: str) -> list[Patch]:
    try:
        return [read_patch(path) for path in paths]
    except BadInput as exc:
        raise named_as(exc, option) from None


def check_run(args: argparse.Namespace, output: Path) -> None:
    """The run's other options, checked before the builds, with two names
    standing in for the QEMUs."""
    stand_in = argparse.Namespace(**{**vars(args), "output": str(output), "qemu": list(STAND_INS)})
    checked = config_from_args(stand_in)
    if args.until_decided:
        planned(stand_in, checked)


def run_with_qemu_patch(args: argparse.Namespace, inner: Run) -> int:
    """Build QEMUs A and B, keep their record in OUTPUT, and hand the two
    builds' names to the run as --qemu twice."""
    if not args.qemu_patch:
        if args.qemu_source or args.qemu_base_patch:
            raise BadInput("--qemu-source and --qemu-base-patch are for --qemu-patch's QEMUs: give --qemu-patch FILE")
        return inner(args)
    refuse_beside(args)
    base = read_patches(args.qemu_base_patch, "--qemu-base-patch")
    patches = read_patches(args.qemu_patch, "--qemu-patch")
    output = output_directory(args, "memqual-results")
    check_run(args, output)
    # lazy: the build's modules only where a QEMU is built
    from memqual.host.core.paths import cache_dir
    from memqual.images.qemu_build import build
    from memqual.images.qemu_sources import resolve

    # one source version for both: the archive's lists may move during A's build
    try:
        version = resolve(args.qemu_source, cache_dir())
    except BadInput as exc:
        raise named_as(exc, "--qemu-source") from None

    def progress(text: str) -> None:
        import sys

        print(one_line(text), file=sys.stderr, flush=True)

    try:
        with terminate_as_exception():
            a = build(version, args.qemu_base_patch, say=progress)
    except BadInput as exc:
        raise named_as(exc, "--qemu-base-patch") from None
    try:
        with terminate_as_exception():
            b = build(version, [*args.qemu_base_patch, *args.qemu_patch], say=progress)
    except BadInput as exc:
        raise named_as(exc, "--qemu-patch") from None
    # what was built is what the record names: a patch file changed on disk
    # during the builds would make A, B and the record disagree
    read = [p.sha256 for p in [*base, *patches]]
    if [p.sha256 for p in a.patches] != read[: len(base)] or [p.sha256 for p in b.patches] != read:
        raise BadInput("a patch file changed while QEMU was built: run the command again")
    if a.source != b.source:
        raise BadInput(f"A was built from {a.source}, B from {b.source}: run the command again")
    for label, built in (("A", a), ("B", b)):
        state = "cached" if built.cached else f"built in {built.build_s:.0f} s"
        print(one_line(f"QEMU {label}: {built.name} ({built.describe()}; {state})"))
    args.output = str(output)
    args.qemu = [a.name, b.name]
    (output / RECORD).mkdir(parents=True, exist_ok=True)
    for index, patch in enumerate([*base, *patches], 1):
        write_private_atomic(output / RECORD / f"{index}-{patch.path.name}", patch.data, 0o644)
    record = {
        "a": a.to_json(),
        "b": b.to_json(),
        "source": a.source,
        "base_patches": [dataclasses.asdict(p.record()) for p in base],
        "patches": [dataclasses.asdict(p.record()) for p in patches],
    }
    write_private_atomic(output / f"{RECORD}.json", (json.dumps(record, indent=2) + "\n").encode(), 0o644)
    print(one_line(f"running as --qemu {a.name} --qemu {b.name}"))
    return inner(args)


RUN_QEMU_PATCH = Option("run", configure_run, run_with_qemu_patch)

"""``memqual qemu list|build``: the QEMUs Debian's archive offers by
version (stable, its updates and security suites, backports), the ones
built here from Debian's source with patches (images/qemu_build.py), and
which one runs now."""

from __future__ import annotations

import argparse
import json
import sys

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command, dispatch
from memqual.host.core.paths import cache_dir
from memqual.host.core.printable import one_line
from memqual.host.run.signals import terminate_as_exception
from memqual.images.built_qemus import listing as built_listing
from memqual.images.qemu import available, load, qemu_root

BUILD_DESCRIPTION = """Build qemu-system-x86_64 from Debian's qemu source package (the system
QEMU's source version unless --version names another), Debian's own patches
applied and then the given ones, in order; unpacking, patching and compiling
run as an unprivileged user (nobody, or $MEMQUAL_BUILD_USER).  Cached by the
source's .dsc, every patch, the configure options and the compiler.  Prints
the build's name, which --qemu takes wherever it takes a version."""


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="qemu_command", required=True)
    listing = actions.add_parser("list", help="list the archive's qemu-system-x86 versions and the builds made here")
    listing.add_argument("--update", action="store_true", help="refresh the private package lists first")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=_list)
    build = actions.add_parser(
        "build", help="build QEMU from Debian's source with patches", description=BUILD_DESCRIPTION
    )
    build.add_argument(
        "--version", dest="source_version", metavar="VERSION", help="the qemu source version (7.2 or Debian's)"
    )
    build.add_argument("--patch", action="append", default=[], metavar="FILE", help="a patch (-p1), in order")
    build.add_argument("--jobs", "-j", type=cliargs.count, default=None, help="ninja -j (default: the CPUs)")
    build.add_argument("--force", action="store_true", help="rebuild even when cached")
    build.add_argument("--json", action="store_true", help="print the record as one JSON object")
    build.set_defaults(handler=_build)


def _list(args: argparse.Namespace) -> int:
    cache = cache_dir()
    offers = available(cache, update=args.update)
    root = qemu_root(cache)
    cached = {u.archive.package_version for p in root.iterdir() if (u := load(p)) is not None}
    builds = built_listing(cache)
    if args.json:
        rows = [{**o.__dict__, "cached": o.package_version in cached} for o in offers]
        print(json.dumps({"qemu": rows, "builds": [b.to_json() for b in builds]}, indent=2))
        return 0
    for o in offers:
        mark = "  (cached)" if o.package_version in cached else ""
        print(f"{o.version:10} {o.package_version:36} {o.suite}{mark}")
    for b in builds:
        print(one_line(f"{b.name:22} {b.describe()}"))
    return 0


def _build(args: argparse.Namespace) -> int:
    from memqual.images.qemu_build import build

    def progress(text: str) -> None:
        print(one_line(text), file=sys.stderr, flush=True)

    # SIGTERM/SIGHUP end the build like Ctrl-C: ninja's process group and
    # the build folder go with it
    with terminate_as_exception():
        built = build(args.source_version, args.patch, jobs=args.jobs, force=args.force, say=progress)
    if args.json:
        print(json.dumps(built.to_json(), indent=2))
        return 0
    state = "cached" if built.cached else f"built in {built.build_s:.0f} s (-j{built.jobs})"
    print(one_line(f"{built.name}: QEMU {built.version} from {built.source}, {state}"))
    for step, seconds in built.steps_s.items():
        print(one_line(f"  {step}: {seconds:.0f} s"))
    if built.ccache:
        print(f"  ccache: {built.ccache['hits']} hits, {built.ccache['misses']} misses")
    for patch in built.patches:
        print(one_line(f"  patch {patch.subject} ({', '.join(patch.files)}; sha256 {patch.sha256[:12]})"))
    print(one_line(f"  --qemu {built.name}"))
    return 0


COMMAND = Command(
    "qemu",
    help="the QEMU versions the archive offers and QEMUs built from source (for --qemu)",
    configure=configure,
    run=dispatch,
)

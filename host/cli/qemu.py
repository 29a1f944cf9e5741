"""``memqual qemu list``: the QEMUs Debian's archive offers by version
(stable, its updates and security suites, backports), and which one runs
now."""

from __future__ import annotations

import argparse
import json

from memqual.host.cli.command import Command, dispatch
from memqual.host.core.paths import cache_dir
from memqual.images.qemu import available, load, qemu_root


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="qemu_command", required=True)
    listing = actions.add_parser("list", help="list the archive's qemu-system-x86 versions")
    listing.add_argument("--update", action="store_true", help="refresh the private package lists first")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=_list)


def _list(args: argparse.Namespace) -> int:
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built

    cache = cache_dir()
    offers = available(cache, update=args.update)
    root = qemu_root(cache)
    cached = {u.archive.package_version for p in root.iterdir() if (u := load(p)) is not None}
    if args.json:
        rows = [{**o.__dict__, "cached": o.package_version in cached} for o in offers]
        print(json.dumps({"qemu": rows}, indent=2))
        return 0
    for o in offers:
        mark = "  (cached)" if o.package_version in cached else ""
        print(f"{o.version:10} {o.package_version:36} {o.suite}{mark}")
    return 0


COMMAND = Command(
    "qemu",
    help="the QEMU versions the archive offers (for --qemu VERSION)",
    configure=configure,
    run=dispatch,
)

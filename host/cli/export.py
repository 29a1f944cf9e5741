"""``memqual export --kcidb FILE RESULTS.json``: a run as KCIDB JSON
(memqual.host.report.export builds and validates it), written or printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import write_private_atomic
from memqual.host.judge.results import load_results
from memqual.host.report.export import ORIGIN, ExportInvalid, to_kcidb


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kcidb",
        type=cliargs.output_file_or_stdout,
        metavar="FILE",
        required=True,
        help="the KCIDB JSON to write ('-': standard output)",
    )
    parser.add_argument("--origin", default=ORIGIN, help=f"the CI system's name in KCIDB ids (default {ORIGIN})")
    parser.add_argument("results", metavar="RESULTS.json", help="a memqual run's results.json")


def main(args: argparse.Namespace) -> int:
    results = load_results(args.results).to_json()
    data = to_kcidb(results, origin=args.origin)
    # A NaN token is valid neither as JSON nor as KCIDB: a figure that is
    # not finite here is a bug in to_kcidb, never something to write.
    try:
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    except ValueError as exc:
        raise ExportInvalid(f"{args.results}: the export holds a number that is not finite ({exc})") from exc
    if args.kcidb == "-":
        sys.stdout.write(text)
        return 0
    target = Path(args.kcidb)
    if target.is_dir():
        raise BadInput(f"--kcidb {target}: is a directory; give a file name")
    try:
        write_private_atomic(target, text.encode(), 0o644)
    except FileNotFoundError as exc:
        raise BadInput(f"--kcidb {target}: no such directory {target.parent}") from exc
    counts = {k: sum(1 for t in data["tests"] if t["path"].startswith(f"memqual.{k}")) for k in ("claims", "e2e")}
    metrics = len(data["tests"]) - sum(counts.values())
    print(
        f"wrote {target}: KCIDB {data['version']['major']}.{data['version']['minor']}, {metrics} metrics, "
        f"{counts['claims']} claims, {counts['e2e']} avocado tests (validated with kcidb-io)"
    )
    return 0


COMMAND = Command(
    "export",
    help="write a run's results.json in a format kernel CI ingests (KCIDB JSON)",
    configure=configure,
    run=main,
    description="Write a memqual run as KCIDB JSON (checkout, build, a test per metric, claim and "
    "avocado test), validated with kcidb-io before it is written.",
)

"""``memqual doctor``: what this host can do, and which accelerator memqual
will use."""

from __future__ import annotations

import argparse
import dataclasses
import json

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command
from memqual.host.core import printable
from memqual.host.core.probe import report
from memqual.host.core.qemu_binary import choose


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--reprobe", action="store_true", help="boot under KVM again instead of using the cached answer"
    )
    cliargs.add_qemu(parser)


def _doctor(args: argparse.Namespace) -> int:
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built

    if args.qemu:
        choose(cliargs.one_qemu(args.qemu))
    result = report(force=args.reprobe)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
        return 0
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.table import Table

    table = Table(title="memqual doctor", show_header=False)
    for field in dataclasses.fields(result):
        value = getattr(result, field.name)
        table.add_row(field.name, str(value))
    printable.console().print(table)
    return 0


COMMAND = Command(
    "doctor",
    help="probe QEMU, KVM, KSM and THP on this host",
    configure=configure,
    run=_doctor,
)

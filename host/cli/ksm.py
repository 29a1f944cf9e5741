"""``memqual ksm status|restore``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command, dispatch
from memqual.host.core import printable
from memqual.host.core.environment import KSM_ROOT
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.knobs import Sysfs
from memqual.host.ksm import procfs
from memqual.host.ksm.controller import read_counters
from memqual.host.ksm.state import HostState, restore_stale


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="ksm_command", metavar="ACTION", required=True)

    status = sub.add_parser("status", help="print the KSM knobs, counters, ksmd CPU time and who holds the lock")
    status.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    status.add_argument(
        "--pid",
        type=cliargs.count,
        action="append",
        default=[],
        help="also show this process's ksm_merging_pages/ksm_stat (repeatable)",
    )
    status.set_defaults(handler=_status)

    restore = sub.add_parser("restore", help="put back the knobs a killed memqual run left changed")
    restore.add_argument(
        "--wait",
        type=cliargs.non_negative,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a live run to finish first",
    )
    restore.set_defaults(handler=_restore)

    for p in (status, restore):
        p.add_argument(
            "--state-dir",
            type=lambda text: Path(cliargs.directory_to_make(text)),  # trusted_dir checks it on use
            default=None,
            help="state directory (default $MEMQUAL_STATE_DIR or /run/memqual)",
        )
        p.add_argument(
            "--sysfs", type=lambda text: Path(cliargs.directory(text)), default=None, help=argparse.SUPPRESS
        )  # a fake tree, for tests


def _status(args: argparse.Namespace) -> int:
    fs = Sysfs(args.sysfs or KSM_ROOT)
    if not fs.exists():
        raise CapabilityMissing(f"host KSM: {fs.root} does not exist (kernel built without CONFIG_KSM)")
    state = HostState(args.state_dir, ksm_root=fs.root)
    counters = read_counters(fs, ksmd_pid=procfs.find_ksmd())
    snapshot = state.load()
    processes: dict[str, procfs.ProcessKsm] = {}
    for pid in args.pid:
        try:
            processes[str(pid)] = procfs.process_ksm(pid)
        except FileNotFoundError as exc:
            raise BadInput(f"--pid {pid}: no such process (or a kernel without /proc/PID/ksm_merging_pages)") from exc
    knobs = fs.knobs()
    counter_values = counters.to_json()
    info = {
        "knobs": knobs,
        "counters": counter_values,
        "lock_holder_pid": state.holder(),
        "state_file": str(state.state_path) if snapshot else None,
        "state_owner_pid": snapshot.pid if snapshot else None,
        "processes": {pid: proc.to_json() for pid, proc in processes.items()},
    }
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.table import Table

    table = Table(title=f"host KSM ({fs.root})")
    table.add_column("name")
    table.add_column("value", justify="right")
    for name, knob in knobs.items():
        table.add_row(name, knob)
    for name, value in counter_values.items():
        if name != "taken_s":
            table.add_row(name, "-" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value)))
    for pid, proc in processes.items():
        table.add_row(f"pid {pid} ksm_merging_pages", str(proc.merging_pages))
        for key, stat in proc.stat.items():
            table.add_row(f"pid {pid} {key}", stat)
    console = printable.console()
    console.print(table)
    if snapshot:
        console.print(f"state file {state.state_path}: knobs changed by pid {snapshot.pid} since {snapshot.taken}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    kwargs = {"ksm_root": args.sysfs} if args.sysfs else {"ksm_root": KSM_ROOT}
    state = HostState(args.state_dir, **kwargs)
    if not state.state_path.exists():
        print(f"nothing to restore: no state file {state.state_path}")
        return 0

    logging.getLogger("memqual.host.core.knobs").setLevel(logging.ERROR)  # the line below says it once
    result = restore_stale(args.state_dir, lock_timeout_s=args.wait, **kwargs)
    if result is None:
        if state.state_path.exists():
            raise BadInput(
                f"memqual pid {state.holder()} is driving host KSM now and restores on exit; "
                "wait for it (--wait S) or stop it first"
            )
        print("nothing to restore: the run that held the state finished meanwhile")
        return 0
    print(result.describe())
    return 0


COMMAND = Command(
    "ksm",
    help="host KSM: show counters, restore knobs a killed run left",
    configure=configure,
    run=dispatch,
)

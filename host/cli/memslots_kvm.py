"""``memqual memslots kvm``: the /dev/kvm memslot measurements.

host/cli/memslots.py owns the ``memslots`` command and calls the two
functions here for its ``kvm`` subcommand: :func:`add_arguments` to fill the
subparser, :func:`run` as the handler.  Bad input raises BadInput (the CLI
prints one line and exits 2); a missing /dev/kvm raises CapabilityMissing.
"""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import math
import os
import stat
import sys
from typing import Any

from memqual.host.cli import args as cliargs
from memqual.host.cli import memslots_l1
from memqual.host.core import printable
from memqual.host.core.errors import BadInput

DEFAULT_SLOTS = "1,32,509,32764"
DEFAULT_DEVICE = "/dev/kvm"


def parse_slots(text: str) -> tuple[int, ...]:
    """'1,32,509' -> (1, 32, 509); duplicates dropped, order kept."""
    counts: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise BadInput(f"--slots: {part!r} is not a whole number: give counts like 1,32,509,32764") from None
        if value < 1:
            raise BadInput(f"--slots: {value} is not positive: every slot count must be 1 or more")
        if value not in counts:
            counts.append(value)
    return tuple(counts)


# /dev/kvm is the misc device 10:232 (Documentation/admin-guide/devices.txt).
KVM_MISC_MAJOR = 10
KVM_MINOR = 232
KVM_GET_API_VERSION = 0xAE00  # _IO(KVMIO, 0x00)
KVM_API_VERSION = 12


def check_kvm_device(path: str) -> None:
    """--device must be the KVM device: a character device 10:232, or one
    that answers KVM_GET_API_VERSION with 12 (a KVM module on another
    minor).  The bench opens it read-write as root, so nothing else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return  # no KVM here: the harness says so as a missing capability
    except OSError as exc:
        raise BadInput(f"--device {path}: {exc.strerror or exc}; give the KVM device (/dev/kvm)") from None
    if not stat.S_ISCHR(st.st_mode):
        raise BadInput(f"--device {path} is not a character device: give the KVM device (/dev/kvm)")
    if (os.major(st.st_rdev), os.minor(st.st_rdev)) == (KVM_MISC_MAJOR, KVM_MINOR):
        return

    try:
        # O_RDONLY first: asking the version writes nothing anywhere.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise BadInput(f"--device {path}: {exc.strerror or exc}; give the KVM device (/dev/kvm)") from None
    try:
        answer = fcntl.ioctl(fd, KVM_GET_API_VERSION, 0)
    except OSError:
        answer = -1
    finally:
        os.close(fd)
    if answer != KVM_API_VERSION:
        raise BadInput(
            f"--device {path} (char {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}) is not a KVM device: give /dev/kvm"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slots",
        default=DEFAULT_SLOTS,
        metavar="N,N,...",
        help=f"slot counts to measure, each up to KVM_CAP_NR_MEMSLOTS (default {DEFAULT_SLOTS})",
    )
    parser.add_argument("--repeats", type=int, default=3, metavar="R", help="runs per slot count (default 3)")
    parser.add_argument(
        "--slot-pages",
        type=int,
        default=1,
        metavar="P",
        help="pages per slot (default 1; every slot must stay below 4 GiB)",
    )
    parser.add_argument("--no-vcpu", action="store_true", help="only time slot setup/move/delete; run no guest code")
    parser.add_argument("--device", default=DEFAULT_DEVICE, help=f"the KVM device (default {DEFAULT_DEVICE})")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--records",
        type=cliargs.output_directory,
        metavar="DIR",
        help="also write measurement records (scenario memslots.kvm) into DIR",
    )
    lookup = parser.add_argument_group(
        "per-access lookup costs (--lookup): a miss, a RAM-slot hit and a small-slot hit by slot count, "
        "fresh VMs per replicate (scenario memslots.kvm_lookup)"
    )
    lookup.add_argument(
        "--lookup", action="store_true", help="measure per-access lookup costs instead of slot operations"
    )
    for flag, default, metavar, text in (
        ("--replicates", 3, "R", "fresh VMs per slot count"),
        ("--rounds", 21, "K", "timed rounds per VM"),
        ("--iterations", 600, "I", "loop iterations per pass, 8 writes each"),
    ):
        lookup.add_argument(
            flag, type=cliargs.count, default=default, metavar=metavar, help=f"{text} (default {default})"
        )
    cliargs.add_host_kernel(
        parser, "; the slot operations (or --lookup, --faults, --netperf) run in that host's KVM (memslots_l1.py)"
    )
    cliargs.add_clock(parser, "with --host-kernel: default icount")
    memslots_l1.add_arguments(parser)


def config_from_args(args: argparse.Namespace) -> Any:
    # lazy: the memslot code (~85 ms) is only `memqual memslots`'s
    from memqual.host.memslots.kvm_bench import BenchConfig

    if args.repeats < 1:
        raise BadInput(f"--repeats {args.repeats} is not positive: give 1 or more")
    if args.repeats > cliargs.COUNT_LIMIT:
        raise BadInput(f"--repeats {args.repeats} is too many: give at most {cliargs.COUNT_LIMIT}")
    if args.slot_pages < 1:
        raise BadInput(f"--slot-pages {args.slot_pages} is not positive: give 1 or more")
    if args.host_kernel and args.device != DEFAULT_DEVICE:
        raise BadInput("--device is this machine's: with --host-kernel the benchmark runs on L1's /dev/kvm; drop it")
    if not args.host_kernel:
        check_kvm_device(args.device)
    return BenchConfig(
        slots=parse_slots(args.slots),
        repeats=args.repeats,
        slot_pages=args.slot_pages,
        vcpu=not args.no_vcpu,
        device=args.device,
    )


def run(args: argparse.Namespace) -> int:
    # lazy: the memslot code (~85 ms) is only `memqual memslots`'s
    from memqual.host.memslots import kvm_bench, kvm_results

    if getattr(args, "faults", False) or getattr(args, "netperf", False):
        flag = "--netperf" if args.netperf else "--faults"
        if not args.host_kernel:
            raise BadInput(f"{flag} counts the host under test's memslot searches: give --host-kernel KERNEL")
        if args.faults and args.netperf:
            raise BadInput("--faults and --netperf are two workloads of seed 000's guest: give one")
        return memslots_l1.run_faults(args)
    if getattr(args, "lookup", False):
        return run_lookup(args)
    config = config_from_args(args)
    if args.host_kernel:
        result = memslots_l1.slot_ops(args, config)
    else:
        if args.host_kernel_param:
            raise BadInput("--host-kernel-param sets the host under test's KVM: give --host-kernel KERNEL with it")
        progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
        result = kvm_bench.run_bench(config, progress=progress)
    doc = kvm_results.summarize(result)
    if args.records:
        paths = kvm_results.write_records(result, args.records)
        doc["records"] = [str(p) for p in paths]
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=_json_default))
    else:
        print(render_text(doc))
    # Exit 1 when the kernel answered an invalid request with an unexpected
    # errno, or a guest pass miscounted: the measurement found a problem.
    return 0 if doc["probes_ok"] and vcpu_checks_ok(doc) else 1


def run_lookup(args: argparse.Namespace) -> int:
    # lazy: the memslot code (~85 ms) is only `memqual memslots`'s
    from memqual.host.memslots import kvm_lookup, kvm_lookup_results

    slots = parse_slots(args.slots) if args.slots != DEFAULT_SLOTS else kvm_lookup.QUICK_SLOTS
    if args.host_kernel:
        return memslots_l1.run(args, slots)
    if args.host_kernel_param:
        raise BadInput("--host-kernel-param sets the host under test's KVM: give --host-kernel KERNEL with it")
    if args.layout or args.miss_gfn or args.hit_gfn:
        raise BadInput("--layout, --miss-gfn and --hit-gfn run in the host under test: give --host-kernel KERNEL")
    check_kvm_device(args.device)
    config = kvm_lookup.LookupConfig(
        slots=slots, replicates=args.replicates, rounds=args.rounds, iterations=args.iterations, device=args.device
    )
    config.check()
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result = kvm_lookup.run_lookup(config, progress=progress)
    doc = kvm_lookup_results.summarize(result)
    if args.records:
        doc["records"] = [str(p) for p in kvm_lookup_results.write_records(result, args.records)]
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=_json_default))
        return 0
    lines = [
        f"/dev/kvm per-access cost beyond a register move, {doc['execution']}; "
        f"{config.replicates} fresh VMs a point, mean [95 % CI] of their medians, ns"
    ]
    for kind, points in doc["points"].items():
        for n, p in points.items():
            ci = p["ci95_ns"]
            span = f"[{ci[0]:.0f}, {ci[1]:.0f}]" if ci else "[-]"
            lines.append(
                f"{kind:9} {n:>6} slots: {p['mean_ns']:7.1f} {span}{'' if p['resolved'] else '  not resolved'}"
            )
    for kind, fit in doc["per_doubling"].items():
        ci = fit["ci95_ns"]
        span = f"[{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "[-]"
        over = " over the RAM hit" if fit["paired_with_ram_hit"] else ""
        lines.append(
            f"{kind:9} per doubling of the slot count{over}: {fit['mean_ns']:+.2f} ns {span}"
            f"{'' if fit['resolved'] else '  not resolved'}"
        )
    if doc.get("records"):
        lines.append(f"records: {len(doc['records'])} written")
    print("\n".join(lines))
    return 0


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON serialisable: {value!r}")


def vcpu_checks_ok(doc: dict[str, Any]) -> bool:
    for run in doc["runs"]:
        checks = run.get("vcpu_checks")
        if not checks:
            continue
        n = checks["accesses"]
        if any(c != n for c in checks["touched_ok"] + checks["mmio_exits"]):
            return False
        if any(m for m in checks["mmio_mismatches"]):
            return False
        if any(any(r != n for r in rep) for rep in checks["reported"]):
            return False
    return True


def _fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * scale:.{digits}g}"


def _cell(run: dict[str, Any], key: str, scale: float = 1.0) -> str:
    """A run's median of ``key`` with its [min-max] spread, or "-"."""
    if key not in run:
        return "-"
    lo, hi = run["spread"][key]
    return f"{_fmt(run[key], scale)} [{_fmt(lo, scale)}-{_fmt(hi, scale)}]"


def render_text(doc: dict[str, Any]) -> str:
    """The human table: one row per slot count (medians, [min-max])."""
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.table import Table

    table = Table(title=f"/dev/kvm memslots (KVM_CAP_NR_MEMSLOTS = {doc['nr_memslots']})")
    for col in (
        "slots",
        "setup us/slot",
        "move us/slot",
        "delete us/slot",
        "fault us",
        "slot switch us",
        "MMIO exit us",
        "tree nodes",
    ):
        table.add_column(col, justify="right")
    for run in doc["runs"]:
        table.add_row(
            str(run["slots"]),
            _cell(run, "setup_s_per_slot", 1e6),
            _cell(run, "move_s_per_slot", 1e6),
            _cell(run, "delete_s_per_slot", 1e6),
            _cell(run, "fault_us"),
            _cell(run, "slot_switch_us"),
            _cell(run, "mmio_exit_us"),
            str(run["model_nodes"]),
        )
    console = printable.console(width=170, record=True, file=io.StringIO())
    console.print(table)
    env = doc["environment"]
    where = env.get("host_under_test") or f"this machine ({env.get('host_kernel')}, {env.get('kvm_module')})"
    lines = [f"host: {where}; clock {env.get('clock') or 'wall'}", console.export_text().rstrip()]
    for probe in doc["probes"]:
        mark = "ok" if probe["ok"] else "UNEXPECTED"
        lines.append(
            f"{probe['name']}: {probe['description']} -> {probe['observed']} (expected {probe['expected']}, {mark})"
        )
    vcpu = doc["vcpu"]
    if vcpu["ran"]:
        lines.append(f"vCPU: {vcpu['mode']}; {vcpu['execution']}")
    else:
        lines.append(f"vCPU: did not run ({vcpu['error'] or 'disabled with --no-vcpu'})")
    lines.append(f"tree nodes: {doc['model']['nodes']} ({doc['model']['source']})")
    if doc.get("fit"):
        fit = doc["fit"]
        lines.append(
            "per tree level: " + ", ".join(f"{k} {v['us_per_node']:+.3g} us (r={v['r']:.2f})" for k, v in fit.items())
        )
    if doc.get("records"):
        lines.append(f"records: {len(doc['records'])} written")
    return "\n".join(lines)

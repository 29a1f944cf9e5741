"""``memqual memslots qemu``: apply a layout file to a real QEMU pc guest.

host/cli/memslots.py owns the ``memslots`` command and calls
:func:`add_arguments` and :func:`run` for its ``qemu`` subcommand.

Why it is built so: docs/architecture.md, "Module notes", host/cli/memslots_qemu.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memqual.host.cli import args as cliargs
from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import load_layout

# Share of a dimm's pages the probe must verify (docs/memslots-qemu.md).
MIN_COVERAGE = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--layout",
        required=True,
        metavar="FILE_OR_NAME",
        help="layout file; slots below the dimm region are QEMU's own memory (checked), "
        "slots inside it become pc-dimms",
    )
    # The guest's memory: QEMU's -m ...,slots=N,maxmem=M and how many dimms come later.
    for flag, kind, default, metavar, text in (
        ("--ram", cliargs.count, 512, "MIB", "base RAM, -m"),
        ("--maxmem", cliargs.count, 4096, "MIB", "maxmem"),
        ("--slots", int, 4, "N", "dimm slots, -m ...,slots=N"),
        ("--hotplug", cliargs.count_or_zero, 0, "N", "add the last N dimm slots by QMP after boot; 0 boots them all"),
    ):
        parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=f"{text} (default {default})")
    parser.add_argument("--machine", choices=("pc", "q35"), default="pc", help="QEMU machine type (default pc)")
    parser.add_argument("--plan", action="store_true", help="print the QEMU arguments and QMP commands only")
    parser.add_argument(
        "--probe", action="store_true", help="write and read back a pattern in every slot and replay the touched frames"
    )
    parser.add_argument(
        "--trace-out",
        type=cliargs.output_file,
        metavar="FILE",
        help="with --probe: save the trace (layout + frames) as JSON",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    # lazy: the memslot code (~85 ms) is only `memqual memslots`'s
    from memqual.host.memslots.qemu_layout import QemuMemory, plan_layout

    if args.trace_out and not args.probe:
        raise BadInput("--trace-out needs --probe: the trace is the frames the probe touched")
    layout = load_layout(args.layout)
    plan = plan_layout(layout, QemuMemory(args.ram, args.maxmem, args.slots, args.machine), hotplug=args.hotplug)
    if args.plan:
        return _print_plan(plan, args.json)
    return _apply(plan, args)


def _print_plan(plan: Any, as_json: bool) -> int:
    doc = plan.to_json()
    doc["qemu_args"] = list(plan.boot_args())
    doc["qmp"] = [{"execute": cmd, "arguments": arguments} for cmd, arguments in plan.hotplug_commands()]
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    start, size = plan.memory.device_memory()
    print(
        f"layout {plan.layout.name}: -m {plan.memory.ram_mib}M,slots={plan.memory.slots},"
        f"maxmem={plan.memory.maxmem_mib}M; dimm region {start:#x}-{start + size - 1:#x}"
    )
    for slot in plan.base:
        print(f"base   {slot.describe()}: QEMU's own memory, checked against its flat view")
    for dimm in plan.dimms:
        how = "QMP hotplug" if dimm.hotplug else "at boot"
        print(
            f"dimm   {dimm.slot.describe()}: pc-dimm {dimm.device_id} at {dimm.addr:#x}, {dimm.size >> 20} MiB, {how}"
        )
    if doc["qemu_args"]:
        print("qemu args: " + " ".join(doc["qemu_args"]))
    for command in doc["qmp"]:
        print("qmp: " + json.dumps(command))
    return 0


def _apply(plan: Any, args: argparse.Namespace) -> int:
    # lazy: the machine brings paramiko (~240 ms); only a boot needs it
    from memqual.host.core.machine import Machine
    from memqual.host.memslots import qemu_probe as P
    from memqual.host.memslots.qemu_layout import MIB, differential_check
    from memqual.host.memslots.trace import replay, save_trace

    doc: dict[str, Any] = {"plan": plan.to_json()}
    ok = True
    with Machine(plan.machine_config(warm=False)) as vm:
        agent = vm.deploy(P.AGENT)
        P.apply_hotplug(vm, plan, agent)
        observed = P.observe(vm, agent)
        diffs = differential_check(plan, observed, require_online=True)
        doc["differences"] = [str(d) for d in diffs]
        doc["qemu_layout"] = observed.qemu_layout().to_json()
        ok = not diffs
        if args.probe:
            mib = sum(d.size for d in plan.dimms) // MIB + 32
            probe = P.run_probe(vm, agent, plan, mib=mib)
            doc["probe"] = {
                "summary": probe.summary,
                "slots": [
                    {
                        "slot": r.slot,
                        "pages": r.npages,
                        "verified": r.verified,
                        "coverage": r.coverage,
                        "bad_words": r.bad_words,
                        "samples": len(r.samples),
                        "seen_by_qemu": r.host_verified,
                    }
                    for r in probe.ranges
                ],
            }
            for dimm in plan.dimms:
                r = probe.by_slot()[dimm.slot.id]
                if r.coverage < MIN_COVERAGE or r.bad_words or r.host_verified != len(r.samples) or not r.samples:
                    ok = False
            qemu_layout = observed.qemu_layout()
            doc["trace"] = replay(qemu_layout, probe.frames).table.to_json()
            if args.trace_out:
                save_trace(args.trace_out, qemu_layout, probe.frames, source=f"mem_probe on layout {plan.layout.name}")
    doc["agree"] = ok
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_result(doc)
    return 0 if ok else 1


def _print_result(doc: dict[str, Any]) -> None:
    out = sys.stdout
    slots = doc["qemu_layout"]["slots"]
    out.write(f"QEMU registered {len(slots)} memslots (flat view RAM/ROM ranges)\n")
    if doc["differences"]:
        out.write("the layout and the real system differ:\n")
        for line in doc["differences"]:
            out.write(f"  {line}\n")
    else:
        out.write(
            "differential check: the layout, QEMU's flat view and memory devices, and the guest's "
            "/proc/iomem and memory blocks agree\n"
        )
    if "probe" in doc:
        for s in doc["probe"]["slots"]:
            out.write(
                f"slot {s['slot']}: {s['verified']} of {s['pages']} pages written and read back "
                f"({s['coverage']:.1%}), {s['seen_by_qemu']}/{s['samples']} samples seen by QEMU\n"
            )
        table = doc["trace"]
        out.write(f"trace: {table['lookups']} frames replayed through the model\n")
        for name, stats in table["structures"].items():
            out.write(f"  {name:<14} mean {stats['mean_nodes']:.2f}  max {stats['max_nodes']} nodes\n")

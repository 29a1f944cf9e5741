"""``memqual memslots kvm --lookup --host-kernel KERNEL``: the per-access
lookup benchmark (host/memslots/l1_lookup.py) in the host under test.
memqual boots L1 with its smallest guest, stops that guest, runs
guest/kvm_lookup.c in L1 once per slot count (``--layout FILE|seed-000``:
once on that layout, host/memslots/l1_layout.py) and prints, per kind, L1's
nanoseconds per access (on icount, L1's instructions) and, on a kernel that
counts its memslot search (images/kvm-memslots/), the nodes per lookup
beside the model's.  Exit 1 when a count differs from the model.
docs/memslots-kvm.md, "The lookup benchmark in L1"."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Protocol

from memqual.host.cli import args as cliargs
from memqual.host.core import clock, nested

# The guest L1 must run (rc.host starts it): the smallest that boots, one
# vCPU, stopped before the benchmark starts.
GUEST_MIB = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The L1 options of ``memqual memslots kvm --lookup``."""
    parser.add_argument(
        "--boots",
        type=cliargs.count,
        default=1,
        metavar="B",
        help="with --host-kernel: fresh boots of L1, each one replicate of the records (default 1)",
    )
    parser.add_argument(
        "--miss",
        choices=("ioeventfd", "exit"),
        default="ioeventfd",
        help="with --host-kernel: a miss taken by an ioeventfd in L1's kernel, or exiting to the program",
    )
    parser.add_argument(
        "--layout",
        metavar="FILE|seed-000",
        help="with --host-kernel --lookup: register this layout's slots (a layout file, or seed-000: seed 000's "
        "guest's, read from its QEMU here the first time) and miss at --miss-gfn (seed-000: its rtl8139 BAR)",
    )
    parser.add_argument(
        "--faults",
        action="store_true",
        help="with --host-kernel: seed 000's guest (pc, 10 GiB, cirrus, rtl8139) touches fresh pages while L1 counts "
        "its memslot searches by kind (miss, RAM hit, other hit) and their nodes (host/memslots/l1_faults.py); "
        "--host-kernel-param kvm.mmio_caching=0 (and kvm_amd.npt=0) give 2011's conditions",
    )
    parser.add_argument(
        "--netperf",
        action="store_true",
        help="with --host-kernel: seed 000's guest, with a 2011 guest's xAPIC, runs TCP_RR over its rtl8139 "
        "(an echo in L1) while L1 counts its memslot searches by kind (host/memslots/l1_netperf.py)",
    )
    for flag, what in (("--miss-gfn", "the miss's gfn (in no slot)"), ("--hit-gfn", "the hit's gfn")):
        parser.add_argument(flag, metavar="GFN", help=f"with --layout: {what}, decimal or 0x hex")
    parser.add_argument(
        "--host-2011",
        choices=("vmx-ept", "svm", "none"),
        help="with --layout: register that 2011 host's private slots after the layout's (host/memslots/kvm2011.py; "
        "vmx-ept: ids 32-34, so the 2011 array walks 35 entries); default vmx-ept for seed-000, none for a file",
    )


def config(args: argparse.Namespace, slots: tuple[int, ...]) -> Any:
    from memqual.host.memslots.l1_lookup import L1LookupConfig

    made = L1LookupConfig(slots=slots, iterations=args.iterations, rounds=args.rounds, miss=args.miss)
    made.check()
    return made


def layout_config(args: argparse.Namespace) -> Any:
    """The --layout run, checked before any boot (BadInput: one line)."""
    from memqual.host.core.errors import BadInput
    from memqual.host.memslots import kvm2011, l1_layout, seed_layout
    from memqual.host.memslots.layout import load_layout, parse_gfn

    miss = parse_gfn(args.miss_gfn) if args.miss_gfn is not None else None
    default_host = "none"
    if args.layout == seed_layout.NAME:
        seed = seed_layout.load() if seed_layout.PATH.exists() else seed_layout.record()
        layout, miss = seed.layout, seed.miss_gfn if miss is None else miss
        # Seed 000's guest on seed 000's host: the judge's 2011 host.
        default_host = kvm2011.DEFAULT_HOST.name
    else:
        layout = load_layout(args.layout)
    if miss is None:
        raise BadInput(f"--layout {args.layout}: give --miss-gfn GFN, a gfn in none of its slots")
    host_2011 = args.host_2011 or default_host
    # Records name the layout as given when its private slots are its default.
    label = layout.name if host_2011 == default_host else f"{layout.name}+{host_2011}"
    if host_2011 != "none":
        if not kvm2011.runs_on_2011(layout):
            raise BadInput(f"--host-2011 {host_2011}: layout {layout.name} has ids a 2011 host refused (32 and up)")
        layout = kvm2011.on_host(layout, kvm2011.HOSTS[host_2011])
    hit = parse_gfn(args.hit_gfn) if args.hit_gfn is not None else l1_layout.default_hit(layout)
    made = l1_layout.LayoutLookup(
        layout,
        miss,
        hit_gfn=hit,
        iterations=args.iterations,
        rounds=args.rounds,
        miss=args.miss,
        host_2011=host_2011,
        label=label,
    )
    made.check()
    return made


def check_layout_options(args: argparse.Namespace) -> None:
    """What goes with --layout and what does not, before any boot."""
    from memqual.host.core.errors import BadInput

    if args.layout is None and (args.miss_gfn is not None or args.hit_gfn is not None):
        raise BadInput("--miss-gfn and --hit-gfn place a --layout's targets: give --layout FILE|seed-000 with them")
    if args.layout is None and args.host_2011 is not None:
        raise BadInput("--host-2011 adds a 2011 host's private slots to a --layout: give --layout FILE|seed-000")


def guest_namespace(args: argparse.Namespace, memory: int = GUEST_MIB, machine: str = "microvm") -> argparse.Namespace:
    """``boot``'s options for the one guest L1 runs."""
    return argparse.Namespace(
        clock=args.clock or clock.ICOUNT,
        accel="auto",
        cpus=1,
        memory=memory,
        machine=machine,
        warm=False,
        qemu=None,
    )


def run(args: argparse.Namespace, slots: tuple[int, ...]) -> int:
    # lazy: the machine brings paramiko (~240 ms); only a boot needs it
    from memqual.host.core.machine import Machine
    from memqual.images.build import KernelSource, build

    host = cliargs.one_host(args)
    assert host is not None
    check_layout_options(args)
    bench = config(args, slots) if args.layout is None else layout_config(args)
    machine_config, _qemu, note = cliargs.guest_on_clock(guest_namespace(args), host)
    if note:
        print(f"[{note}]", file=sys.stderr)
    image = build(KernelSource(None, None, None))
    boots, label, clock_label, release = [], "", "", ""
    for _ in range(args.boots):
        with Machine(machine_config, image=image, boot_timeout=90.0 * nested.BOOT_TIMEOUT_FACTOR, host=host) as vm:
            vm.qmp("stop")
            boots.append(measure(vm.host_ssh, bench))
            label, clock_label = vm.host_label, vm.clock.label
            release = vm.host_image.release if vm.host_image is not None else ""
    doc: dict[str, Any] = {"host": label, "clock": clock_label, "boots": [b.to_json() for b in boots]}
    if args.records:
        from memqual.host.core.probe import environment
        from memqual.host.core.record import write as write_record
        from memqual.host.memslots import l1_lookup_records

        env = environment().with_host(label, release).with_clock(clock_label, 1)
        layout = bench.label if args.layout is not None else l1_lookup_records.UNIFORM_LAYOUT
        made = l1_lookup_records.records(boots, env, layout)
        doc["records"] = [str(write_record(r, args.records)) for r in made]
        doc["claims"] = judged(args.records)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        show = render if args.layout is None else render_layout
        for index, result in enumerate(boots):
            if len(boots) > 1:
                print(f"boot {index + 1} of {len(boots)}:")
            print("\n".join(show(result, label, clock_label)))
        if doc.get("records"):
            print(f"records: {len(doc['records'])} written to {args.records}")
            for line in doc["claims"]:
                print(line)
    return 1 if any(b.findings() for b in boots) else 0


def slot_ops(args: argparse.Namespace, bench: Any) -> Any:
    """kvm_bench's slot operations (``bench``) in the host under test:
    guest/kvm_slots.c in L1 with its guest stopped, a boot at a time; the
    boots' fresh VMs pooled into one kvm_bench result, whose records carry
    the host and L1's clock (host/memslots/l1_slots.py)."""
    from memqual.host.core.machine import Machine
    from memqual.host.memslots import l1_slots
    from memqual.images.build import KernelSource, build

    host = cliargs.one_host(args)
    assert host is not None
    config = l1_slots.L1SlotsConfig(bench)
    config.check()
    machine_config, _qemu, note = cliargs.guest_on_clock(guest_namespace(args), host)
    if note:
        print(f"[{note}]", file=sys.stderr)
    image = build(KernelSource(None, None, None))
    results = []
    for _ in range(args.boots):
        with Machine(machine_config, image=image, boot_timeout=90.0 * nested.BOOT_TIMEOUT_FACTOR, host=host) as vm:
            # Nothing of the guest runs in L1 while its KVM is measured.
            vm.qmp("stop")
            results.append(l1_slots.run(vm.host_ssh, config, l1_environment(vm)))
    return l1_slots.pooled(results)


def l1_environment(vm: Any) -> Any:
    """What records of a measurement in ``vm``'s host under test carry:
    this machine's environment with L1's accelerator, host and clock."""
    from memqual.host.core.probe import environment

    release = vm.host_image.release if vm.host_image is not None else ""
    return (
        environment()
        .with_accel(vm.accel, vm.accel_reason)
        .with_host(vm.host_label, release)
        .with_clock(vm.clock.label, 1)
    )


def measure(shell: Any, bench: Any) -> Any:
    """One boot's run: per slot count (l1_lookup) or on a layout (l1_layout)."""
    from memqual.host.memslots import l1_layout, l1_lookup

    if isinstance(bench, l1_layout.LayoutLookup):
        return l1_layout.run(shell, bench)
    return l1_lookup.run(shell, bench)


class Workload(Protocol):
    """A window seed 000's guest runs under the host under test while L1
    counts its memslot searches (host/memslots/l1_faults.py, l1_netperf.py)."""

    @property
    def GUEST(self) -> Any: ...
    def measure(self, vm: Any, conditions: str) -> Any: ...
    def records(self, boots: Any, environment: Any) -> list[Any]: ...
    def to_json(self, boot: Any) -> dict[str, Any]: ...
    def render(self, boots: Any, host: str, clock_label: str) -> list[str]: ...


def run_faults(args: argparse.Namespace) -> int:
    """``--faults`` or ``--netperf``: seed 000's guest under the host under
    test, one boot a replicate; exit 1 when a slot's counted nodes per hit
    differ from the model's."""
    from memqual.host.core.errors import BadInput
    from memqual.host.memslots import l1_faults, l1_netperf

    workload: Workload = l1_netperf if args.netperf else l1_faults
    flag = "--netperf" if args.netperf else "--faults"
    if args.layout is not None or args.miss_gfn is not None or args.hit_gfn is not None:
        raise BadInput(f"{flag} runs seed 000's guest: give no --layout, --miss-gfn or --hit-gfn with it")
    return run_workload(args, workload)


def run_workload(args: argparse.Namespace, workload: Workload) -> int:
    from memqual.host.core.machine import Machine
    from memqual.host.memslots import l1_faults, l1_kinds
    from memqual.images.build import KernelSource, build

    host = cliargs.one_host(args)
    assert host is not None
    conditions = l1_faults.conditions_of(host.params)
    base = workload.GUEST.machine_config()
    machine_config, _qemu, note = cliargs.guest_on_clock(guest_namespace(args, base.memory_mib, base.machine), host)
    if note:
        print(f"[{note}]", file=sys.stderr)
    machine_config = dataclasses.replace(
        machine_config,
        extra_args=(*machine_config.extra_args, *base.extra_args),
        cmdline_extra=" ".join(p for p in (machine_config.cmdline_extra, base.cmdline_extra) if p),
    )
    image = build(KernelSource(None, None, None))
    boots, label, clock_label, env = [], "", "", None
    # A 10 GiB pc guest boots in L1 in 75-120 s here, twice a microvm's, and
    # missed the microvm's 360 s once beside two other L1s: twice that.
    boot_timeout = 180.0 * nested.BOOT_TIMEOUT_FACTOR
    for _ in range(args.boots):
        with Machine(machine_config, image=image, boot_timeout=boot_timeout, host=host) as vm:
            l1_kinds.require_counters(vm.host_ssh, host.name)
            boots.append(workload.measure(vm, conditions))
            label, clock_label, env = vm.host_label, vm.clock.label, l1_environment(vm)
    doc: dict[str, Any] = {"host": label, "clock": clock_label, "boots": [workload.to_json(b) for b in boots]}
    if args.records:
        from memqual.host.core.record import write as write_record

        doc["records"] = [str(write_record(r, args.records)) for r in workload.records(boots, env)]
        doc["claims"] = judged(args.records)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(workload.render(boots, label, clock_label)))
        if doc.get("records"):
            print(f"records: {len(doc['records'])} written to {args.records}")
            print("\n".join(doc["claims"]))
    return 1 if any(b.findings() for b in boots) else 0


# The claims a folder of these records can decide (claims/claims.json on_host).
CLAIMS = ("memslot-miss", "memslot-hit", "memslot-netperf", "memslot-priorities")


def judged(directory: Any) -> list[str]:
    """Each claim of CLAIMS whose host-under-test scenario has records in
    ``directory`` (the kernels run into one folder), judged on all of them:
    measured once both kernels' records are there, as registered before."""
    from memqual.host.core import record
    from memqual.host.judge.claims.evaluate import evaluate
    from memqual.host.judge.claims.load import load

    records = record.collect(directory)
    scenarios = {r.scenario for r in records}
    claims = [c for c in load() if c.id in CLAIMS and c.on_host is not None and c.on_host.measure.scenario in scenarios]
    return [
        f"claim {v.claim.id} ({v.evidence}) on the records in {directory}: {v.verdict}: {v.headline or v.reason}"
        for v in evaluate(claims, records)
    ]


def render(result: Any, host: str, clock_label: str) -> list[str]:
    """One line a slot count and kind: L1's ns per access over the null
    loop, the kernel's nodes per lookup and the model's."""
    first = result.runs[0] if result.runs else None
    search = first.search if first is not None else None
    lines = [
        f"host: {host}, clock {clock_label}; memslot search: {search or 'not counted (the kernel has no counters)'}",
        f"{'kind':9} {'slots':>6} {'L1 ns/access':>13} {'exits/access':>13} {'nodes/lookup':>13} {'model':>7} "
        f"{'miss walk':>10} {'model':>7}  check",
    ]
    for run in result.runs:
        checks = {c.kind: c for c in run.checks}
        for kind, fig in run.figures.items():
            check = checks.get(kind)
            measured = "-" if check is None or check.measured_nodes is None else f"{check.measured_nodes:.2f}"
            model = "-" if check is None or check.expected_nodes is None else f"{check.expected_nodes:.2f}"
            verdict = check.verdict if check is not None else "not counted"
            walk = "-" if check is None or check.measured_miss_nodes is None else f"{check.measured_miss_nodes:.2f}"
            walk_model = "-" if check is None or check.expected_miss_nodes is None else f"{check.expected_miss_nodes:g}"
            lines.append(
                f"{kind:9} {run.slots:>6} {fig.ns_per_access:>13.1f} {fig.exits_per_access:>13.3f} "
                f"{measured:>13} {model:>7} {walk:>10} {walk_model:>7}  {verdict}"
            )
    for finding in result.findings():
        lines.append(f"differs: {finding.kind} at {finding.slots} slots: {finding.note}")
    return lines


def render_layout(result: Any, host: str, clock_label: str) -> list[str]:
    """The --layout run's table: per kind its gfn, L1's ns per access, the
    kernel's nodes per lookup and the model's."""
    run, config = result.run, result.config
    lines = [
        f"host: {host}, clock {clock_label}; layout {config.label or config.layout.name or '-'} ({run.slots} slots, "
        f"2011 host's private slots: {config.host_2011}, the loop at gfn {config.code:#x}); "
        f"memslot search: {run.search or 'not counted (the kernel has no counters)'}",
        f"{'kind':5} {'gfn':>9} {'L1 ns/access':>13} {'exits/access':>13} {'nodes/lookup':>13} {'model':>7}  check",
    ]
    checks = {c.kind: c for c in run.checks}
    targets = config.targets()
    for kind, fig in run.figures.items():
        check = checks.get(kind)
        measured = "-" if check is None or check.measured_nodes is None else f"{check.measured_nodes:.2f}"
        model = "-" if check is None or check.expected_nodes is None else f"{check.expected_nodes:.2f}"
        verdict = check.verdict if check is not None else "not counted"
        lines.append(
            f"{kind:5} {targets[kind] // 4096:>#9x} {fig.ns_per_access:>13.1f} {fig.exits_per_access:>13.3f} "
            f"{measured:>13} {model:>7}  {verdict}"
        )
    lines += [f"  {kind}: {check.note}" for kind, check in checks.items()]
    return lines

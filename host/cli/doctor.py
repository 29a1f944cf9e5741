"""``memqual doctor``: what this host can do, and which accelerator memqual
will use."""

from __future__ import annotations

import argparse
import json

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command
from memqual.host.core import nested, printable
from memqual.host.core.probe import capabilities
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.qemu_binary import choose


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--reprobe", action="store_true", help="boot under KVM again instead of using the cached answer"
    )
    cliargs.add_qemu(parser)
    cliargs.add_host_kernel(parser, "; the doctor boots it (wall clock) with a guest and reports its KVM")


def _doctor(args: argparse.Namespace) -> int:
    if args.qemu:
        choose(cliargs.one_qemu(args.qemu))
    host = cliargs.one_host(args)
    result = capabilities(force=args.reprobe)
    found: dict[str, object] = result.to_json()
    if host is not None:
        found["host_under_test"] = host_report(host)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.table import Table

    table = Table(title="memqual doctor", show_header=False)
    for name, value in found.items():
        table.add_row(name, str(value))
    printable.console().print(table)
    return 0


# L1's KVM parameters the doctor shows: the ones that set 2011's conditions
# and the nesting itself.
SHOWN_PARAMS = (
    "kvm/parameters/mmio_caching",
    "kvm/parameters/tdp_mmu",
    "kvm_amd/parameters/npt",
    "kvm_amd/parameters/nested",
)


def host_report(host: nested.HostUnderTest) -> dict[str, object]:
    """Boot the host under test with a small guest on the wall clock: does
    its KVM run a Linux guest, with which parameters, how long to SSH."""
    from memqual.host.core.machine import Machine
    from memqual.images.build import build

    config = MachineConfig(memory_mib=256, cpus=1, warm=False, clock="wall")
    with Machine(config, image=build(), boot_timeout=90.0 * nested.BOOT_TIMEOUT_FACTOR, host=host) as vm:
        guest_log = vm.ssh.run(["dmesg"], timeout=60).stdout
        paths = [f"/sys/module/{p}" for p in SHOWN_PARAMS]
        shown = vm.host_ssh.run(["sh", "-c", 'for f; do echo "$f=$(cat "$f" 2>/dev/null)"; done', "sh", *paths])
        params = dict(
            line.removeprefix("/sys/module/").split("=", 1) for line in shown.stdout.split("\n") if "=" in line
        )
        return {
            "host": vm.host_label,
            "host_kernel": vm.host_image.release,
            "guest_under_its_kvm": "Hypervisor detected: KVM" in guest_log,
            "boot_to_guest_ssh_s": round(vm.boot_to_ssh_s, 1),
            "kvm_parameters": {k.replace("/parameters/", "."): v for k, v in params.items()},
        }


COMMAND = Command(
    "doctor",
    help="probe QEMU, KVM, KSM and THP on this host",
    configure=configure,
    run=_doctor,
)

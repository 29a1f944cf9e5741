"""``memqual boot``: build or reuse the image, boot, wait for SSH, run a
command in the guest, shut down."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command
from memqual.host.core import nested
from memqual.host.core.errors import BadInput
from memqual.images.balloon_driver import tree_variant_or_reason


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    parser.add_argument("--memory", type=cliargs.count, default=1024, metavar="MIB")
    parser.add_argument("--cpus", type=cliargs.count, default=2)
    parser.add_argument("--machine", choices=("microvm", "pc", "q35"), default="microvm")
    warm = parser.add_mutually_exclusive_group()
    warm.add_argument(
        "--warm",
        dest="warm",
        action="store_true",
        default=True,
        help="restore a saved snapshot when one exists (default)",
    )
    warm.add_argument("--cold", dest="warm", action="store_false", help="always boot the kernel")
    cliargs.add_guest_kernel(parser)
    cliargs.add_host_kernel(parser)
    cliargs.add_qemu(parser)
    cliargs.add_clock(parser, "default $MEMQUAL_CLOCK, else wall")
    parser.add_argument("--timeout", type=cliargs.positive, default=90.0, help="boot deadline in seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS... to run in the guest")


def _boot(args: argparse.Namespace) -> int:
    # lazy: the machine brings paramiko (~240 ms); only a boot needs it
    from memqual.host.core.machine import Machine
    from memqual.images.build import KernelSource, build

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    # Check what is cheap to check before an image build that may take minutes.
    host = cliargs.one_host(args)
    config, qemu, note = cliargs.guest_on_clock(args, host)
    if note:
        print(f"[{note}]", file=sys.stderr)
    if args.kernel_build and not args.kernel:
        raise BadInput("--kernel-build DIR goes with --kernel/--modules (the tree that kernel was built in)")
    source = KernelSource(
        Path(args.kernel) if args.kernel else None, Path(args.modules) if args.modules else None, args.debian_kernel
    )
    image = build(source)
    variant = tree_variant_or_reason(args.kernel_build, image.release) if args.kernel_build else {}
    timeout = args.timeout if host is None else args.timeout * nested.BOOT_TIMEOUT_FACTOR
    with Machine(config, image=image, boot_timeout=timeout, host=host) as vm:
        result = vm.ssh.run(cmd, timeout=600, check=False) if cmd else None
        exit_status = result.status if result else 0
        summary = {
            "accel": vm.accel,
            "accel_reason": vm.accel_reason,
            "clock": vm.clock.label,
            "vcpus": vm.config.cpus,
            "host": vm.host_label,
            "host_under_test": host.to_json() if host is not None else None,
            "host_kernel": vm.host_image.release if vm.host_image is not None else None,
            "warm": vm.started_warm,
            "boot_to_ssh_s": round(vm.boot_to_ssh_s, 3),
            "guest_kernel": image.release,
            "qemu": qemu.version,
            "qemu_origin": qemu.origin,
            **variant,
            "exit_status": exit_status,
            "stdout": result.stdout if result else "",
            "stderr": result.stderr if result else "",
        }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        if result:
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
        print(
            f"[host: {summary['host']}; {summary['accel']}, clock {summary['clock']}, {summary['vcpus']} vCPUs, "
            f"{'warm' if vm.started_warm else 'cold'} start, SSH after "
            f"{summary['boot_to_ssh_s']} s]",
            file=sys.stderr,
        )
        if variant:
            print(
                f"[balloon driver variant: {variant['balloon_variant'] or variant['balloon_variant_unavailable']}]",
                file=sys.stderr,
            )
    return exit_status


COMMAND = Command(
    "boot",
    help="boot a guest, run a command over SSH, shut down",
    configure=configure,
    run=_boot,
)

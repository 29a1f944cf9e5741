"""How well a clock repeats: ``python -m memqual.lab.clock_repeats --clock icount:4 --boots 3 [--json]``.

With ``--host-kernel`` the guests run under a host under test, and with
``--warm`` each restores one saved L1 with its guest booted.

Why it is built so: docs/lab.md, "clock_repeats".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time

from memqual.host.cli import args as cliargs
from memqual.host.core import clock, nested
from memqual.host.core.errors import GuestError, MemqualError
from memqual.host.core.machine import Machine
from memqual.host.core.nested import HostUnderTest
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.qemu_binary import choose_for_clock
from memqual.images.build import build


@dataclasses.dataclass(frozen=True)
class Boot:
    """One guest: its timed loops (guest seconds), how long it took to
    answer SSH, and whether it was restored from a snapshot."""

    seconds: list[float]
    boot_to_ssh_s: float
    warm: bool


def one_boot(
    config: MachineConfig, image: object, repeats: int, settle_s: int, keepalive: bool, host: HostUnderTest | None
) -> Boot:
    timeout = 300.0 * (nested.BOOT_TIMEOUT_FACTOR if host is not None else 1)
    with Machine(config, image=image, boot_timeout=timeout, host=host) as vm:
        agent = vm.deploy("ksm_stress")
        if keepalive:
            vm.ssh.set_keepalive(5)
        if settle_s:
            vm.ssh.run(["sh", "-c", f"sync; sleep {settle_s}"], timeout=120 + settle_s)
        seconds = []
        for _ in range(repeats):
            out = vm.ssh.run([agent, "--mib", "64", "--phases", "fill", "--timeout", "300"], timeout=600).stdout
            match = re.search(r"event=fill_done \S+ \S+ duration_s=([0-9.]+)", out)
            if match is None:
                raise GuestError(f"ksm_stress printed no fill_done: {out[-200:]}")
            seconds.append(float(match.group(1)))
        return Boot(seconds, round(vm.boot_to_ssh_s, 2), vm.started_warm)


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.lab.clock_repeats", description=__doc__.splitlines()[0])
    cliargs.add_clock(parser, "default icount:4")
    parser.add_argument("--boots", type=cliargs.count, default=3, help="fresh guests (default 3)")
    parser.add_argument("--repeats", type=cliargs.count, default=1, help="timed loops a guest (default 1)")
    parser.add_argument("--settle", type=cliargs.count_or_zero, default=20, help="guest seconds of quiet first")
    parser.add_argument("--keepalive", action="store_true", help="SSH keepalives on (every 5 s)")
    parser.add_argument("--cpus", type=cliargs.count, default=1, help="the guest's vCPUs (default 1)")
    parser.add_argument("--warm", action="store_true", help="restore a saved snapshot (one untimed boot saves it)")
    cliargs.add_host_kernel(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        host = cliargs.one_host(args)
        the_clock = clock.parse(args.clock or f"icount:{clock.DEFAULT_SHIFT}")
        cpus = args.cpus
        if host is not None:
            the_clock, cpus = nested.host_clock(the_clock), nested.host_vcpus(args.cpus, nested.host_clock(the_clock))
        qemu, _ = choose_for_clock(None, the_clock, cpus)
        config = MachineConfig(memory_mib=512, cpus=cpus, warm=args.warm, clock=the_clock.label)
        image = build()
        load = os.getloadavg()[0]
        started = time.monotonic()
        if args.warm:
            one_boot(config, image, 1, 0, False, host)  # untimed: makes sure the snapshot exists
        runs = [one_boot(config, image, args.repeats, args.settle, args.keepalive, host) for _ in range(args.boots)]
    except MemqualError as exc:
        print(f"memqual: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_status
    boots = [run.seconds for run in runs]
    firsts = [b[0] for b in boots]
    spread = (max(firsts) - min(firsts)) / min(firsts)
    # The least run of each boot: a host-timed packet landing in one run
    # costs it a few ms of guest time once.
    least = [min(b) for b in boots]
    least_spread = (max(least) - min(least)) / min(least)
    result = {
        "clock": the_clock.label,
        "qemu": qemu.version,
        "host": host.name if host is not None else nested.THIS_MACHINE,
        "cpus": cpus,
        "settle_s": args.settle,
        "keepalive": args.keepalive,
        "seconds": boots,
        "boot_to_ssh_s": [run.boot_to_ssh_s for run in runs],
        "warm": [run.warm for run in runs],
        "first_repeat_spread": spread,
        "least_repeat_spread": least_spread,
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"clock {the_clock.label}, QEMU {qemu.version}, host {result['host']}, {cpus} vCPU, settle {args.settle} s, "
        f"keepalive {'on' if args.keepalive else 'off'}, load {result['loadavg_1m'][0]} -> {result['loadavg_1m'][1]}"
    )
    for index, run in enumerate(runs):
        how = f"{'warm' if run.warm else 'cold'}, SSH after {run.boot_to_ssh_s:.2f} s"
        print(f"  boot {index + 1} ({how}): " + ", ".join(f"{s:.6f}" for s in run.seconds) + " s")
    print(f"  first repeat across boots: spread {100 * spread:.4f} %")
    print(f"  least repeat of each boot, across boots: spread {100 * least_spread:.4f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())

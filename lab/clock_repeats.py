"""How well a clock repeats: ``python -m memqual.lab.clock_repeats --clock icount:4 --boots 3 [--json]``.

Why it is built so: docs/lab.md, "clock_repeats".
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from memqual.host.cli import args as cliargs
from memqual.host.core import clock
from memqual.host.core.errors import GuestError, MemqualError
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.qemu_binary import choose_for_clock
from memqual.images.build import build


def one_boot(config: MachineConfig, image: object, repeats: int, settle_s: int, keepalive: bool) -> list[float]:
    with Machine(config, image=image, boot_timeout=300) as vm:
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
        return seconds


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.lab.clock_repeats", description=__doc__.splitlines()[0])
    cliargs.add_clock(parser, "default icount:4")
    parser.add_argument("--boots", type=cliargs.count, default=3, help="fresh guests (default 3)")
    parser.add_argument("--repeats", type=cliargs.count, default=1, help="timed loops a guest (default 1)")
    parser.add_argument("--settle", type=cliargs.count_or_zero, default=20, help="guest seconds of quiet first")
    parser.add_argument("--keepalive", action="store_true", help="SSH keepalives on (every 5 s)")
    parser.add_argument("--cpus", type=cliargs.count, default=1, help="the guest's vCPUs (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        the_clock = clock.parse(args.clock or f"icount:{clock.DEFAULT_SHIFT}")
        qemu, _ = choose_for_clock(None, the_clock, args.cpus)
        config = MachineConfig(memory_mib=512, cpus=args.cpus, warm=False, clock=the_clock.label)
        image = build()
        load = os.getloadavg()[0]
        started = time.monotonic()
        boots = [one_boot(config, image, args.repeats, args.settle, args.keepalive) for _ in range(args.boots)]
    except MemqualError as exc:
        print(f"memqual: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_status
    firsts = [b[0] for b in boots]
    spread = (max(firsts) - min(firsts)) / min(firsts)
    # The least run of each boot: a host-timed packet landing in one run
    # costs it a few ms of guest time once.
    least = [min(b) for b in boots]
    least_spread = (max(least) - min(least)) / min(least)
    result = {
        "clock": the_clock.label,
        "qemu": qemu.version,
        "cpus": args.cpus,
        "settle_s": args.settle,
        "keepalive": args.keepalive,
        "seconds": boots,
        "first_repeat_spread": spread,
        "least_repeat_spread": least_spread,
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"clock {the_clock.label}, QEMU {qemu.version}, {args.cpus} vCPU, settle {args.settle} s, keepalive "
        f"{'on' if args.keepalive else 'off'}, load {result['loadavg_1m'][0]} -> {result['loadavg_1m'][1]}"
    )
    for index, seconds in enumerate(boots):
        print(f"  boot {index + 1}: " + ", ".join(f"{s:.6f}" for s in seconds) + " s")
    print(f"  first repeat across boots: spread {100 * spread:.4f} %")
    print(f"  least repeat of each boot, across boots: spread {100 * least_spread:.4f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())

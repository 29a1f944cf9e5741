"""Boot benchmark: ``python -m memqual.lab.bench_boot --boots 5 [--warm|--cold] [--json]``.

The same guest booted N times in a row (nothing else in between), each
boot's time to SSH and to a first real command, summarised (median,
minimum, maximum, range and interquartile range) with the environment and
the host's load.  docs/lab.md, "bench_boot".
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

from memqual.host.cli import args as cliargs
from memqual.host.core import clock, descriptive, probe
from memqual.host.core.errors import MemqualError
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MACHINE_TYPES, MachineConfig
from memqual.images import build as images_build

FIRST_COMMAND = ["uname", "-r"]


@dataclasses.dataclass(frozen=True)
class Boot:
    boot_to_ssh_s: float
    launch_to_first_command_s: float
    warm: bool


def one_boot(config: MachineConfig, image: Any, timeout: float) -> Boot:
    started = time.monotonic()
    with Machine(config, image=image, boot_timeout=timeout) as vm:
        vm.ssh.run(FIRST_COMMAND, timeout=60)
        first_command = time.monotonic() - started
        return Boot(vm.boot_to_ssh_s, first_command, vm.started_warm)


def summary(samples: list[float]) -> dict[str, float]:
    s = descriptive.summarize(samples)
    return {
        "median": round(s.median, 3),
        "min": round(s.minimum, 3),
        "max": round(s.maximum, 3),
        "range": round(s.maximum - s.minimum, 3),
        "iqr": round(s.iqr, 3),
    }


def run(boots: int, config: MachineConfig, timeout: float, progress: bool) -> dict[str, Any]:
    image = images_build.build()
    load_before = os.getloadavg()[0]
    the_clock = clock.parse(config.clock) if config.clock else clock.current()
    accel, reason = clock.resolve_accel(the_clock, config.accel) or probe.resolve_accel(config.accel)
    # Machine would resolve 'auto' again per launch (a cached answer, but it
    # looks the image up): give it the answer.
    config = dataclasses.replace(config, accel=accel, clock=the_clock.label)
    if config.warm:
        one_boot(config, image, timeout)  # untimed: makes sure the snapshot exists
    results: list[Boot] = []
    for index in range(boots):
        result = one_boot(config, image, timeout)
        results.append(result)
        if progress:
            print(
                f"boot {index + 1}/{boots}: SSH after {result.boot_to_ssh_s:.2f} s, first command after "
                f"{result.launch_to_first_command_s:.2f} s ({'warm' if result.warm else 'cold'})",
                file=sys.stderr,
            )
    environment = (
        probe.environment().with_accel(accel, reason).with_clock(the_clock.label, config.cpus).with_guest(image)
    )
    return {
        "boots": boots,
        "mode": "warm" if config.warm else "cold",
        "warm_starts": sum(r.warm for r in results),
        "machine": config.machine,
        "memory_mib": config.memory_mib,
        "cpus": config.cpus,
        # memqual.host.core.environment's keys: accel, accel_reason, guest_kernel, qemu, host_kernel...
        **environment.to_json(),
        # On a shared 2-core machine other work slows TCG down: say how busy it was.
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "boot_to_ssh_s": summary([r.boot_to_ssh_s for r in results]),
        "launch_to_first_command_s": summary([r.launch_to_first_command_s for r in results]),
        "samples": [dataclasses.asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.lab.bench_boot", description=__doc__.splitlines()[0])
    parser.add_argument("--boots", type=cliargs.count, default=5, help="timed boots (default 5)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--warm", dest="warm", action="store_true", help="restore a saved snapshot")
    mode.add_argument("--cold", dest="warm", action="store_false", help="boot the kernel every time (default)")
    parser.set_defaults(warm=False)
    parser.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    parser.add_argument("--machine", choices=MACHINE_TYPES, default="microvm")
    parser.add_argument("--memory", type=cliargs.count, default=1024, metavar="MIB")
    parser.add_argument("--cpus", type=cliargs.count, default=2)
    parser.add_argument("--timeout", type=cliargs.positive, default=90.0, help="boot deadline per boot, seconds")
    cliargs.add_qemu(parser)
    cliargs.add_clock(parser, "default $MEMQUAL_CLOCK, else wall")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        if args.boots < 1:
            raise MemqualError("give --boots 1 or more")
        config, _, note = cliargs.guest_on_clock(args)
        if note and not args.json:
            print(note, file=sys.stderr)
        result = run(args.boots, config, args.timeout, progress=not args.json)
    except MemqualError as exc:
        print(f"memqual: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_status
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{result['boots']} {result['mode']} boots, {result['accel']}, clock {result['clock']}, {result['machine']}, "
        f"{result['memory_mib']} MiB, {result['cpus']} CPUs, guest {result['guest_kernel']}, QEMU {result['qemu']}, "
        f"load average {result['loadavg_1m'][0]} -> {result['loadavg_1m'][1]}"
    )
    for key, label in (("boot_to_ssh_s", "boot to SSH"), ("launch_to_first_command_s", "launch to first command")):
        s = result[key]
        print(
            f"  {label:<24} median {s['median']:.2f} s  min {s['min']:.2f}  max {s['max']:.2f}  "
            f"range {s['range']:.2f}  IQR {s['iqr']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

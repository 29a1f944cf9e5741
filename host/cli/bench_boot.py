"""Boot benchmark: ``python -m memqual.host.cli.bench_boot --boots 5 [--warm|--cold] [--json]``.

Boots the same guest N times in a row (nothing else in between) and
reports, for each of two figures, the median, minimum, maximum, range
(max - min) and interquartile range:

Why it is built so: docs/architecture.md, "Module notes", host/cli/bench_boot.py.
"""

from __future__ import annotations

import json
import sys

from memqual.host.cli import args as cliargs
from memqual.host.core.errors import MemqualError
from memqual.host.core.qemu import MACHINE_TYPES
from memqual.host.run import bench_boot


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.host.cli.bench_boot", description=__doc__.splitlines()[0])
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
        result = bench_boot.run(args.boots, config, args.timeout, progress=not args.json)
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

"""Boot faults counted: ``python -m memqual.host.cli.count_panics --mode
6.12.111+deb12-amd64:tcg-multi --mode 6.12.111+deb12-amd64:tcg-single ...
--boots 200 --minutes 60 --out boots.jsonl``.

Why it is built so: docs/architecture.md, "Module notes", host/cli/count_panics.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.core import clock as clocks
from memqual.host.core.errors import BadInput, MemqualError
from memqual.host.run import boot_panics
from memqual.host.run.boot_panics import Mode


def parse_mode(text: str) -> Mode:
    kernel, _, how = text.rpartition(":")
    if how.isdigit():  # icount:SHIFT
        kernel, _, rest = kernel.rpartition(":")
        how = f"{rest}:{how}"
    if not kernel:
        raise argparse.ArgumentTypeError(
            f"--mode {text!r}: give KERNEL:tcg-multi, KERNEL:tcg-single or KERNEL:icount[:N]"
        )
    if how == "tcg-multi":
        return Mode(kernel)
    if how == "tcg-single":
        return Mode(kernel, tcg_thread="single")
    try:
        return Mode(kernel, clock=clocks.parse(how).label)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(f"--mode {text!r}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.host.cli.count_panics", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", type=parse_mode, action="append", default=[], help="KERNEL:HOW, repeatable")
    parser.add_argument("--boots", type=cliargs.count, default=200, help="boots a mode at most (default 200)")
    parser.add_argument("--minutes", type=cliargs.positive, default=60.0, help="stop starting boots after this")
    parser.add_argument("--timeout", type=cliargs.positive, default=180.0, help="boot deadline, seconds")
    parser.add_argument("--out", type=Path, help="append each boot to this JSON-lines file")
    parser.add_argument("--summary", type=Path, help="only summarise this earlier count")
    args = parser.parse_args(argv)

    try:
        if args.summary:
            boots = boot_panics.load(args.summary)
        else:
            if not args.mode or not args.out:
                raise BadInput("give at least one --mode KERNEL:HOW and --out FILE")
            write = boot_panics.appender(args.out)

            def record(boot: boot_panics.Boot) -> None:
                write(boot)
                print(f"{boot.mode:<40} #{boot.index:<4} {boot.outcome:<6} {boot.seconds:6.1f} s {boot.signature}")

            boots = boot_panics.count(args.mode, args.boots, args.minutes * 60, args.timeout, record)
    except MemqualError as exc:
        print(f"memqual: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_status
    table = boot_panics.rates(boots)
    print(f"{'mode':<40} {'boots':>5} {'faults':>6} {'rate':>7}  95 % interval      hangs errors")
    for r in table:
        print(
            f"{r.mode:<40} {r.boots:>5} {r.faults:>6} {r.rate:>7.2%}  [{r.low:.2%}, {r.high:.2%}]"
            f"  {r.hangs:>5} {r.errors:>6}"
        )
        for sig in r.signatures:
            print(f"    {sig}")
    for multi in (r for r in table if "tcg-multi" in r.mode):
        kernel = multi.mode.split()[0]
        for other in (r for r in table if r.mode.startswith(kernel + " ") and r is not multi):
            p = boot_panics.fisher_greater(multi, other)
            print(f"{multi.mode} > {other.mode}: one-sided Fisher p = {p:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Boot faults counted: ``python -m memqual.lab.count_panics --mode
6.12.111+deb12-amd64:tcg-multi --mode 6.12.111+deb12-amd64:tcg-single ...
--boots 200 --minutes 60 --out boots.jsonl``.

Fresh cold boots of one guest kernel in several QEMU modes, taken in turn
(one boot of each mode a round, so the host's load falls on every mode
alike), each boot's outcome read from its console; then each mode's fault
rate with its exact interval.  docs/lab.md, "count_panics".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.core import clock as clocks
from memqual.host.core import settings
from memqual.host.core.errors import BadInput, MemqualError, Timeout
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.qemu_binary import choose, choose_for_clock
from memqual.host.judge.stats import binomial
from memqual.images.build import KernelSource, build

# What a kernel prints when it faults: an oops, a BUG or a panic.  The
# first such line names the fault; the RIP line after it says where.
FAULT = re.compile(r"(Kernel panic - not syncing|Oops[:\s]|BUG: |general protection fault|kernel BUG at)")
WHERE = re.compile(r"RIP: [0-9a-f]{4}:(\S+)")
OUTCOMES = ("ok", "fault", "hang", "error")


@dataclasses.dataclass(frozen=True)
class Mode:
    """One way to boot: a Debian guest kernel, a clock (wall or
    icount:SHIFT) and, on the wall clock, TCG's threading."""

    kernel: str
    clock: str = clocks.WALL
    tcg_thread: str = ""  # "" = QEMU's default (multi-threaded), or "single"
    cpus: int = 2

    @property
    def name(self) -> str:
        if clocks.parse(self.clock).icount:
            how = self.clock
        else:
            how = "tcg-single" if self.tcg_thread == "single" else "tcg-multi"
        return f"{self.kernel} {how} {self.cpus}cpu"


@dataclasses.dataclass(frozen=True)
class Boot:
    mode: str
    index: int
    outcome: str  # one of OUTCOMES
    seconds: float
    signature: str  # the fault's first line and where ("" when none)
    qemu: str


@dataclasses.dataclass(frozen=True)
class Rate:
    """A mode's faults over its boots, with the exact 95 % interval."""

    mode: str
    boots: int
    faults: int
    hangs: int
    errors: int
    low: float
    high: float
    signatures: tuple[str, ...]

    @property
    def rate(self) -> float:
        return self.faults / self.boots if self.boots else math.nan


def fisher_greater(a: Rate, b: Rate) -> float:
    """One-sided Fisher exact p that ``a``'s fault rate exceeds ``b``'s."""
    return binomial.fisher_greater(a.faults, a.boots, b.faults, b.boots)


def classify(console: str, error: BaseException | None) -> tuple[str, str]:
    """A boot's outcome and its fault's signature, from the console it
    left and the error its launch raised (None: it reached SSH)."""
    lines = console.splitlines()
    for number, line in enumerate(lines):
        if FAULT.search(line):
            where = next((m.group(1) for m in map(WHERE.search, lines[number : number + 40]) if m), "")
            text = line.split("] ", 1)[-1].strip()[:120]
            return "fault", f"{text} at {where}" if where else text
    if error is None:
        return "ok", ""
    if isinstance(error, Timeout):
        # what the vCPUs were doing, when the machine could read it, says
        # more about a hang than the wait that ran out
        text = str(error).splitlines()[0]
        _, vcpus, read = text.partition("; its vCPUs: ")
        return "hang", (f"vCPUs: {read}" if vcpus else text)[:200]
    return "error", str(error).splitlines()[0][:160]


def rates(boots: Iterable[Boot]) -> list[Rate]:
    by_mode: dict[str, list[Boot]] = {}
    for boot in boots:
        by_mode.setdefault(boot.mode, []).append(boot)
    out = []
    for mode, group in by_mode.items():
        faults = sum(b.outcome == "fault" for b in group)
        low, high = binomial.clopper_pearson(faults, len(group))
        out.append(
            Rate(
                mode,
                len(group),
                faults,
                sum(b.outcome == "hang" for b in group),
                sum(b.outcome == "error" for b in group),
                low,
                high,
                tuple(sorted({b.signature for b in group if b.outcome == "fault"})),
            )
        )
    return out


def boot_once(mode: Mode, index: int, timeout: float) -> Boot:
    """One cold boot of ``mode`` to a working SSH command, its console kept
    in a private folder until it is read, then removed."""
    the_clock = clocks.parse(mode.clock)
    settings.put(settings.QEMU, None)  # each mode picks its own QEMU afresh
    if the_clock.icount:
        qemu, _ = choose_for_clock(None, the_clock, mode.cpus)
    else:
        qemu = choose(None)
    image = build(KernelSource(debian=mode.kernel))
    config = MachineConfig(
        memory_mib=1024,
        cpus=mode.cpus,
        machine="microvm",
        accel="tcg",
        warm=False,
        clock=mode.clock,
        tcg_thread=mode.tcg_thread,
    )
    with tempfile.TemporaryDirectory(prefix="mqpanic-") as logs:
        started = time.monotonic()
        error: BaseException | None = None
        try:
            with Machine(config, image=image, log_dir=Path(logs), boot_timeout=timeout):
                pass
        except MemqualError as exc:
            error = exc
        seconds = time.monotonic() - started
        console = "".join(p.read_text(errors="replace") for p in Path(logs).glob("console-*.log"))
    outcome, signature = classify(console, error)
    return Boot(mode.name, index, outcome, round(seconds, 2), signature, qemu.version)


def count(
    modes: Sequence[Mode],
    boots_per_mode: int,
    deadline_s: float,
    timeout: float,
    record: Callable[[Boot], None],
    one: Callable[[Mode, int, float], Boot] = boot_once,
    now: Callable[[], float] = time.monotonic,
) -> list[Boot]:
    """Round-robin boots of every mode until each has ``boots_per_mode`` or
    the deadline (seconds from now) has passed; ``record`` sees each boot
    as it ends (the caller appends it to a file: a killed count keeps what
    it had)."""
    end = now() + deadline_s
    done: list[Boot] = []
    for index in range(boots_per_mode):
        for mode in modes:
            if now() >= end:
                return done
            boot = one(mode, index, timeout)
            record(boot)
            done.append(boot)
    return done


def load(path: Path) -> list[Boot]:
    """Boots a count appended to ``path``, one JSON object a line."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(Boot(**json.loads(line)))
    return out


def appender(path: Path) -> Callable[[Boot], None]:
    def write(boot: Boot) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "a") as out:
            out.write(json.dumps(dataclasses.asdict(boot)) + "\n")

    return write


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
    parser = cliargs.Parser(prog="python -m memqual.lab.count_panics", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", type=parse_mode, action="append", default=[], help="KERNEL:HOW, repeatable")
    parser.add_argument("--boots", type=cliargs.count, default=200, help="boots a mode at most (default 200)")
    parser.add_argument("--minutes", type=cliargs.positive, default=60.0, help="stop starting boots after this")
    parser.add_argument("--timeout", type=cliargs.positive, default=180.0, help="boot deadline, seconds")
    parser.add_argument("--out", type=Path, help="append each boot to this JSON-lines file")
    parser.add_argument("--summary", type=Path, help="only summarise this earlier count")
    args = parser.parse_args(argv)

    try:
        if args.summary:
            boots = load(args.summary)
        else:
            if not args.mode or not args.out:
                raise BadInput("give at least one --mode KERNEL:HOW and --out FILE")
            write = appender(args.out)

            def record(boot: Boot) -> None:
                write(boot)
                print(f"{boot.mode:<40} #{boot.index:<4} {boot.outcome:<6} {boot.seconds:6.1f} s {boot.signature}")

            boots = count(args.mode, args.boots, args.minutes * 60, args.timeout, record)
    except MemqualError as exc:
        print(f"memqual: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_status
    table = rates(boots)
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
            p = fisher_greater(multi, other)
            print(f"{multi.mode} > {other.mode}: one-sided Fisher p = {p:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

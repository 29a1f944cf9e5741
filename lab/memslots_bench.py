"""How fast the memslot model answers: ``python -m memqual.lab.memslots_bench
[--layout seed-32] [--workload miss ...] [--repeats 31] [--batch 1000] [--json]``.

Time per lookup for each structure: each repeat times one batch of lookups
per structure, the structures taking turns in an order that rotates and
flips every repeat; the median and the spread over the repeats, in
microseconds, the Python call included (``call``, an empty function called
the same way, is the floor under every figure).  docs/lab.md, "memslots_bench".
"""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from memqual.host.cli import args as cliargs
from memqual.host.core import printable
from memqual.host.core.errors import MemqualError
from memqual.host.memslots.layout import load_layout
from memqual.host.memslots.structures import STRUCTURES, build
from memqual.host.memslots.workloads import generate


@dataclasses.dataclass(frozen=True)
class BenchResult:
    structure: str
    workload: str
    samples_us: list[float]  # time per lookup, one sample per repeat

    def summary(self) -> dict[str, Any]:
        s = sorted(self.samples_us)
        q1, median, q3 = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else (s[0], s[0], s[0])
        return {
            "structure": self.structure,
            "workload": self.workload,
            "median_us": median,
            "q1_us": q1,
            "q3_us": q3,
            "min_us": s[0],
            "max_us": s[-1],
            "repeats": len(s),
        }


def _empty(gfn: int) -> tuple[None, int]:
    return None, 0


def _time_batch(lookup: Callable[[int], Any], gfns: list[int]) -> float:
    """Microseconds per lookup over one pass of ``gfns``."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for gfn in gfns:
            lookup(gfn)
        elapsed = time.perf_counter_ns() - start
    finally:
        if gc_was_on:
            gc.enable()
    return elapsed / len(gfns) / 1000.0


def run_bench(layout_name: str, workloads: list[str], repeats: int, batch: int, seed: int = 0) -> list[BenchResult]:
    layout = load_layout(layout_name)
    names = ["call", *STRUCTURES]
    results: list[BenchResult] = []
    for workload in workloads:
        gfns = generate(layout, workload, batch, seed)
        lookups: dict[str, Callable[[int], Any]] = {"call": _empty}
        for name in STRUCTURES:
            lookups[name] = build(name, layout).lookup
        samples: dict[str, list[float]] = {name: [] for name in names}
        for name in names:  # warm-up pass, not recorded
            _time_batch(lookups[name], gfns)
        for r in range(repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            if r % 2:
                order.reverse()
            for name in order:
                samples[name].append(_time_batch(lookups[name], gfns))
        results.extend(BenchResult(name, workload, samples[name]) for name in names)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.lab.memslots_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="seed-32", help="layout file or shipped name (default seed-32)")
    parser.add_argument("--workload", action="append", help="workload (repeatable; default miss and ram-hits)")
    parser.add_argument("--repeats", type=cliargs.count, default=31, help="timed batches per structure (default 31)")
    parser.add_argument("--batch", type=cliargs.count, default=1000, help="lookups per batch (default 1000)")
    parser.add_argument("--seed", type=cliargs.seed, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.repeats < 2 or args.batch < 1:
        print("bench: error: give --repeats 2 or more and --batch 1 or more", file=sys.stderr)
        return 2
    try:
        results = run_bench(args.layout, args.workload or ["miss", "ram-hits"], args.repeats, args.batch, args.seed)
    except MemqualError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return exc.exit_status
    rows = [r.summary() for r in results]
    if args.json:
        print(json.dumps({"layout": args.layout, "batch": args.batch, "results": rows}, indent=2))
        return 0
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.table import Table

    table = Table(
        title=f"lookup time, layout {args.layout}, {args.batch} lookups x {args.repeats} repeats", title_justify="left"
    )
    for column in ("workload", "structure", "median µs", "quartiles µs", "min-max µs"):
        table.add_column(column, justify="left" if column in ("workload", "structure") else "right")
    for row in rows:
        table.add_row(
            row["workload"],
            row["structure"],
            f"{row['median_us']:.2f}",
            f"{row['q1_us']:.2f}-{row['q3_us']:.2f}",
            f"{row['min_us']:.2f}-{row['max_us']:.2f}",
        )
    printable.console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m memqual.host.cli.memslots_bench [--layout seed-32] [--workload
miss ...] [--repeats 31] [--batch 1000] [--json]``: how fast the memslot
model answers (memqual.host.memslots.bench measures it).
"""

from __future__ import annotations

import json
import sys

from memqual.host.cli import args as cliargs
from memqual.host.core import printable
from memqual.host.core.errors import MemqualError
from memqual.host.memslots import bench


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.host.cli.memslots_bench", description=__doc__.splitlines()[0])
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
        results = bench.run_bench(
            args.layout, args.workload or ["miss", "ram-hits"], args.repeats, args.batch, args.seed
        )
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

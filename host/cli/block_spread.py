"""Block spread of an A/B run: ``python -m memqual.host.cli.block_spread OUTPUT [--json]``.

OUTPUT is a ``memqual run`` folder with two arms (OUTPUT/A/results.json and
OUTPUT/B/results.json).  Prints, for every metric both arms recorded in
blocks, the sd of the blocks' log(B/A) (memqual.host.judge.block_spread):
on an A/A run, the instrument's block-to-block noise that
host/judge/primaries.py keeps per primary and clock.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.core.errors import MemqualError


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.host.cli.block_spread", description=__doc__.splitlines()[0])
    parser.add_argument("output", metavar="OUTPUT", help="a memqual run folder with A/ and B/")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        from memqual.host.judge.block_spread import block_spreads, table
        from memqual.host.judge.results import load_results

        folder = Path(args.output)
        a, b = load_results(folder / "A" / "results.json"), load_results(folder / "B" / "results.json")
        spreads = block_spreads(a, b)
    except MemqualError as exc:
        print(f"memqual: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_status
    if args.json:
        json.dump([s.to_json() for s in spreads], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        clock = spreads[0].clock if spreads else "?"
        print(f"{folder}: clock {clock}, {len(spreads)} metrics in blocks")
        print("\n".join(table(spreads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

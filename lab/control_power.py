"""The negative controls' power: ``python -m memqual.lab.control_power
[--trials N] [A/results.json B/results.json]``.

Why it is built so: docs/lab.md, "control_power".
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.core.errors import BadInput
from memqual.host.judge import comparison, control_power

SPREADS = (0.01, 0.02, 0.05)
LEVELS = (0.01, 0.0032, 0.001)
GRID_BLOCKS: tuple[int, ...] = (2, 3, 4, 5, 6, 8)
FILE_BLOCKS: tuple[int, ...] = (2, 4, 6, 8, 12, 16, 24)
CONTROLS = 26


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.lab.control_power", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=cliargs.count, default=200, help="simulated runs a cell (default 200)")
    parser.add_argument("files", nargs="*", type=Path, metavar="RESULTS", help="A's and B's results.json")
    args = parser.parse_args(argv)
    try:
        if args.files and len(args.files) != 2:
            raise BadInput("give two results files (A's and B's), or none for the grid")
        if args.files:
            a, b = (json.loads(p.read_text()) for p in args.files)
            result = comparison.compare_runs([a], [b])
            designs = control_power.designs_of(result.metrics)
            if not designs:
                raise BadInput("the two files hold no negative control measured on two blocks or more")

            median = statistics.median(d.sd for d in designs)
            print(
                f"{len(designs)} controls, median spread {median:.1%} a block; a {control_power.DRIFT:.0%} "
                f"drift caught in (seed {control_power.SEED}, {args.trials} runs):"
            )
            rows = [(f"alpha {level}", level, designs) for level in LEVELS]
            blocks = FILE_BLOCKS
        else:
            print(
                f"{CONTROLS} controls; a {control_power.DRIFT:.0%} drift caught in "
                f"(seed {control_power.SEED}, {args.trials} runs):"
            )
            rows = [
                (
                    f"spread {sd:.0%} alpha {level}",
                    level,
                    [control_power.ControlDesign(f"c{i}", 2, 2, 2, sd / 2**0.5) for i in range(CONTROLS)],
                )
                for sd in SPREADS
                for level in LEVELS
            ]
            blocks = GRID_BLOCKS
    except (BadInput, OSError, json.JSONDecodeError) as exc:
        print(f"memqual: {exc}", file=sys.stderr)
        return 2
    for name, level, designs in rows:
        cells = []
        for n in blocks:
            found = control_power.power(
                control_power.on_blocks(designs, n), alpha=level, threshold=0.05, trials=args.trials
            )
            cells.append(f"{n}: {found.power:4.0%}")
        print(f"  {name:<24} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Block spread of an A/B run: ``python -m memqual.host.cli.block_spread OUTPUT [--json]``.

OUTPUT is a ``memqual run`` folder with two arms (OUTPUT/A/results.json and
OUTPUT/B/results.json).  Prints, for every metric both arms recorded in
blocks, the sd of the blocks' log(B/A) (memqual.host.judge.block_spread):
on an A/A run, the instrument's block-to-block noise that
host/judge/primaries.py keeps per primary and clock.  A run stopped before
it wrote them (a timeout, ^C) still has its finished tests' records under
OUTPUT/avocado/: with ``--jobs`` they are read from there, each by the arm
and block its test's variant names.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.cli import args as cliargs
from memqual.host.core import record
from memqual.host.core.errors import BadInput, MemqualError
from memqual.host.judge.block_spread import block_spreads, table
from memqual.host.judge.results import build_results, load_results, write_results
from memqual.host.run import blocks

if TYPE_CHECKING:
    from memqual.host.judge.results import Results


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.host.cli.block_spread", description=__doc__.splitlines()[0])
    parser.add_argument("output", metavar="OUTPUT", help="a memqual run folder with A/ and B/")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--jobs", action="store_true", help="read the records of OUTPUT/avocado/ (a run stopped before its results)"
    )
    parser.add_argument(
        "--write",
        metavar="DIR",
        help="with --jobs: also write the arms' results as DIR/A/results.json and DIR/B/results.json "
        "(for memqual compare)",
    )
    args = parser.parse_args(argv)
    try:
        folder = Path(args.output)
        if args.jobs:
            a, b = from_jobs(folder)
            if args.write:
                for arm, found in (("A", a), ("B", b)):
                    (Path(args.write) / arm).mkdir(parents=True, exist_ok=True)
                    write_results(found, Path(args.write) / arm / "results.json")
        else:
            a, b = load_results(folder / "A" / "results.json"), load_results(folder / "B" / "results.json")
        spreads = block_spreads(a, b)
    except MemqualError as exc:
        print(f"memqual: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_status
    if args.json:
        json.dump([s.to_json() for s in spreads], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        clocks = ", ".join(sorted({s.clock for s in spreads})) or "?"
        print(f"{folder}: clock {clocks}, {len(spreads)} metrics in blocks")
        print("\n".join(table(spreads)))
    return 0


def from_jobs(folder: Path) -> tuple[Results, Results]:
    """Each arm's results, built from the records of the avocado jobs under
    ``folder``/avocado, each stamped with the arm and block of its test's
    variant (a record outside a variant is left out).  BadInput when there
    is no avocado folder or an arm has no record."""
    jobs = folder / "avocado"
    if not jobs.is_dir():
        raise BadInput(f"{jobs}: no avocado folder: give a memqual run OUTPUT folder")
    arms: dict[str, list[Any]] = {"A": [], "B": []}
    for path in sorted(jobs.rglob(record.RECORD_GLOB)):
        test_dir = blocks.record_test_dir(path)
        where = blocks.arm_and_block(test_dir.name) if test_dir else None
        if where is None or where[0] not in arms:
            continue
        found = record.load(path)
        blocks.stamp(found, *where)
        arms[where[0]].append(found)
    if not arms["A"] or not arms["B"]:
        raise BadInput(f"{jobs}: no record of arm {'A' if not arms['A'] else 'B'}: nothing to compare")
    a, b = (build_results([], record.merge_rounds(arms[arm]), host_fallback=False) for arm in ("A", "B"))
    return a, b


if __name__ == "__main__":
    sys.exit(main())

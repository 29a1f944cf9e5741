"""Block spread of an A/B run: ``python -m memqual.lab.block_spread OUTPUT [--jobs] [--json]``.

For each metric both arms of OUTPUT (a ``memqual run`` folder: A/ and B/)
recorded in blocks, the sd of the blocks' log(B/A) (a block's value: the
median of its arm's samples), which each scenario row keeps per primary
and clock, and each arm's own sd of log over the blocks, which shows what
an A/A's paired boots cancel.  ``--jobs`` reads a run stopped before it
wrote its results (OUTPUT/avocado/'s records).  docs/lab.md, "block_spread".
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memqual.host.cli import args as cliargs
from memqual.host.core import record
from memqual.host.core.errors import BadInput, MemqualError
from memqual.host.judge.primaries import primary_of
from memqual.host.judge.results import MetricEntry, Results, build_results, load_results, write_results
from memqual.host.run.blocks import arm_and_block, record_test_dir, stamp


@dataclasses.dataclass(frozen=True)
class BlockSpread:
    key: str  # results.json's metric key
    scenario: str
    metric: str
    variant: dict[str, Any]
    primary: bool  # a primary on the clock of the run
    clock: str
    log_ratios: tuple[float, ...]  # one a block, in block order
    log_a: tuple[float, ...] = ()  # each arm's log value a block, in the same order
    log_b: tuple[float, ...] = ()

    @property
    def blocks(self) -> int:
        return len(self.log_ratios)

    @property
    def sd(self) -> float:
        """The sd of the blocks' log(B/A); nan with fewer than 2 blocks."""
        return statistics.stdev(self.log_ratios) if self.blocks >= 2 else math.nan

    @property
    def sd_a(self) -> float:
        """Arm A's sd of log over the blocks: what its block's inputs move."""
        return statistics.stdev(self.log_a) if len(self.log_a) >= 2 else math.nan

    @property
    def sd_b(self) -> float:
        return statistics.stdev(self.log_b) if len(self.log_b) >= 2 else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "primary": self.primary,
            "clock": self.clock,
            "blocks": self.blocks,
            "sd_log_ratio": None if math.isnan(self.sd) else round(self.sd, 6),
            "sd_log_a": None if math.isnan(self.sd_a) else round(self.sd_a, 6),
            "sd_log_b": None if math.isnan(self.sd_b) else round(self.sd_b, 6),
            "log_ratios": [round(x, 6) for x in self.log_ratios],
        }


def per_block(entry: MetricEntry) -> dict[int, float]:
    """The median of each block's samples of one results.json metric entry
    (empty when the entry has no blocks)."""
    blocks = entry.blocks or []
    replicates = entry.replicates or []
    grouped: dict[int, list[float]] = {}
    for block, samples in zip(blocks, replicates, strict=False):
        grouped.setdefault(int(block), []).extend(float(x) for x in samples)
    return {block: statistics.median(values) for block, values in grouped.items() if values}


def block_spreads(a: Results | Mapping[str, Any], b: Results | Mapping[str, Any]) -> list[BlockSpread]:
    """Every metric of ``a`` and ``b`` (two results.json, as loaded) that
    both recorded in the same blocks, with positive values in each."""
    a, b = Results.from_json(a), Results.from_json(b)
    clock = str((a.environment or {}).get("clock") or "wall")
    on_host_under_test = bool((a.environment or {}).get("host_under_test"))
    by_key = {m.key: m for m in b.metrics}
    out = []
    for ma in a.metrics:
        mb = by_key.get(ma.key)
        if mb is None:
            continue
        # Under a plan (--clock auto) each metric names its own clock.
        read_with = ma.clock or clock
        va, vb = per_block(ma), per_block(mb)
        common = sorted(set(va) & set(vb))
        if not common or any(va[k] <= 0 or vb[k] <= 0 for k in common):
            continue
        out.append(
            BlockSpread(
                key=ma.key,
                scenario=ma.scenario,
                metric=ma.metric,
                variant=dict(ma.variant or {}),
                primary=primary_of(ma.scenario, ma.metric, ma.variant, read_with, on_host_under_test) is not None,
                clock=read_with,
                log_ratios=tuple(math.log(vb[k] / va[k]) for k in common),
                log_a=tuple(math.log(va[k]) for k in common),
                log_b=tuple(math.log(vb[k]) for k in common),
            )
        )
    return out


def table(spreads: Sequence[BlockSpread]) -> list[str]:
    """Lines of a plain table: primaries first, then by spread."""
    rows = sorted(spreads, key=lambda s: (not s.primary, -s.sd if not math.isnan(s.sd) else 0.0, s.key))
    lines = [f"{'role':<11} {'blocks':>6} {'sd log(B/A)':>12} {'sd log A':>9} {'sd log B':>9} {'clock':<9} metric"]

    def shown(value: float) -> str:
        return "-" if math.isnan(value) else f"{value:.5f}"

    for s in rows:
        role = "primary" if s.primary else "other"
        lines.append(
            f"{role:<11} {s.blocks:>6} {shown(s.sd):>12} {shown(s.sd_a):>9} {shown(s.sd_b):>9} {s.clock:<9} {s.key}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = cliargs.Parser(prog="python -m memqual.lab.block_spread", description=__doc__.splitlines()[0])
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
        test_dir = record_test_dir(path)
        where = arm_and_block(test_dir.name) if test_dir else None
        if where is None or where[0] not in arms:
            continue
        found = record.load(path)
        stamp(found, *where)
        arms[where[0]].append(found)
    if not arms["A"] or not arms["B"]:
        raise BadInput(f"{jobs}: no record of arm {'A' if not arms['A'] else 'B'}: nothing to compare")
    a, b = (build_results([], record.merge_rounds(arms[arm]), host_fallback=False) for arm in ("A", "B"))
    return a, b


if __name__ == "__main__":
    sys.exit(main())

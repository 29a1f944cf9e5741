"""``memqual history DIR...``: the series of many runs, each metric over
time or kernel with CIs and the steps found, written as one page (and as
JSON with --json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from memqual.host.cli import args as cliargs
from memqual.host.cli.args import percent_as_fraction
from memqual.host.cli.command import Command
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import write_private_atomic
from memqual.host.judge.history import build, to_json
from memqual.host.judge.regime import NOT_COMPARABLE
from memqual.host.judge.verdicts import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from memqual.host.report.history_page import render

if TYPE_CHECKING:
    pass

DESCRIPTION = """Reads every results.json given (or found below a directory given: a
two-kernel run's A/ and B/ are two runs), keeps runs apart whose host or
QEMU differ (CPU, host kernel, QEMU version, accelerator: results.json has
no host name, so a host is what it measured on), orders each group by time
or by guest kernel, and writes one page: per group the environment and the
runs, per metric its series -- every run's pooled median as a ratio to the
group's first run, with the two-stage bootstrap 95% CI over that run's
replicates -- and the steps found.  The steps are tested with the run as
the unit (each run's median; the spread between runs estimated from the
runs), and a step that a negative control shares is confounded, not a
decision."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="DIR", help="results.json files or directories holding them")
    parser.add_argument("--order", choices=("time", "kernel"), default="time", help="order the runs by (default time)")
    parser.add_argument(
        "--threshold",
        type=percent_as_fraction,
        default=DEFAULT_THRESHOLD,
        metavar="PCT",
        help="smallest step that counts, in percent (default 5)",
    )
    parser.add_argument(
        "--html",
        type=cliargs.output_file,
        metavar="FILE",
        default="memqual-history.html",
        help="the page to write (default memqual-history.html)",
    )
    parser.add_argument("--json", action="store_true", help="also print the series and steps as JSON")


def main(args: argparse.Namespace) -> int:
    groups, diffs = build(args.paths, order=args.order, threshold=args.threshold)
    target = Path(args.html)
    if target.is_dir():
        raise BadInput(f"--html {target}: is a directory; give a file name")
    if not target.parent.is_dir():
        raise BadInput(f"--html {target}: no such directory {target.parent}")
    write_private_atomic(target, render(groups, diffs, args.order, args.threshold, DEFAULT_ALPHA).encode(), 0o644)
    if args.json:
        json.dump(to_json(groups, diffs, args.order, args.threshold, DEFAULT_ALPHA), sys.stdout, indent=2)
        sys.stdout.write("\n")
    out = sys.stderr if args.json else sys.stdout
    for gi, g in enumerate(groups):
        print(
            f"group {gi + 1} ({', '.join(f'{k} {v}' for k, v in g.host.items())}): {len(g.runs)} runs, "
            f"{sum(1 for s in g.series if s.verdict == 'step')} of {len(g.series)} metrics with a step, "
            f"{sum(1 for s in g.series if s.verdict == 'equivalent')} equivalent, "
            f"{sum(1 for s in g.series if s.verdict == 'undecided')} undecided, "
            f"{sum(1 for s in g.series if s.verdict == NOT_COMPARABLE)} not comparable",
            file=out,
        )
        for s in g.series:
            if s.regime is not None and not s.comparable:
                print(f"  {s.key}: {s.regime.reason()}", file=out)
        if g.host_drifted:
            print(
                "  the host drifted: negative control(s) with a step "
                f"({', '.join(c.key for c in g.controls_stepped)}); the other series' steps between the same runs "
                "are confounded, not decided",
                file=out,
            )
        for s in g.series:
            for st in s.steps:
                print(
                    f"  {s.key}: step before run {st.after + 1} ({g.runs[st.after].name}): x{st.ratio:.3f} "
                    f"[{st.ci_low:.3f}, {st.ci_high:.3f}], p={st.p_value:.3g}"
                    + (" (confounded: a control stepped there too)" if st.confounded else ""),
                    file=out,
                )
    for key, values in diffs.items():
        print(f"environment {key} differs between groups: {' | '.join(map(str, values))}", file=out)
    print(f"wrote {target}", file=out)
    return 0


COMMAND = Command(
    "history",
    help="the series of many runs: each metric over time or kernel, with CIs and the steps found",
    configure=configure,
    run=main,
    description=DESCRIPTION,
)

"""``memqual compare A.json B.json``: is run B faster or slower than run A?

The statistics and the verdicts (slower, faster, equivalent, undecided;
Holm over the primary metrics, the negative controls in their own
family, the rest corrected for the false discovery rate) are
host/judge/comparison.py's; this module is the command and its table.

Why it is built so: docs/architecture.md, "Module notes", host/cli/compare.py.
"""

from __future__ import annotations

import argparse
import json
import sys

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command
from memqual.host.core.errors import BadInput, MemqualError
from memqual.host.judge.ab_outcome import of_results
from memqual.host.judge.results import load_results
from memqual.host.judge.verdicts import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from memqual.host.report.compare_text import print_comparison


def _fraction(text: str) -> float:
    """A fraction in [0, 1): a threshold of 0 counts every change."""
    value = cliargs.non_negative(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction in [0, 1)")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A.json", help="the baseline run's results.json")
    parser.add_argument("b", metavar="B.json", help="the candidate run's results.json")
    parser.add_argument(
        "--also-a",
        action="append",
        default=[],
        metavar="FILE",
        help="another run of the baseline (repeat): with 2 or more runs a side the run is the unit",
    )
    parser.add_argument(
        "--also-b",
        action="append",
        default=[],
        metavar="FILE",
        help="another run of the candidate (repeat): with 2 or more runs a side the run is the unit",
    )
    parser.add_argument(
        "--threshold",
        type=_fraction,
        default=DEFAULT_THRESHOLD,
        help="smallest relative change of the median that counts (default 0.05); each primary is judged "
        "against its own margin (its scenario row)",
    )
    parser.add_argument(
        "--alpha",
        type=_fraction,
        default=DEFAULT_ALPHA,
        help=f"family-wise error level of the primaries' decisions, Holm-corrected (default {DEFAULT_ALPHA:g})",
    )
    parser.add_argument(
        "--all-metrics",
        action="store_true",
        help="every metric, not only the primaries, sets the exit status (each in its family's correction)",
    )
    parser.add_argument(
        "--across-hosts",
        action="store_true",
        help="A and B ran on two hosts under test on purpose (an A/B of host kernels, as memqual run "
        "--host-kernel A --host-kernel B writes it): compare across them, the hosts being what differs",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument(
        "--html", type=cliargs.output_file, metavar="FILE", help="also write the comparison as a self-contained page"
    )


def run(args: argparse.Namespace) -> int:
    """Exit 1 says a primary is slower, and nothing else: whatever else the
    comparison of two schema-valid files meets (a figure matplotlib or the
    arithmetic refuses) is one line and exit 2, never main's exit 1."""
    try:
        return _compare(args)
    except (MemqualError, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise BadInput(
            f"{args.a} and {args.b} could not be compared ({type(exc).__name__}{': ' + first if first else ''}): "
            "check that both are results files of memqual runs; MEMQUAL_DEBUG=1 shows where it failed"
        ) from exc


def _compare(args: argparse.Namespace) -> int:
    a = load_results(args.a)
    b = load_results(args.b)
    more_a = [load_results(f) for f in args.also_a]
    more_b = [load_results(f) for f in args.also_b]
    outcome = of_results(
        [a, *more_a],
        [b, *more_b],
        threshold=args.threshold,
        alpha=args.alpha,
        all_metrics=args.all_metrics,
        across_hosts=args.across_hosts,
    )
    result = outcome.comparison
    if args.json:
        out = outcome.to_json()
        out.update({"a": str(args.a), "b": str(args.b), "also_a": list(args.also_a), "also_b": list(args.also_b)})
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"A = {' + '.join([str(args.a), *args.also_a])}\nB = {' + '.join([str(args.b), *args.also_b])}")
        print_comparison(outcome)
        if result.descriptive:
            print(
                f"{len(result.descriptive)} metrics outside blocks with one run a side: the two runs' replicates "
                "say whether these runs differ, not whether the kernels do (run-to-run variance is not in them); "
                "described, not decided, no exit status.  Give several runs a side (--also-a, --also-b) or an "
                "interleaved run (memqual run with two kernels)."
            )
    if args.html:
        # lazy: the pages bring jinja2, numpy and scipy (~300 ms); only this path writes one
        from memqual.host.report.compare_report import comparison_page, write_comparison_html

        path = write_comparison_html(comparison_page(outcome, a, b), args.html)
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return int(outcome.exit_status)


COMMAND = Command(
    "compare",
    help="compare two results.json files: slower, faster, equivalent or undecided per metric",
    configure=configure,
    run=run,
    description=__doc__.split("\n\n")[1] if __doc__ else None,
)

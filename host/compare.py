"""``memqual compare A.json B.json``: is run B faster or slower than run A?

The statistics and the verdicts (faster, slower, underpowered, no
difference; Holm over every metric the two runs share) are
host/comparison.py's; this module is the command and its table.

Exit status 1 when, and only when, at least one metric is ``slower``;
0 otherwise (underpowered metrics included: they are reported, not failed);
2 (one line on stderr) when the two files cannot be compared: a missing or
truncated file, another schema or memqual version, a metric whose unit or
direction differs, or no metric at all present in both.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memqual.host import cliargs
from memqual.host.comparison import (
    CORRECTION,
    DEFAULT_ALPHA,
    DEFAULT_THRESHOLD,
    FASTER,
    NO_DIFFERENCE,
    SLOWER,
    UNDERPOWERED,
    VERDICTS,
    MetricComparison,
    RunComparison,
    check_comparable,
    compare_results,
    pair_metrics,
    replicates_of,
    short_labels,
    verdict_text,
)

# The computation is memqual.host.comparison's; these names are kept here for the
# callers that reach them as ``compare.X``.  The page, the HTML helpers and
# the results reader are imported where used: `memqual --help` loads this
# module and must not load numpy, scipy or matplotlib.
__all__ = [
    "CORRECTION",
    "DEFAULT_ALPHA",
    "DEFAULT_THRESHOLD",
    "FASTER",
    "NO_DIFFERENCE",
    "SLOWER",
    "UNDERPOWERED",
    "VERDICTS",
    "MetricComparison",
    "RunComparison",
    "check_comparable",
    "compare_results",
    "pair_metrics",
    "replicates_of",
    "short_labels",
    "verdict_text",
    "print_comparison",
    "register",
    "run",
]


def print_comparison(result: RunComparison, console: Any = None, a_name: str = "A", b_name: str = "B") -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from memqual.host.html import num

    # Logs and CI get 120 columns; a terminal its own width.
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    styles = {FASTER: "bold green", SLOWER: "bold red", NO_DIFFERENCE: "dim", UNDERPOWERED: "bold magenta"}
    table = Table(
        title=(
            f"{b_name} against {a_name} (threshold {result.threshold:.0%}, alpha {result.alpha:g}, "
            f"Holm-corrected over {len(result.metrics)} metrics)"
        ),
        title_justify="left",
    )
    table.add_column("metric", overflow="fold", ratio=1)
    table.add_column(f"{a_name} median", justify="right", no_wrap=True)
    table.add_column(f"{b_name} median", justify="right", no_wrap=True)
    table.add_column("B/A [95% CI]", justify="right", no_wrap=True)
    table.add_column("reps", justify="right", no_wrap=True)
    table.add_column("p (Holm)", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    labels = short_labels(result.metrics)
    for m in result.metrics:
        c = m.comparison
        table.add_row(
            escape(labels[m.key] + (" *" if m.settings_changed else "")),
            escape(f"{num(c.a.median)} {m.unit}"),
            escape(f"{num(c.b.median)} {m.unit}"),
            f"{num(c.ratio)} [{num(c.ci_low)}, {num(c.ci_high)}]",
            f"{c.n_replicates_a}/{c.n_replicates_b}",
            f"{c.p_value:.2g}" + ("" if c.p_adjusted is None else f" ({c.p_adjusted:.2g})"),
            # The count an underpowered row needs is the same for all of them
            # (one stopping level): said once below the table.
            f"[{styles[m.verdict]}]{m.verdict}[/]",
        )
    console.print(table)
    for m in result.metrics:
        if m.settings_changed:
            diffs = ", ".join(f"{k}: {va} -> {vb}" for k, (va, vb) in m.settings_changed.items())
            console.print(
                f"* {m.scenario} {m.metric}: settings changed ({diffs})", highlight=False, markup=False, soft_wrap=True
            )
    for name, keys in ((a_name, result.only_in_a), (b_name, result.only_in_b)):
        for key in keys:
            console.print(f"only in {name} (not compared): {key}", highlight=False, markup=False, soft_wrap=True)
    for claim in result.claims:
        if claim["a"] != claim["b"]:
            console.print(f"claim {claim['id']}: {claim['a']} -> {claim['b']}", highlight=False, markup=False)
    for key, (va, vb) in result.environment.items():
        console.print(f"environment {key}: {va} -> {vb}", highlight=False, markup=False, soft_wrap=True)
    if result.underpowered:
        needed = max((m.comparison.replicates_needed or 0) for m in result.underpowered)
        console.print(
            f"[bold magenta]{len(result.underpowered)} metric(s) underpowered[/]: too few replicates to be "
            f"significant in this comparison whatever was measured (needs {needed} a side); "
            "not evidence of no difference",
            highlight=False,
            soft_wrap=True,
        )
    if result.regressions:
        console.print(f"[bold red]{len(result.regressions)} metric(s) slower beyond {result.threshold:.0%}[/]")
    else:
        console.print("no regression beyond the threshold")


def _fraction(text: str) -> float:
    """A fraction in [0, 1): a threshold of 0 counts every change."""
    value = cliargs.non_negative(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction in [0, 1)")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare two results.json files: faster, slower, no difference or underpowered per metric",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("a", metavar="A.json", help="the baseline run's results.json")
    parser.add_argument("b", metavar="B.json", help="the candidate run's results.json")
    parser.add_argument(
        "--threshold",
        type=_fraction,
        default=DEFAULT_THRESHOLD,
        help="smallest relative change of the median that counts (default 0.05)",
    )
    parser.add_argument(
        "--alpha",
        type=_fraction,
        default=DEFAULT_ALPHA,
        help="family-wise significance level over all metrics, Holm-corrected (default 0.01)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument(
        "--html", type=cliargs.output_file, metavar="FILE", help="also write the comparison as a self-contained page"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from memqual.host.results import load_results

    a = load_results(args.a)
    b = load_results(args.b)
    result = compare_results(a, b, threshold=args.threshold, alpha=args.alpha)
    if args.json:
        out = result.to_json()
        out.update({"a": str(args.a), "b": str(args.b)})
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"A = {args.a}\nB = {args.b}")
        print_comparison(result)
    if args.html:
        from memqual.host.compare_report import write_comparison_html

        path = write_comparison_html(result, a, b, args.html)
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 1 if result.regressions else 0

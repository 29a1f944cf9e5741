"""The terminal table of a comparison of two runs (``memqual compare`` and
an A/B ``memqual run``): one row per metric, then the sentences a reader
needs (regimes, drift, regressions).  Judges nothing: the verdicts are
memqual.host.judge.comparison's.
"""

from __future__ import annotations

import sys
from typing import Any

from memqual.host.core import printable
from memqual.host.judge.comparison import (
    EQUIVALENT,
    FASTER,
    NOT_COMPARABLE,
    SLOWER,
    UNDECIDED,
    RunComparison,
    short_labels,
    verdict_text,
)
from memqual.host.judge.primaries import PRIMARY

# Primaries unmarked: they are what the table is about.
ROLE_MARKS = {"primary": "", "control": " (control)", "exploratory": " (exploratory)"}


def print_comparison(result: RunComparison, console: Any = None, a_name: str = "A", b_name: str = "B") -> None:
    from rich.markup import escape
    from rich.table import Table

    from memqual.host.report.html import num

    # Logs and CI get 120 columns; a terminal its own width.
    console = console or printable.console(width=None if sys.stdout.isatty() else 120)
    styles = {
        FASTER: "bold green",
        SLOWER: "bold red",
        EQUIVALENT: "green",
        UNDECIDED: "bold magenta",
        NOT_COMPARABLE: "bold yellow",
    }
    families = result.to_json()["families"]
    table = Table(
        title=(
            f"{b_name} against {a_name} (threshold {result.threshold:.0%}, alpha {result.alpha:g}: Holm over "
            f"{families['primary']} primaries and {families['control']} controls, Benjamini-Hochberg over "
            f"{families['exploratory']} exploratory at alpha/4)"
        ),
        title_justify="left",
    )
    table.add_column("metric", overflow="fold", ratio=1)
    table.add_column(f"{a_name} median", justify="right", no_wrap=True)
    table.add_column(f"{b_name} median", justify="right", no_wrap=True)
    table.add_column("B/A [95% CI]", justify="right", no_wrap=True)
    table.add_column("reps", justify="right", no_wrap=True)
    table.add_column("p (corr.)", justify="right", no_wrap=True)
    table.add_column("verdict", overflow="fold", max_width=24)
    labels = short_labels(result.metrics)
    for m in result.metrics:
        c = m.comparison
        table.add_row(
            escape(labels[m.key] + (" *" if m.settings_changed else "") + ROLE_MARKS[m.role]),
            escape(f"{num(c.a.median)} {m.unit}"),
            escape(f"{num(c.b.median)} {m.unit}"),
            f"{num(c.ratio)} [{num(c.ci_low)}, {num(c.ci_high)}]",
            f"{c.n_replicates_a}/{c.n_replicates_b}" + (f" ({c.n_blocks} blocks)" if c.paired else ""),
            f"{c.p_value:.2g}" + ("" if c.p_adjusted is None else f" ({c.p_adjusted:.2g})"),
            # Why a metric was not compared is a sentence: it goes below the table.
            f"[{styles[m.verdict]}]{escape(verdict_text(m) if m.comparable else NOT_COMPARABLE + ' (below)')}[/]",
        )
    console.print(table)
    # One line per scenario and reason: a regime covers a whole scenario's metrics.
    refused: dict[tuple[str, str], int] = {}
    for m in result.not_comparable:
        reason = m.regime.reason() if m.regime else NOT_COMPARABLE
        refused[(m.scenario, reason)] = refused.get((m.scenario, reason), 0) + 1
    for (scenario, reason), n in refused.items():
        console.print(f"{scenario} ({n} metric(s)): {reason}", highlight=False, markup=False, soft_wrap=True)
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
    counts = result.counts(PRIMARY)
    console.print(
        f"primaries: {counts[SLOWER]} slower, {counts[FASTER]} faster, {counts[EQUIVALENT]} equivalent, "
        f"{counts[UNDECIDED]} undecided, {counts[NOT_COMPARABLE]} not comparable",
        highlight=False,
        markup=False,
    )
    if result.undecided:
        console.print(
            f"[bold magenta]{len(result.undecided)} metric(s) undecided[/]: neither a change nor equivalence "
            "shown; each says about how many units a side would decide it",
            highlight=False,
            soft_wrap=True,
        )
    if result.not_comparable:
        console.print(
            f"[bold yellow]{len(result.not_comparable)} metric(s) not comparable[/]: the two runs measured them "
            "in different regimes (each row says which); they decide nothing",
            highlight=False,
            soft_wrap=True,
        )
    if result.host_drifted:
        console.print(
            f"[bold red]the host drifted[/]: {len(result.controls_flagged)} negative control(s) moved "
            f"({', '.join(m.key for m in result.controls_flagged)}), metrics no guest kernel can move; "
            "the decisions of this comparison are not to be trusted: re-run with A and B interleaved",
            highlight=False,
            soft_wrap=True,
        )
    if result.regressions:
        which = "metric(s)" if result.all_metrics else "primary metric(s)"
        console.print(f"[bold red]{len(result.regressions)} {which} slower beyond {result.threshold:.0%}[/]")
    else:
        console.print("no regression beyond the threshold")

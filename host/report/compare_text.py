"""The terminal table of a comparison of two runs (``memqual compare`` and
an A/B ``memqual run``): the deciding table (host/judge/decisions.py), one
row per metric, primaries first, each with the look that decided it, the
p that faced its boundary and the boundary; then the sentences a reader
needs (regimes, the controls' power, drift, regressions).  Judges nothing:
it renders an A/B's outcome (host/judge/ab_outcome.py).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from memqual.host.core import printable
from memqual.host.judge.comparison import MetricComparison, RunComparison
from memqual.host.judge.primaries import CONTROL, EXPLORATORY, PRIMARY
from memqual.host.judge.regime import NOT_COMPARABLE
from memqual.host.judge.verdicts import CHANGED, EQUIVALENT, FASTER, RUNS_DIFFER, SLOWER, UNDECIDED

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from memqual.host.judge.ab_outcome import ABOutcome
    from memqual.host.judge.control_power import ControlPower
    from memqual.host.judge.decisions import DecidingTable, Decision

# Primaries unmarked: they are what the table is about.
ROLE_MARKS = {"primary": "", "control": " (control)", "exploratory": " (exploratory)"}
VERDICT_STYLES = {
    FASTER: "bold green",
    SLOWER: "bold red",
    EQUIVALENT: "green",
    UNDECIDED: "bold magenta",
    NOT_COMPARABLE: "bold yellow",
    CHANGED: "yellow",
    RUNS_DIFFER: "dim",
}


def print_comparison(outcome: ABOutcome, console: Console | None = None, a_name: str = "A", b_name: str = "B") -> None:
    """The outcome's deciding table and what a reader needs below it."""
    result, table, power = outcome.comparison, outcome.table, outcome.power
    # Logs and CI get 120 columns; a terminal its own width.
    console = console or printable.console(width=None if sys.stdout.isatty() else 120)
    console.print(decisions_grid(result, table, a_name, b_name))
    if table.sequential:
        print_looks_notes(console, table)
    print_differences(console, result, a_name, b_name)
    print_conclusions(console, result, table, power)


def decisions_grid(result: RunComparison, table: DecidingTable, a_name: str, b_name: str) -> Table:
    """The deciding table as rich draws it: one row per metric shown,
    primaries first."""
    from rich.table import Table

    families = result.families()
    how = (
        f"each metric at the look of --until-decided that decided it, alpha {table.alpha:g} spent over "
        f"{len(table.looks)} look(s)"
        if table.sequential
        else f"alpha {result.alpha:g}"
    )
    grid = Table(
        title=(
            f"{b_name} against {a_name}, clock {result.clock}: the decisions ({how}; "
            f"margin {table.margin:.0%} unless a primary's own: "
            "Holm over "
            f"{families['primary']} primaries and {families['control']} controls, Benjamini-Hochberg over "
            f"{families['exploratory']} exploratory at alpha/4)"
        ),
        title_justify="left",
    )
    grid.add_column(f"metric, median {a_name} → {b_name}", overflow="fold", ratio=3, min_width=16)
    grid.add_column("B/A [95% CI]", justify="right", no_wrap=True)
    grid.add_column("reps" if not table.sequential else "blocks", justify="right", no_wrap=True)
    if table.sequential:
        grid.add_column("look", justify="right", no_wrap=True)
    grid.add_column("p (corr.)" if not table.sequential else "p' < boundary", justify="right", no_wrap=True)
    grid.add_column("margin", justify="right", no_wrap=True)
    grid.add_column("verdict", overflow="fold", ratio=2, min_width=20)
    by_key = {m.key: m for m in result.metrics}
    order = {PRIMARY: 0, CONTROL: 1, EXPLORATORY: 2}
    shown = sorted(table.rows, key=lambda r: order.get(r.role, 3))
    if table.sequential:
        # The looks' table on a terminal: every primary, the controls and
        # exploratory metrics that were decided; the rest are counted below
        # and listed in comparison.json and comparison.html.
        shown = [r for r in shown if r.role == PRIMARY or r.decided]
    for r in shown:
        grid.add_row(*row_cells(r, by_key[r.key], table.sequential))
    return grid


def row_cells(r: Decision, m: MetricComparison, sequential: bool) -> list[str]:
    """One metric's cells of the deciding table, in rich's markup."""
    from rich.markup import escape

    from memqual.host.core.printable import format_number as num

    c = m.comparison
    if sequential:
        units = f"{r.blocks}"
        look = "-" if r.look is None else f"{r.look}"
        test = f"{r.p:.2g} {'<' if r.p < r.level else '≥'} {r.level:.2g}" if r.level > 0 else "-"
    else:
        units = f"{c.n_replicates_a}/{c.n_replicates_b}" + (f" ({c.n_blocks} blocks)" if c.paired else "")
        look = ""
        test = f"{c.p_value:.2g}" + ("" if c.p_adjusted is None else f" ({c.p_adjusted:.2g})")
    medians = f"{num(r.a_median)} {r.unit}".strip() + " → " + f"{num(r.b_median)} {r.unit}".strip()
    return [
        escape(r.label + (" *" if m.settings_changed else "") + ROLE_MARKS[r.role]) + f"\n[dim]{escape(medians)}[/]",
        f"{num(r.ratio)} [{num(r.ci_low)}, {num(r.ci_high)}]",
        units,
        *([look] if sequential else []),
        test,
        f"±{r.margin * 100:.3g}%",
        # Why a metric was not compared is a sentence: it goes below the table.
        f"[{VERDICT_STYLES.get(r.verdict, 'bold yellow')}]"
        f"{escape(r.text if r.verdict != NOT_COMPARABLE else NOT_COMPARABLE + ' (below)')}[/]",
    ]


def print_looks_notes(console: Console, table: DecidingTable) -> None:
    """Below a table of --until-decided's looks: the undecided metrics not
    shown, why the looks stopped, and what p' and its boundary are."""
    for role, name in ((CONTROL, "negative controls"), (EXPLORATORY, "exploratory metrics")):
        rest = [r for r in table.of_role(role) if not r.decided]
        if rest:
            console.print(
                f"{len(rest)} {name} undecided (not shown: comparison.json, comparison.html)",
                highlight=False,
                markup=False,
            )
    console.print(
        f"until decided: {table.stopped or 'every primary decided'}.  p' is a look's group-sequential p "
        "(host/judge/until_decided.py), the boundary the level it faced in its family at that look.  The whole "
        "run compared again at full alpha is descriptive only (comparison.json 'descriptive', "
        "comparison.html): it sets no exit status",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def print_differences(console: Console, result: RunComparison, a_name: str, b_name: str) -> None:
    """What differs between the runs besides the figures: the metrics not
    comparable and why, changed settings, metrics only one run has, claims
    whose verdict moved, and the environment."""
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


def print_conclusions(console: Console, result: RunComparison, table: DecidingTable, power: ControlPower) -> None:
    """The primaries' tally, the undecided and not comparable counts, the
    negative controls' word on the host, and the regressions."""
    primaries = table.of_role(PRIMARY)
    tally = {v: sum(1 for r in primaries if r.verdict == v) for v in (SLOWER, FASTER, EQUIVALENT, UNDECIDED)}
    console.print(
        f"primaries: {tally[SLOWER]} slower, {tally[FASTER]} faster, {tally[EQUIVALENT]} equivalent, "
        f"{tally[UNDECIDED]} undecided, {sum(1 for r in primaries if r.verdict == NOT_COMPARABLE)} not comparable",
        highlight=False,
        markup=False,
    )
    undecided = [r for r in table.rows if r.verdict == UNDECIDED]
    if undecided:
        console.print(
            f"[bold magenta]{len(undecided)} metric(s) undecided[/]: neither a change nor equivalence "
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
    print_controls(console, table, power)
    regressions = table.regressions if not result.all_metrics else result.regressions
    if regressions:
        which = "metric(s)" if result.all_metrics else "primary metric(s)"
        console.print(
            f"[bold red]{len(regressions)} {which} slower[/] (shown to differ from A, the estimate beyond its margin; "
            "not a change shown to exceed the margin)"
        )
    else:
        console.print("no primary slower (none shown to differ from A with its estimate beyond its margin)")


def print_controls(console: Console, table: DecidingTable, power: ControlPower) -> None:
    """The negative controls' word: the host drifted (its decisions not to
    be trusted), or none moved and how much that says."""
    flagged = table.controls_flagged
    if table.host_drifted:
        console.print(
            f"[bold red]the host drifted[/]: {len(flagged)} negative control(s) moved "
            f"({', '.join(r.key for r in flagged)}), metrics no guest kernel can move; "
            "the decisions of this comparison are not to be trusted: re-run with A and B interleaved",
            highlight=False,
            soft_wrap=True,
        )
    elif power.controls:
        said = "no negative control moved" if power.sufficient else "no negative control flagged, which says nothing"
        console.print(f"{said}: {power.line()}", highlight=False, markup=False, soft_wrap=True)
    else:
        console.print(power.line(), highlight=False, markup=False, soft_wrap=True)

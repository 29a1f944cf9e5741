"""A run's tables on the terminal: the claims' verdicts with their evidence,
and each metric's samples (kernbench's mean (stdev) form).  Judges nothing
and writes no file.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memqual.host.core import descriptive, printable
from memqual.host.core.printable import format_number as num
from memqual.host.judge.claims.model import DIRECTION_ONLY, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, UNDERPOWERED
from memqual.host.judge.results import MetricEntry, Results, variant_label
from memqual.host.report.claim_lines import (
    clock_text,
    emulated_line,
    evidence_class,
    measured_text,
    note_line,
    published_text,
    ran_on_line,
    short_qualifier,
)

if TYPE_CHECKING:
    from rich.console import Console

RICH_STYLES = {
    REPRODUCED: "bold green",
    DIRECTION_ONLY: "bold yellow",
    NOT_REPRODUCED: "bold red",
    UNDERPOWERED: "bold magenta",
    NOT_MEASURABLE: "dim",
}


def _mean_stdev(samples: Sequence[float]) -> str:
    s = descriptive.summarize(samples)
    return f"{num(s.mean)} ({num(s.stdev)})"


def kernbench_tables(results: Results | Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per scenario (and settings) a table shaped like seed 002's kernbench
    table: a row per metric, a column per variant, cells "mean (stdev)"."""
    groups: dict[tuple[str, str], dict[str, dict[str, MetricEntry]]] = collections.defaultdict(dict)
    for m in Results.from_json(results).metrics:
        settings = json.dumps(m.settings or {}, sort_keys=True)
        groups[(m.scenario, settings)].setdefault(m.metric, {})[variant_label(m.variant or {})] = m
    tables = []
    for (scenario, settings), by_metric in sorted(groups.items()):
        columns = sorted({v for cells in by_metric.values() for v in cells})
        rows = []
        for metric, cells in sorted(by_metric.items()):
            unit = next(iter(cells.values())).unit
            scale, unit = time_scale(unit, [x for m in cells.values() for x in m.samples])
            rows.append(
                [f"{metric} ({unit})"]
                + [_mean_stdev([x * scale for x in cells[c].samples]) if c in cells else "" for c in columns]
            )
        title = scenario if settings == "{}" else f"{scenario}  {short_settings(settings)}"
        tables.append((title, columns, rows))
    return tables


def time_scale(unit: str, samples: Sequence[float]) -> tuple[float, str]:
    """Seconds shown in ms or us when they are that small (a column of
    4.696e-05 reads badly)."""
    if unit != "s" or not samples:
        return 1.0, unit
    typical = descriptive.median([abs(x) for x in samples])
    if 0 < typical < 1e-3:
        return 1e6, "us"
    if 0 < typical < 1.0:
        return 1e3, "ms"
    return 1.0, unit


def short_settings(settings_json: str) -> str:
    """Settings as k=v, long values cut (the full text is in results.json)."""
    settings = json.loads(settings_json)

    def short(value: Any) -> str:
        text = str(value)
        return text if len(text) <= 24 else text[:21] + "..."

    return ", ".join(f"{k}={short(v)}" for k, v in sorted(settings.items()))


def print_tables(results: Results | Mapping[str, Any], console: Console | None = None) -> None:
    """The verdicts and the kernbench-shaped tables, with rich."""
    from rich.markup import escape
    from rich.table import Table

    results = Results.from_json(results)
    console = console or printable.console()
    for title, columns, rows in kernbench_tables(results):
        # The title (scenario and settings) on its own line: as a table title
        # it would wrap to the table's width.
        console.print(
            f"\n[bold]{escape(title)}[/]  [dim]mean (stdev) of the repeats[/]", highlight=False, soft_wrap=True
        )
        table = Table()
        table.add_column("", style="bold", overflow="fold")
        for column in columns:
            table.add_column(escape(column), justify="right", overflow="fold")
        for row in rows:
            table.add_row(*[escape(cell) for cell in row])
        console.print(table)
    table = Table(title="Claims", title_justify="left")
    table.add_column("claim", no_wrap=True)
    table.add_column("evidence", no_wrap=True)
    table.add_column("clock", overflow="fold")
    table.add_column("verdict", no_wrap=True)
    table.add_column("measured B/A [95% CI]", justify="right", overflow="fold")
    table.add_column("published", justify="right")
    for c in results.claims:
        table.add_row(
            c.id,
            evidence_class(c.data),
            escape(clock_text(c.data)),
            f"[{RICH_STYLES.get(c.verdict, '')}]{c.verdict}[/]"
            + (f" [dim]({escape(short_qualifier(c.data))})[/]" if short_qualifier(c.data) else ""),
            escape(measured_text(c.data)),
            escape(published_text(c.data)),
        )
    console.print(table)
    # The reasons are sentences: print them below the table, not squeezed
    # into a column; each after the host, class and clock of its evidence
    # (a host under test's label is too long for a column).
    for c in results.claims:
        wrap = not console.is_terminal
        console.print(f"[bold]{c.id}[/] {escape(ran_on_line(c.data))}", highlight=False, soft_wrap=wrap)
        if emulated_line(c.data):
            console.print(f"  [yellow]{escape(emulated_line(c.data))}[/]", highlight=False, soft_wrap=wrap)
        console.print(f"  {escape(c.reason)}", highlight=False, soft_wrap=wrap)
        if note_line(c.data):
            console.print(f"  [dim]{escape(note_line(c.data))}[/]", highlight=False, soft_wrap=wrap)

"""What a run says to people: the terminal tables and report.html with its
plots, both from a results.json (host/results.py has the schema, its reader
and writer, and builds it from the verdicts and records).  The page is
templates/report.html.j2 over a ``ReportPage``; host/html.py has the
badges, plot embedding and environment line it shares with the other
pages.  A subject's own section comes from the registry of report sections
(``subject_sections``), not from importing the subject."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from markupsafe import Markup

from memqual.host import pages, stats
from memqual.host.claims import DIRECTION_ONLY, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, UNDERPOWERED, format_ratio
from memqual.host.html import (
    VERDICT_COLOURS,
    Badge,
    Count,
    EnvironmentLine,
    Plot,
    badge,
    counts,
    environment_line,
    num,
    png,
    pyplot,
)
from memqual.host.paths import write_private_atomic
from memqual.host.results import Results, variant_label

_RICH_STYLES = {
    REPRODUCED: "bold green",
    DIRECTION_ONLY: "bold yellow",
    NOT_REPRODUCED: "bold red",
    UNDERPOWERED: "bold magenta",
    NOT_MEASURABLE: "dim",
}


# ------------------------------------------------------------- terminal


def _mean_stdev(samples: Sequence[float]) -> str:
    s = stats.summarize(samples)
    return f"{num(s.mean)} ({num(s.stdev)})"


def kernbench_tables(results: Results | Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per scenario (and settings) a table shaped like seed 002's kernbench
    table: a row per metric, a column per variant, cells "mean (stdev)"."""
    groups: dict[tuple[str, str], dict[str, dict[str, Mapping[str, Any]]]] = collections.defaultdict(dict)
    for m in results["metrics"]:
        settings = json.dumps(m.get("settings") or {}, sort_keys=True)
        groups[(m["scenario"], settings)].setdefault(m["metric"], {})[variant_label(m.get("variant") or {})] = m
    tables = []
    for (scenario, settings), by_metric in sorted(groups.items()):
        columns = sorted({v for cells in by_metric.values() for v in cells})
        rows = []
        for metric, cells in sorted(by_metric.items()):
            unit = next(iter(cells.values()))["unit"]
            scale, unit = _time_scale(unit, [x for m in cells.values() for x in m["samples"]])
            rows.append(
                [f"{metric} ({unit})"]
                + [_mean_stdev([x * scale for x in cells[c]["samples"]]) if c in cells else "" for c in columns]
            )
        title = scenario if settings == "{}" else f"{scenario}  {_short_settings(settings)}"
        tables.append((title, columns, rows))
    return tables


def _time_scale(unit: str, samples: Sequence[float]) -> tuple[float, str]:
    """Seconds shown in ms or us when they are that small (a column of
    4.696e-05 reads badly)."""
    if unit != "s" or not samples:
        return 1.0, unit
    typical = stats.median([abs(x) for x in samples])
    if 0 < typical < 1e-3:
        return 1e6, "us"
    if 0 < typical < 1.0:
        return 1e3, "ms"
    return 1.0, unit


def _short_settings(settings_json: str) -> str:
    """Settings as k=v, long values cut (the full text is in results.json)."""
    settings = json.loads(settings_json)

    def short(value: Any) -> str:
        text = str(value)
        return text if len(text) <= 24 else text[:21] + "..."

    return ", ".join(f"{k}={short(v)}" for k, v in sorted(settings.items()))


def _measured_text(c: Mapping[str, Any]) -> str:
    if c.get("measured") is None:
        return "-"
    text = f"{format_ratio(c['measured'])}x"
    if c.get("ci") and c["ci"][0] is not None and c["ci"][0] != c["ci"][1]:
        # A model's spread is the range over real layouts, not a CI.
        lo, hi = format_ratio(c["ci"][0]), format_ratio(c["ci"][1])
        text += f" (layouts {lo}-{hi})" if c.get("computed") else f" [{lo}, {hi}]"
    return text


def evidence_class(c: Mapping[str, Any]) -> str:
    return str((c.get("evidence") or {}).get("class") or NOT_MEASURABLE)


def evidence_line(c: Mapping[str, Any]) -> str:
    """The first line of a claim's card: the class of its evidence and what
    it is."""
    ev = c.get("evidence") or {}
    kind = evidence_class(c)
    if kind == NOT_MEASURABLE:
        return f"Evidence: not measurable. Would measure it: {ev.get('would_measure') or c.get('reason', '')}"
    return f"Evidence: {kind}. {ev.get('instead', '')}"


# A side's published figure in another unit than the axis it is drawn on.
_UNIT_SCALE = {("ms", "s"): 1e-3, ("us", "s"): 1e-6, ("s", "ms"): 1e3, ("ns", "us"): 1e-3, ("us", "ns"): 1e3}


def published_on_axis(side: Mapping[str, Any], axis_unit: str) -> float | None:
    """A side's published figure converted to the unit of the axis it is
    plotted on (the seed's 1237 ms is 1.237 on an axis in seconds); None when
    there is none, or its unit does not convert."""
    value = side.get("published")
    if value is None:
        return None
    unit = side.get("published_unit") or axis_unit
    if unit == axis_unit:
        return float(value)
    scale = _UNIT_SCALE.get((unit, axis_unit))
    return None if scale is None else float(value) * scale


def qualifier_line(c: Mapping[str, Any]) -> str:
    """What the verdict does not speak for (another accelerator), or ''."""
    q = c.get("qualifier") or ""
    return f"This verdict holds {q}" if q else ""


def ceiling_line(c: Mapping[str, Any]) -> str:
    """The measured mechanism's own bound on B / A, and whether the
    published magnitude was within it, or ''."""
    ceiling = c.get("ceiling") or {}
    if not ceiling:
        return ""
    text = (
        f"Bound: {ceiling.get('label') or 'the mechanism'} on B / A in this run is {num(ceiling['value'])}x "
        f"(units {num(ceiling['low'])}-{num(ceiling['high'])}: {ceiling.get('formula', '')})"
    )
    limit = ceiling.get("limit_any_workload")
    if limit is not None:
        text += f"; whatever the workload at most {num(limit)}x ({ceiling.get('limit_source', '')})"
    expected, tol = c.get("expected"), c.get("tolerance") or 0.0
    if expected is not None:
        band = expected * (1 - tol)
        if ceiling["value"] < band:
            text += (
                f". The published {num(expected)}x (band from {num(band)}x) is out of its reach by design, "
                "not a near miss"
            )
        else:
            text += f". The published {num(expected)}x (band from {num(band)}x) is within its reach"
    return text + "."


def _published_text(c: Mapping[str, Any]) -> str:
    if c.get("expected") is not None:
        return f"{num(c['expected'])}x"
    if c.get("source") == "none":
        figures = [p for p in c.get("published") or [] if p.get("value") is not None]
        return f"{num(figures[0]['value'])}{figures[0].get('unit', '')}" if figures else "-"
    # The seed asserts a direction only.
    return {"greater": "> 1", "less": "< 1", "at_least": ">= 1"}.get(c.get("direction") or "", "-")


def print_tables(results: Results | Mapping[str, Any], console: Any = None) -> None:
    """The verdicts and the kernbench-shaped tables, with rich."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
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
    table.add_column("verdict", no_wrap=True)
    table.add_column("measured B/A [95% CI]", justify="right", overflow="fold")
    table.add_column("published", justify="right")
    for c in results["claims"]:
        table.add_row(
            c["id"],
            evidence_class(c),
            f"[{_RICH_STYLES.get(c['verdict'], '')}]{c['verdict']}[/]",
            escape(_measured_text(c)),
            escape(_published_text(c)),
        )
    console.print(table)
    # The reasons are sentences: print them below the table, not squeezed
    # into a column.
    for c in results["claims"]:
        console.print(
            f"[bold]{c['id']}[/] ({evidence_class(c)}): {escape(c['reason'])}",
            highlight=False,
            soft_wrap=not console.is_terminal,
        )


# ------------------------------------------------------------------ plots


_A_COLOUR, _B_COLOUR, _PUB_COLOUR = "#2563eb", "#ea580c", "#111827"


def claim_plot(c: Mapping[str, Any]) -> str | None:
    """Left: A's and B's values (every repeat, the median as a bar) with the
    published figures; right: B / A with its CI against the published ratio
    and its tolerance band.  None when nothing was measured."""
    if c.get("measured") is None or not c["samples"]["a"] or not c["samples"]["b"]:
        return None
    plt = pyplot()
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.6, 2.7), gridspec_kw={"width_ratios": [1.25, 1]})
    sides = [("a", _A_COLOUR), ("b", _B_COLOUR)]
    rng = np.random.default_rng(0)  # jitter only
    for x, (side, colour) in enumerate(sides):
        samples = c["samples"][side]
        med = float(np.median(samples))
        ax1.bar(x, med, width=0.55, color=colour, alpha=0.25, edgecolor=colour)
        jitter = rng.uniform(-0.12, 0.12, len(samples)) if len(samples) > 1 else [0.0]
        ax1.scatter(x + np.asarray(jitter), samples, s=14, color=colour, zorder=3, label=None)
        side_json = c.get(side) or {}
        pub = published_on_axis(side_json, side_json.get("unit", ""))
        if pub is not None:
            ax1.scatter([x + 0.38], [pub], marker="D", s=34, facecolor="white", edgecolor=_PUB_COLOUR, zorder=4)
            shown = f"{num(side_json['published'])} {side_json.get('published_unit') or side_json.get('unit', '')}"
            ax1.annotate(
                f"published {shown.strip()}", (x + 0.38, pub), xytext=(4, 4), textcoords="offset points", fontsize=7
            )
    ax1.set_xticks([0, 1], [(c.get("a") or {}).get("label", "A"), (c.get("b") or {}).get("label", "B")])
    unit = (c.get("a") or {}).get("unit", "")
    ax1.set_ylabel(unit)
    ax1.set_title(
        "A and B" + (" (a model: one point per real layout)" if c.get("computed") else " (every repeat, bar = median)"),
        fontsize=9,
    )
    ax1.set_ylim(bottom=0)

    ratio = c["measured"]
    ci = c.get("ci")
    expected, tol = c.get("expected"), c.get("tolerance") or 0.0
    ax2.axhline(1.0, color="#9ca3af", linestyle="--", linewidth=1)
    ax2.text(1.45, 1.0, "no change", va="bottom", ha="right", fontsize=7, color="#6b7280")
    ceiling = c.get("ceiling") or {}
    top = max(
        v
        for v in [
            ratio,
            1.0,
            (ci[1] if ci and ci[1] is not None else 0),
            (expected or 0) * (1 + tol),
            ceiling.get("limit_any_workload") or 0,
        ]
        if v is not None
    )
    top *= 1.18
    if ceiling:
        # The measured mechanism cannot pass its own ceiling: a line, so a
        # band above it reads as out of reach, not as a near miss.
        ax2.axhline(ceiling["value"], color="#b91c1c", linestyle=":", linewidth=1.4)
        ax2.text(
            -0.45, ceiling["value"], f"ceiling here {num(ceiling['value'])}x", va="top", fontsize=7, color="#b91c1c"
        )
        if ceiling.get("limit_any_workload") is not None:
            ax2.axhline(ceiling["limit_any_workload"], color="#b91c1c", linestyle="-.", linewidth=0.9)
            ax2.text(
                -0.45,
                ceiling["limit_any_workload"],
                f"any workload {num(ceiling['limit_any_workload'])}x",
                va="bottom",
                fontsize=7,
                color="#b91c1c",
            )
    if expected is not None:
        ax2.axhspan(expected * (1 - tol), expected * (1 + tol), color="#d1fae5", alpha=0.8, zorder=0)
        ax2.scatter([1], [expected], marker="D", s=40, facecolor="white", edgecolor=_PUB_COLOUR, zorder=4)
        ax2.annotate(
            f"published {num(expected)}x ±{tol:.0%}",
            (1, expected),
            xytext=(8, -3),
            textcoords="offset points",
            fontsize=7,
        )
        right_label = "published"
    else:
        # The seed asserts a direction only: shade the side it asserts.
        direction = c.get("direction")
        low, high = {"greater": (1.0, top), "less": (0.0, 1.0), "at_least": (1.0 - tol, top)}.get(
            direction or "", (1.0, top)
        )
        ax2.axhspan(low, high, color="#d1fae5", alpha=0.6, zorder=0)
        ax2.text(
            1,
            (low + high) / 2,
            {"less": "asserted: B / A < 1"}.get(
                direction or "", "asserted: B / A >= 1" if direction == "at_least" else "asserted: B / A > 1"
            ),
            ha="center",
            fontsize=8,
            color="#065f46",
        )
        right_label = "seed asserts"
    colour = VERDICT_COLOURS.get(c["verdict"], _PUB_COLOUR)
    if ci and ci[0] is not None and ci[1] is not None:
        ax2.errorbar(
            [0], [ratio], yerr=[[ratio - ci[0]], [ci[1] - ratio]], fmt="o", color=colour, capsize=5, markersize=6
        )
    else:
        ax2.scatter([0], [ratio], color=colour, s=36, zorder=3)
    ax2.annotate(f"{num(ratio)}x", (0, ratio), xytext=(8, -3), textcoords="offset points", fontsize=8, color=colour)
    ax2.set_xticks([0, 1], ["measured" if not c.get("computed") else "model", right_label])
    ax2.set_xlim(-0.5, 1.5)
    ax2.set_ylim(0, top)
    ax2.set_ylabel("B / A (x)")
    ax2.set_title("B / A" + (" with 95% CI" if ci and ci[0] != ci[1] else ""), fontsize=9)
    fig.tight_layout()
    return png(fig)


def distribution_plot(metric_name: str, unit: str, entries: Sequence[Mapping[str, Any]]) -> str:
    """The repeats of one metric, a box and the points per variant."""
    plt = pyplot()
    import numpy as np

    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    labels = [variant_label(e.get("variant") or {}) for e in entries]
    scale, unit = _time_scale(unit, [x for e in entries for x in e["samples"]])
    data = [[x * scale for x in e["samples"]] for e in entries]
    ax.boxplot(data, widths=0.45, showfliers=False, medianprops={"color": _PUB_COLOUR})
    rng = np.random.default_rng(0)
    palette = [_A_COLOUR, _B_COLOUR, "#059669", "#7c3aed", "#db2777"]
    for i, samples in enumerate(data, start=1):
        jitter = rng.uniform(-0.1, 0.1, len(samples))
        ax.scatter(i + jitter, samples, s=12, color=palette[(i - 1) % len(palette)], zorder=3)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=0 if len(labels) < 4 else 20)
    ax.set_ylabel(unit)
    ax.set_title(metric_name, fontsize=9)
    fig.tight_layout()
    return png(fig)


# ------------------------------------------------------------------- html


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """A claim in the table at the top."""

    claim: str
    evidence: str
    verdict: Badge
    measured: str
    published: str


@dataclasses.dataclass(frozen=True)
class LayoutRow:
    """A real guest layout a memslot model ran on."""

    config: str
    slots: int
    a: str
    b: str
    ratio: str
    at_nic: str | None  # "A, B, B / A" at the NIC BAR; None: not on this path
    ran_2011: bool


@dataclasses.dataclass(frozen=True)
class LayoutsTable:
    a_label: str
    b_label: str
    nic: bool  # a column for the NIC BAR path
    rows: tuple[LayoutRow, ...]


@dataclasses.dataclass(frozen=True)
class BesideRow:
    """A figure shown beside the evidence, which does not decide the verdict."""

    label: str
    variant: str
    median: str
    unit: str
    low: str
    high: str
    replicates: int


@dataclasses.dataclass(frozen=True)
class TodayRowView:
    """One plugged state of a guest of today: its slots, the nodes a miss
    examines in each structure, and /dev/kvm's miss cost at its count."""

    state: str
    slots: int
    device_slots: int
    nodes: tuple[str, ...]  # one per structure, in the table's order
    kvm: str  # "median ns (range over VMs, n VMs)", or "" when not measured


@dataclasses.dataclass(frozen=True)
class TodayTable:
    label: str
    structures: tuple[str, ...]
    rows: tuple[TodayRowView, ...]


@dataclasses.dataclass(frozen=True)
class PublishedRow:
    what: str
    value: str


@dataclasses.dataclass(frozen=True)
class ClaimCard:
    """A claim's card: what it said, what this run measured instead, the
    verdict and why."""

    id: str
    title: str
    seed: str
    verdict: Badge
    evidence: str
    qualifier: str
    ceiling: str
    claimed: str
    instead: str
    inputs: tuple[str, ...]
    would_measure: str  # shown only when nothing here measures the claim
    quote: str
    reason: str
    layouts: LayoutsTable | None
    beside: tuple[BesideRow, ...]
    today: TodayTable | None
    published: tuple[PublishedRow, ...]
    plot: Plot | None


@dataclasses.dataclass(frozen=True)
class MeanTable:
    """A kernbench-shaped table: a row per metric, a column per variant."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class SpreadRow:
    """A metric's location and spread, in its one unit."""

    scenario: str
    metric: str
    unit: str
    better: str
    variant: str
    settings: str
    n: int
    median: str
    iqr: str
    mad: str
    cv: str


@dataclasses.dataclass(frozen=True)
class EnvironmentRow:
    key: str
    value: str | None  # None: not recorded
    source: str  # where the value came from, when not the records


@dataclasses.dataclass(frozen=True)
class TestRow:
    id: str
    status: str
    time: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ReportPage:
    """Everything report.html shows, in its order."""

    created: str
    version: str
    profile: str
    label: str
    avocado: str
    environment_line: EnvironmentLine
    counts: tuple[Count, ...]
    summary: tuple[SummaryRow, ...]
    cards: tuple[ClaimCard, ...]
    has_metrics: bool
    means: tuple[MeanTable, ...]
    spread: tuple[SpreadRow, ...]
    distributions: tuple[Plot, ...]
    sections: tuple[Markup, ...]  # the subjects' own sections, rendered by their templates
    environment: tuple[EnvironmentRow, ...]
    tests: tuple[TestRow, ...]


def _env_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _published_rows(c: Mapping[str, Any]) -> tuple[PublishedRow, ...]:
    rows = []
    for p in c.get("published") or []:
        value = "" if p.get("value") is None else f"{p['value']} {p.get('unit', '')}"
        if p.get("stdev") is not None:
            value += f" (stdev {p['stdev']})"
        if p.get("note"):
            value += f" · {p['note']}"
        rows.append(PublishedRow(str(p.get("what", "")), value.strip()))
    return tuple(rows)


def claim_card(c: Mapping[str, Any]) -> ClaimCard:
    ev = c.get("evidence") or {}
    image = claim_plot(c)
    return ClaimCard(
        id=str(c["id"]),
        title=str(c.get("title", c["id"])),
        seed=str(c.get("seed", "")),
        verdict=badge(c["verdict"]),
        evidence=evidence_line(c),
        qualifier=qualifier_line(c),
        ceiling=ceiling_line(c),
        claimed=str(ev.get("claimed", "")),
        instead=str(ev.get("instead", "")),
        inputs=tuple(str(i) for i in ev.get("inputs") or []),
        would_measure=str(ev.get("would_measure") or "") if evidence_class(c) == NOT_MEASURABLE else "",
        quote=str(c.get("quote") or ""),
        reason=str(c["reason"]),
        layouts=_layouts_table(c),
        beside=tuple(
            BesideRow(
                str(r["label"]),
                variant_label(r.get("variant") or {}),
                num(r["median"]),
                str(r["unit"]),
                num(r["low"]),
                num(r["high"]),
                r["replicates"],
            )
            for r in c.get("beside") or []
        ),
        today=_today_table(c),
        published=_published_rows(c),
        plot=Plot(f"{c['id']} measured against published", image) if image else None,
    )


def _today_table(c: Mapping[str, Any]) -> TodayTable | None:
    today = c.get("today")
    if not today or not today.get("rows"):
        return None
    structures = tuple(str(s) for s in today["structures"])
    rows = []
    for r in today["rows"]:
        nodes = {n["structure"]: n for n in r["nodes"]}
        kvm = r.get("kvm")
        rows.append(
            TodayRowView(
                state=f"step {r['step']}: {r['plugged_mib']} MiB plugged",
                slots=int(r["slots"]),
                device_slots=int(r["device_slots"]),
                nodes=tuple(
                    f"{num(nodes[s]['mean'])} (worst {nodes[s]['worst']})" if s in nodes else "" for s in structures
                ),
                kvm=(
                    f"{num(kvm['median_ns'])} ns ({num(kvm['low_ns'])}-{num(kvm['high_ns'])}, {kvm['vms']} VMs)"
                    if kvm
                    else ""
                ),
            )
        )
    return TodayTable(label=str(today["label"]), structures=structures, rows=tuple(rows))


def _layouts_table(c: Mapping[str, Any]) -> LayoutsTable | None:
    rows = c.get("layouts") or []
    if not rows:
        return None
    return LayoutsTable(
        a_label=str((c.get("a") or {}).get("label", "A")),
        b_label=str((c.get("b") or {}).get("label", "B")),
        nic=any(r.get("nic_ratio") is not None for r in rows),
        rows=tuple(
            LayoutRow(
                config=str(r["config"]),
                slots=r["slots"],
                a=num(r["a"]),
                b=num(r["b"]),
                ratio=f"{format_ratio(r['ratio'])}x",
                at_nic=(
                    f"{num(r['nic_a'])}, {num(r['nic_b'])}, {format_ratio(r['nic_ratio'])}x"
                    if r.get("nic_ratio") is not None
                    else None
                ),
                ran_2011=r.get("runs_2011", True),
            )
            for r in rows
        ),
    )


def _spread_rows(metrics: Sequence[Mapping[str, Any]]) -> tuple[SpreadRow, ...]:
    # One unit per metric, whatever its variant or settings.
    scales: dict[tuple[str, str], tuple[float, str]] = {}
    for key in {(m["scenario"], m["metric"]) for m in metrics}:
        same = [m for m in metrics if (m["scenario"], m["metric"]) == key]
        scales[key] = _time_scale(same[0]["unit"], [x for m in same for x in m["samples"]])
    rows = []
    for m in metrics:
        s = m["summary"]
        scale, unit = scales[(m["scenario"], m["metric"])]
        rows.append(
            SpreadRow(
                scenario=str(m["scenario"]),
                metric=str(m["metric"]),
                unit=unit,
                better=str(m["better"]),
                variant=variant_label(m.get("variant") or {}),
                settings=_short_settings(json.dumps(m.get("settings") or {})),
                n=s["n"],
                median=num(s["median"] * scale),
                iqr=num(s["iqr"] * scale),
                mad=num(s["mad"] * scale),
                cv="n/a" if s["cv"] is None else f"{100 * s['cv']:.1f} %",
            )
        )
    return tuple(rows)


def _distributions(metrics: Sequence[Mapping[str, Any]]) -> tuple[Plot, ...]:
    grouped: dict[tuple[str, str, str], list[Mapping[str, Any]]] = collections.defaultdict(list)
    for m in metrics:
        grouped[(m["scenario"], m["metric"], json.dumps(m.get("settings") or {}, sort_keys=True))].append(m)
    # A single repeat has no distribution to show.
    plotted = {k: v for k, v in grouped.items() if any(len(e["samples"]) > 1 for e in v)}
    plots = []
    for (scenario, metric, settings), entries in sorted(plotted.items()):
        subtitle = _short_settings(settings)
        image = distribution_plot(
            f"{scenario}: {metric}" + (f"\n{subtitle}" if subtitle else ""), entries[0]["unit"], entries
        )
        plots.append(Plot(f"{scenario} {metric}", image))
    return tuple(plots)


# The registry of report sections: a subject adds its own section to
# report.html with an entry point of this group in pyproject.toml, naming a
# function from results.json's metric entries to markup (empty when the run
# has nothing of that subject).
SECTIONS_GROUP = "memqual.report_sections"
Section = Callable[[Sequence[Any]], Markup]


def registered_sections() -> tuple[tuple[str, Section], ...]:
    """The registered report sections, by name."""
    return tuple((ep.name, ep.load()) for ep in sorted(entry_points(group=SECTIONS_GROUP), key=lambda ep: ep.name))


def subject_sections(metrics: Sequence[Any]) -> tuple[Markup, ...]:
    """Each registered subject's section of report.html, in name order."""
    return tuple(section(metrics) for _, section in registered_sections())


def report_page(results: Results | Mapping[str, Any]) -> ReportPage:
    """report.html's view of a results.json."""
    claims = results["claims"]
    run = results.get("run") or {}
    metrics = results["metrics"]
    env = results.get("environment") or {}
    sources = env.get("environment_sources") or {}
    sections = subject_sections(metrics) if metrics else ()
    return ReportPage(
        created=str(results.get("created", "")),
        version=str(results.get("memqual_version", "")),
        profile=str(run.get("profile") or ""),
        label=str(run.get("label") or ""),
        avocado=str((run.get("avocado") or {}).get("summary") or ""),
        environment_line=environment_line(env),
        counts=counts(
            (c["verdict"] for c in claims), (REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, UNDERPOWERED, NOT_MEASURABLE)
        ),
        summary=tuple(
            SummaryRow(str(c["id"]), evidence_class(c), badge(c["verdict"]), _measured_text(c), _published_text(c))
            for c in claims
        ),
        cards=tuple(claim_card(c) for c in claims),
        has_metrics=bool(metrics),
        means=tuple(
            MeanTable(title, tuple(columns), tuple(tuple(row) for row in rows))
            for title, columns, rows in (kernbench_tables(results) if metrics else [])
        ),
        spread=_spread_rows(metrics),
        distributions=_distributions(metrics),
        sections=sections,
        environment=tuple(
            EnvironmentRow(
                str(key),
                _env_value(value),
                str(sources.get(key, "")) if sources.get(key, "") not in ("", "records") else "",
            )
            for key, value in env.items()
            if key != "environment_sources"
        ),
        tests=tuple(
            TestRow(
                str(t.get("id", "")),
                str(t.get("status", "")),
                "" if t.get("time") is None else f"{t['time']:.1f} s",
                str(t.get("reason") or ""),
            )
            for t in run.get("tests") or []
        ),
    )


def render_html(results: Results | Mapping[str, Any]) -> str:
    return pages.render("report.html.j2", page=report_page(results))


def write_html(results: Results | Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, render_html(results).encode(), 0o644)
    return path

"""What a run says to people: the terminal tables and report.html with its
plots, both from a results.json (host/results.py has the schema, its reader
and writer, and builds it from the verdicts and records; host/html.py the
style sheet, escaping, badges and plot embedding shared with
comparison.html)."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memqual.host import stats
from memqual.host.claims import DIRECTION_ONLY, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, UNDERPOWERED, format_ratio
from memqual.host.html import CSS, VERDICT_COLOURS, badge, environment_line, esc, num, png, pyplot
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
        pub = (c.get(side) or {}).get("published")
        if pub is not None:
            ax1.scatter([x + 0.38], [pub], marker="D", s=34, facecolor="white", edgecolor=_PUB_COLOUR, zorder=4)
            ax1.annotate(
                f"published {num(pub)}", (x + 0.38, pub), xytext=(4, 4), textcoords="offset points", fontsize=7
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
    top = max(
        v
        for v in [ratio, 1.0, (ci[1] if ci and ci[1] is not None else 0), (expected or 0) * (1 + tol)]
        if v is not None
    )
    top *= 1.18
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


def _env_value(value: Any) -> str:
    if value is None:
        return "<span class='small'>not recorded</span>"
    if isinstance(value, dict):
        return esc(", ".join(f"{k}={v}" for k, v in value.items()))
    return esc(value)


def render_html(results: Results | Mapping[str, Any]) -> str:
    claims = results["claims"]
    counts = collections.Counter(c["verdict"] for c in claims)
    run = results.get("run") or {}
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>memqual report {esc(results.get('created', ''))}</title><style>{CSS}</style></head><body><main>",
        "<h1>memqual: do today's systems reproduce the published claims?</h1>",
        f"<p class='sub'>{esc(results.get('created', ''))} · memqual {esc(results.get('memqual_version', ''))}"
        + (f" · profile {esc(run['profile'])}" if run.get("profile") else "")
        + (f" · {esc(run['label'])}" if run.get("label") else "")
        + (f" · avocado: {esc(run['avocado']['summary'])}" if (run.get("avocado") or {}).get("summary") else "")
        + "</p>",
        environment_line(results.get("environment") or {}),
        "<div class='badges'>",
    ]
    for verdict in (REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, UNDERPOWERED, NOT_MEASURABLE):
        parts.append(
            f"<div class='count'><b style='color:{VERDICT_COLOURS[verdict]}'>{counts.get(verdict, 0)}</b>"
            f"{esc(verdict)}</div>"
        )
    parts.append("</div>")

    # The verdict at a glance.
    parts.append(
        "<table class='summary'><tr><th>claim</th><th>evidence</th><th>verdict</th>"
        "<th>evidence B/A [95% CI]</th><th>published</th></tr>"
    )
    for c in claims:
        parts.append(
            f"<tr><td><a href='#{esc(c['id'])}'>{esc(c['id'])}</a></td><td>{esc(evidence_class(c))}</td>"
            f"<td>{badge(c['verdict'])}</td>"
            f"<td class='num'>{esc(_measured_text(c))}</td><td class='num'>{esc(_published_text(c))}</td></tr>"
        )
    parts.append("</table>")

    parts.append("<h2>Claims</h2>")
    for c in claims:
        parts.append(f"<section class='card' id='{esc(c['id'])}'><header><div><h3>{esc(c.get('title', c['id']))}</h3>")
        parts.append(
            f"<div class='cid'>{esc(c['id'])} · seed {esc(c.get('seed', ''))}</div></div>{badge(c['verdict'])}</header>"
        )
        parts.append(f"<p class='evidence'><b>{esc(evidence_line(c))}</b></p>")
        parts.append(_claim_against_evidence(c))
        if c.get("quote"):
            parts.append(f"<blockquote>{esc(c['quote'])}</blockquote>")
        parts.append(f"<div class='reason'><b>Why:</b> {esc(c['reason'])}</div>")
        parts.append(_layouts_table(c))
        parts.append(_beside_table(c))
        published = c.get("published") or []
        if published:
            parts.append("<table><tr><th>published figure</th><th>value</th></tr>")
            for p in published:
                value = "" if p.get("value") is None else f"{p['value']} {p.get('unit', '')}"
                if p.get("stdev") is not None:
                    value += f" (stdev {p['stdev']})"
                if p.get("note"):
                    value += f" · {p['note']}"
                parts.append(f"<tr><td>{esc(p.get('what', ''))}</td><td class='num'>{esc(value.strip())}</td></tr>")
            parts.append("</table>")
        image = claim_plot(c)
        if image:
            parts.append(f"<img alt='{esc(c['id'])} measured against published' src='data:image/png;base64,{image}'>")
        parts.append("</section>")

    metrics = results["metrics"]
    if metrics:
        parts.append("<h2>Measurements</h2>")
        for title, columns, rows in kernbench_tables(results):
            parts.append(
                f"<h3>{esc(title)}</h3><div class='small'>mean (stdev) of the repeats</div><table><tr><th></th>"
            )
            parts.extend(f"<th>{esc(col)}</th>" for col in columns)
            parts.append("</tr>")
            for row in rows:
                parts.append(
                    f"<tr><td>{esc(row[0])}</td>" + "".join(f"<td class='num'>{esc(x)}</td>" for x in row[1:]) + "</tr>"
                )
            parts.append("</table>")
        parts.append(
            "<h3>Location and spread</h3><table><tr><th>metric</th><th>variant</th><th>settings</th><th>n</th>"
            "<th>median</th><th>IQR</th><th>MAD</th><th>CV</th></tr>"
        )
        # One unit per metric, whatever its variant or settings.
        scales: dict[tuple[str, str], tuple[float, str]] = {}
        for key in {(m["scenario"], m["metric"]) for m in metrics}:
            same = [m for m in metrics if (m["scenario"], m["metric"]) == key]
            scales[key] = _time_scale(same[0]["unit"], [x for m in same for x in m["samples"]])
        for m in metrics:
            s = m["summary"]
            scale, unit = scales[(m["scenario"], m["metric"])]
            cv_text = "n/a" if s["cv"] is None else f"{100 * s['cv']:.1f} %"
            parts.append(
                f"<tr><td>{esc(m['scenario'])} {esc(m['metric'])} ({esc(unit)}, {esc(m['better'])} is better)</td>"
                f"<td>{esc(variant_label(m.get('variant') or {}))}</td>"
                f"<td class='small'>{esc(_short_settings(json.dumps(m.get('settings') or {})))}</td>"
                f"<td class='num'>{s['n']}</td>"
                f"<td class='num'>{esc(num(s['median'] * scale))}</td><td class='num'>{esc(num(s['iqr'] * scale))}</td>"
                f"<td class='num'>{esc(num(s['mad'] * scale))}</td><td class='num'>{cv_text}</td></tr>"
            )
        parts.append("</table>")
        grouped: dict[tuple[str, str, str], list[Mapping[str, Any]]] = collections.defaultdict(list)
        for m in metrics:
            grouped[(m["scenario"], m["metric"], json.dumps(m.get("settings") or {}, sort_keys=True))].append(m)
        # A single repeat has no distribution to show.
        plotted = {k: v for k, v in grouped.items() if any(len(e["samples"]) > 1 for e in v)}
        if plotted:
            parts.append("<h2>Distributions of the repeats</h2><div class='grid'>")
            for (scenario, metric, settings), entries in sorted(plotted.items()):
                subtitle = _short_settings(settings)
                image = distribution_plot(
                    f"{scenario}: {metric}" + (f"\n{subtitle}" if subtitle else ""), entries[0]["unit"], entries
                )
                parts.append(f"<img alt='{esc(scenario)} {esc(metric)}' src='data:image/png;base64,{image}'>")
            parts.append("</div>")
        # A subject's own plot: the balloon's time against request size.
        from memqual.host.balloon import plot as balloon_plot

        parts.append(balloon_plot.section(metrics))

    parts.append("<h2>Environment</h2><table class='env'>")
    env = results.get("environment") or {}
    sources = env.get("environment_sources") or {}
    for key, value in env.items():
        if key == "environment_sources":
            continue
        src = sources.get(key, "")
        note = f" <span class='small'>({esc(src)})</span>" if src and src != "records" else ""
        parts.append(f"<tr><td>{esc(key)}</td><td>{_env_value(value)}{note}</td></tr>")
    parts.append("</table>")
    tests = run.get("tests") or []
    if tests:
        parts.append("<h2>Tests</h2><table><tr><th>test</th><th>status</th><th>time</th><th>reason</th></tr>")
        for t in tests:
            time_s = t.get("time")
            parts.append(
                f"<tr><td>{esc(t.get('id', ''))}</td><td>{esc(t.get('status', ''))}</td>"
                f"<td class='num'>{'' if time_s is None else f'{time_s:.1f} s'}</td>"
                f"<td>{esc(t.get('reason') or '')}</td></tr>"
            )
        parts.append("</table>")
    parts.append(
        "<p class='small'>Evidence: measured = the claimed mechanism measured here on a real system; successor = "
        "the mechanism upstream adopted instead, measured in place of one no kernel has; model = a model of code "
        "that runs nowhere today, with the source of every input; not measurable = no evidence here, with what "
        "would measure it. Measured ratios are medians of B over A with 95% two-stage bootstrap intervals over "
        "independent replicates (fresh guests or rounds); p-values come from a permutation test of the replicate "
        "medians. A model's figure has no sampling spread: it is given as the median and range over the real "
        "layouts it ran on. Verdicts: reproduced = direction holds and the magnitude is within tolerance of the "
        "published figure; direction only = the direction holds, the magnitude does not; not reproduced = the "
        "direction is not established; underpowered = measured on too few independent replicates to decide; "
        "not measurable = no evidence in this run (the reason says why).</p>"
    )
    parts.append("</main></body></html>")
    return "".join(parts)


def _claim_against_evidence(c: Mapping[str, Any]) -> str:
    """What the claim said and what was measured instead, side by side."""
    ev = c.get("evidence") or {}
    inputs = "".join(f"<li>{esc(i)}</li>" for i in ev.get("inputs") or [])
    right = esc(ev.get("instead", ""))
    if inputs:
        right += f"<ul class='small'>{inputs}</ul>"
    if ev.get("would_measure") and evidence_class(c) == NOT_MEASURABLE:
        right += f"<div class='small'><b>What would measure it:</b> {esc(ev['would_measure'])}</div>"
    return (
        "<table class='sidebyside'><tr><th>the claim measured</th><th>this run's evidence</th></tr>"
        f"<tr><td>{esc(ev.get('claimed', ''))}</td><td>{right}</td></tr></table>"
    )


def _layouts_table(c: Mapping[str, Any]) -> str:
    rows = c.get("layouts") or []
    if not rows:
        return ""
    a_label = (c.get("a") or {}).get("label", "A")
    b_label = (c.get("b") or {}).get("label", "B")
    nic = any(r.get("nic_ratio") is not None for r in rows)
    out = [
        f"<table><tr><th>real guest layout</th><th>slots</th><th>{esc(a_label)}</th>"
        f"<th>{esc(b_label)}</th><th>B / A</th>"
        + ("<th>at the NIC BAR: A, B, B / A</th>" if nic else "")
        + "<th>2011 host</th></tr>"
    ]
    for r in rows:
        runs = r.get("runs_2011", True)
        at_nic = ""
        if nic:
            at_nic = (
                f"<td class='num'>{num(r['nic_a'])}, {num(r['nic_b'])}, {format_ratio(r['nic_ratio'])}x</td>"
                if r.get("nic_ratio") is not None
                else "<td></td>"
            )
        out.append(
            f"<tr><td>{esc(r['config'])}</td><td class='num'>{r['slots']}</td><td class='num'>{num(r['a'])}</td>"
            f"<td class='num'>{num(r['b'])}</td><td class='num'>{format_ratio(r['ratio'])}x</td>{at_nic}"
            f"<td>{'ran' if runs else 'refused (more than 32 user slots): not counted'}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _beside_table(c: Mapping[str, Any]) -> str:
    rows = c.get("beside") or []
    if not rows:
        return ""
    out = [
        "<div class='small'>Shown beside the evidence (does not decide the verdict):</div>"
        "<table><tr><th>what</th><th>variant</th><th>median</th><th>95% CI (or range)</th><th>replicates</th></tr>"
    ]
    for r in rows:
        out.append(
            f"<tr><td>{esc(r['label'])}</td><td>{esc(variant_label(r.get('variant') or {}))}</td>"
            f"<td class='num'>{num(r['median'])} {esc(r['unit'])}</td>"
            f"<td class='num'>{num(r['low'])}-{num(r['high'])}</td><td class='num'>{r['replicates']}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def write_html(results: Results | Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, render_html(results).encode(), 0o644)
    return path

"""bisect.html: every probe's CI against the threshold band, for people.

Rendered from the state (bisect.json) alone, after every probe, so an
interrupted bisect leaves a page of what it knew."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memqual.host.html import CSS, GREY, ForestRow, esc, forest_png
from memqual.host.paths import write_private_atomic

COLOURS = {"good": "#15803d", "bad": "#b91c1c", "skip": "#7c3aed"}


def forest_plot(state: dict[str, Any]) -> str | None:
    """One row per kernel of the series, K1 at the top: the probe's ratio
    against K1 with its CI on a log axis, the threshold band shaded."""
    probes = {p["index"]: p for p in state["probes"]}
    if not probes:
        return None
    rows = []
    for index, kernel in enumerate(state["settings"]["kernels"]):
        label = f"K{index + 1} {kernel}"[:70]
        p = probes.get(index)
        if index == 0:
            rows.append(ForestRow(label, "#111827", 1.0, marker="s"))  # K1 itself: the reference
        elif p is None:
            rows.append(ForestRow(label, GREY, None))  # not probed (yet)
        else:
            e = p["evidence"]
            colour = COLOURS.get(p["verdict"], GREY)
            rows.append(ForestRow(label, colour, e.get("ratio"), e.get("ci_low"), e.get("ci_high")))
    threshold = state["settings"]["threshold"]
    return forest_png(
        rows, threshold, f"probe / K1 (pooled median ratio, 95% CI over replicates); shaded: within {threshold:.0%}"
    )


def render(state: dict[str, Any]) -> str:
    s = state["settings"]
    probes = {p["index"]: p for p in state["probes"]}
    rounds_of: dict[int, int] = {}
    for r in state["rounds"]:
        rounds_of[r["kernel"]] = rounds_of.get(r["kernel"], 0) + 1
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>memqual bisect: {esc(s['metric'])}</title><style>{CSS}</style></head><body><main>",
        f"<h1>memqual bisect: where did {esc(state.get('metric_key') or s['metric'])} move?</h1>",
        f"<p class='sub'>{len(s['kernels'])} kernels · threshold {s['threshold']:.0%} · budget "
        f"{s['budget_min']:g} min and at most {s['max_rounds']} rounds a probe · reference {esc(s['reference'])}"
        f" · at least {s['min_replicates']} replicates a side before a decision · started {esc(state['created'])}"
        f"{' · <b>interrupted</b>' if state.get('interrupted') else ''}</p>",
        f"<p><b>{esc(state['outcome']['text'])}</b></p>",
        "<p class='sub'>A probe is <b>good</b> when the 95% CI of its ratio to K1 (two-stage bootstrap over "
        "independent replicates, host/stats.py) lies wholly inside the shaded band, <b>bad</b> when it lies "
        "wholly beyond it on the side the last kernel moved to, and <b>skip</b>ped (as git bisect skip) when "
        "its budget ran out first.</p>",
    ]
    plot = forest_plot(state)
    if plot:
        parts.append(f"<img alt='forest plot of every probe' src='data:image/png;base64,{plot}'>")
    parts.append(
        "<table><tr><th>kernel</th><th>verdict</th><th>ratio to K1 [95% CI]</th><th>replicates K1+probe</th>"
        "<th>rounds (all jobs of this kernel)</th><th>minutes</th><th>reason</th></tr>"
    )
    for index, name in enumerate(s["kernels"]):
        p = probes.get(index)
        if index == 0:
            cells = ["reference", "1", "", str(rounds_of.get(0, 0)), "", ""]
        elif p is None:
            cells = ["not probed", "", "", str(rounds_of.get(index, 0)), "", ""]
        else:
            e = p["evidence"]
            ratio = "n/a" if e.get("ratio") is None else f"{e['ratio']:.3f}"
            ci = (
                ""
                if e.get("ci_low") is None or e.get("ci_high") is None
                else f" [{e['ci_low']:.3f}, {e['ci_high']:.3f}]"
            )
            colour = COLOURS.get(p["verdict"], "#6b7280")
            cells = [
                f"<b style='color:{colour}'>{esc(p['verdict'])}</b>",
                ratio + ci,
                f"{e['n_reference']}+{e['n_probe']}",
                str(rounds_of.get(index, 0)),
                f"{p['seconds'] / 60:.1f}",
                esc(p.get("reason") or ""),
            ]
        parts.append(f"<tr><td>K{index + 1} {esc(name)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    order = state.get("probe_order") or []
    if order:
        parts.append("<p class='sub'>probe order: " + " → ".join(f"K{i + 1}" for i in order) + "</p>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def write_page(state: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    write_private_atomic(path, render(state).encode(), 0o644)
    return path

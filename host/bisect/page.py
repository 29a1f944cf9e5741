"""bisect.html: every probe's decision against K1, and each step of it, for
people.

Rendered from the state (bisect.json) alone, after every step, so an
interrupted bisect leaves a page of what it knew."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memqual.host.html import CSS, GREY, VERDICT_COLOURS, ForestRow, esc, forest_png
from memqual.host.paths import write_private_atomic

# The search's marks; the decisions (slower, faster, equivalent,
# undecided) take compare's colours.
MARK_COLOURS = {"good": "#15803d", "bad": "#b91c1c", "skip": "#7c3aed"}


def _pill(verdict: str, text: str | None = None) -> str:
    """A decision as a pill in compare's colour (the style sheet's badge)."""
    colour = VERDICT_COLOURS.get(verdict, GREY)
    return f'<span class="badge" style="background:{colour}">{esc(text or verdict)}</span>'


def _decision(p: dict[str, Any]) -> str:
    return str(p.get("decision") or p["evidence"].get("verdict") or "undecided")


def forest_plot(state: dict[str, Any]) -> str | None:
    """One row per kernel of the series, K1 at the top: the probe's B/A
    against K1 at its last look with its 95 % CI on a log axis, coloured by
    its decision, the threshold band shaded."""
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
            colour = VERDICT_COLOURS.get(_decision(p), GREY)
            rows.append(ForestRow(label, colour, e.get("ratio"), e.get("ci_low"), e.get("ci_high")))
    threshold = state["settings"]["threshold"]
    return forest_png(rows, threshold, f"probe / K1 (B/A, 95% t-interval over blocks); shaded: within {threshold:.0%}")


def _ratio(e: dict[str, Any]) -> str:
    if e.get("ratio") is None:
        return "n/a"
    ci = "" if e.get("ci_low") is None or e.get("ci_high") is None else f" [{e['ci_low']:.3f}, {e['ci_high']:.3f}]"
    return f"{e['ratio']:.3f}{ci}"


def _units(e: dict[str, Any]) -> str:
    if e.get("paired") or e.get("n_blocks"):
        return str(e.get("look") or e.get("n_blocks"))
    return f"unpaired {e.get('n_reference', 0)}+{e.get('n_probe', 0)}"


def render(state: dict[str, Any]) -> str:
    s = state["settings"]
    probes = {p["index"]: p for p in state["probes"]}
    alpha = s.get("alpha", 0.05)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>memqual bisect: {esc(s['metric'])}</title><style>{CSS}</style></head><body><main>",
        f"<h1>memqual bisect: where did {esc(state.get('metric_key') or s['metric'])} move?</h1>",
        f"<p class='sub'>{len(s['kernels'])} kernels · threshold {s['threshold']:.0%} · alpha {alpha:g} a probe · "
        f"budget {s['budget_min']:g} min and at most {s['max_rounds']} blocks a probe · reference "
        f"{esc(s['reference'])} · started {esc(state['created'])}"
        f"{' · <b>interrupted</b>' if state.get('interrupted') else ''}</p>",
        f"<p><b>{esc(state['outcome']['text'])}</b></p>",
        "<p class='sub'>Each probe is decided as <code>memqual compare</code> decides a metric: a paired t-test on "
        "its blocks' log(B/A) (B the probe, A K1 in the same block, minutes apart) is <b>slower</b> or "
        "<b>faster</b> when significant and beyond the threshold; the two one-sided tests give <b>equivalent</b> "
        "when B/A lies within the threshold; otherwise <b>undecided</b>, with about how many blocks would decide "
        f"it. The probe is looked at after every block, look k of K = {s['max_rounds']} at its share "
        f"alpha ((k/K)<sup>2</sup> - ((k-1)/K)<sup>2</sup>) of alpha {alpha:g}, so the probe's chance of any "
        "wrong decision over its looks stays at most alpha. Equivalent is <b>good</b>, a change the way the last "
        "kernel changed is <b>bad</b>; the search moves on decided probes only, and one still undecided when its "
        "budget ends is <b>skip</b>ped (as git bisect skip).</p>",
    ]
    plot = forest_plot(state)
    if plot:
        parts.append(f"<img alt='forest plot of every probe' src='data:image/png;base64,{plot}'>")
    undecided = [p for p in probes.values() if _decision(p) == "undecided"]
    for p in sorted(undecided, key=lambda p: p["index"]):
        name = s["kernels"][p["index"]]
        parts.append(
            f"<p><b style='color:{VERDICT_COLOURS['undecided']}'>K{p['index'] + 1} {esc(name)} stayed undecided</b>: "
            f"{esc(p['evidence'].get('text') or 'undecided')}; {esc(p.get('reason') or '')}</p>"
        )
    parts.append(
        "<table><tr><th>kernel</th><th>decision</th><th>search</th><th>B/A [95% CI]</th><th>blocks</th>"
        "<th>alpha at the last look</th><th>minutes</th><th>note</th></tr>"
    )
    for index, name in enumerate(s["kernels"]):
        p = probes.get(index)
        if index == 0:
            cells = ["reference", "good", "1", "", "", "", ""]
        elif p is None:
            cells = ["not probed", "", "", "", "", "", ""]
        else:
            e = p["evidence"]
            mark = p["verdict"]
            cells = [
                _pill(_decision(p), e.get("text") or _decision(p)),
                f"<b style='color:{MARK_COLOURS.get(mark, GREY)}'>{esc(mark)}</b>",
                _ratio(e),
                _units(e),
                f"{e.get('alpha', 0.0):.2g}",
                f"{p['seconds'] / 60:.1f}",
                esc(p.get("reason") or ""),
            ]
        parts.append(f"<tr><td>K{index + 1} {esc(name)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    order = state.get("probe_order") or []
    if order:
        parts.append("<p class='sub'>probe order: " + " → ".join(f"K{i + 1}" for i in order) + "</p>")
    steps = [(i, look) for i in order if i in probes for look in probes[i].get("looks") or [] if look.get("step")]
    if steps:
        parts.append(
            "<h2>Every step</h2><p class='sub'>One step is one avocado job: one block of K1 and the probe. "
            "After it the probe is looked at with all its blocks so far.</p>"
            "<table><tr><th>probe</th><th>step</th><th>B/A [95% CI]</th><th>blocks</th><th>alpha of this look</th>"
            "<th>decision</th><th>elapsed (min)</th></tr>"
        )
        for index, look in steps:
            parts.append(
                f"<tr><td>K{index + 1}</td><td>{look['step']}</td><td>{_ratio(look)}</td><td>{_units(look)}</td>"
                f"<td>{look.get('alpha', 0.0):.2g}</td><td>{_pill(look['verdict'], look.get('text'))}</td>"
                f"<td>{look['seconds'] / 60:.1f}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


def write_page(state: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    write_private_atomic(path, render(state).encode(), 0o644)
    return path

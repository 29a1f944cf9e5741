"""comparison.html: run B against run A, for people.

``memqual compare A.json B.json --html FILE`` and a two-kernel ``memqual
run`` (OUTPUT/comparison.html) write it.  One self-contained page: where
each run's figures come from, how many metrics got faster or slower and how
many were equivalent or undecided, whether a negative control says the
host drifted, a forest plot of every ratio B/A with its confidence
interval against the threshold band, the table that ``memqual compare``
prints (replicates a side, raw and corrected p, TOST p), the metrics
found on one side only, the claims whose verdict moved and the environment
that differs.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memqual.host.comparison import (
    NOT_COMPARABLE,
    SLOWER,
    UNDECIDED,
    VERDICTS,
    RunComparison,
    short_labels,
    verdict_text,
)
from memqual.host.html import CSS, VERDICT_COLOURS, ForestRow, badge, environment_line, esc, forest_png, num
from memqual.host.paths import write_private_atomic
from memqual.host.results import Results


def forest_plot(result: RunComparison, labels: dict[str, str]) -> str | None:
    """Every metric's ratio B/A (better-is-right is not assumed: the colour
    says the verdict) with its CI, on a log axis, the threshold band shaded."""
    rows = [
        ForestRow(
            labels[m.key][:90],
            VERDICT_COLOURS[m.verdict],
            m.comparison.ratio,
            m.comparison.ci_low,
            m.comparison.ci_high,
        )
        for m in result.metrics
        if m.comparison.ratio and m.comparison.ratio > 0
    ]
    if not rows:
        return None
    return forest_png(
        rows, result.threshold, f"B / A (median ratio, 95% CI); shaded: within the {result.threshold:.0%} threshold"
    )


def render_comparison_html(
    result: RunComparison,
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    a_name: str = "A",
    b_name: str = "B",
) -> str:
    labels = short_labels(result.metrics)
    counts = collections.Counter(m.verdict for m in result.metrics)
    families = result.to_json()["families"]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>memqual: {esc(b_name)} against {esc(a_name)}</title><style>{CSS}</style></head><body><main>",
        f"<h1>memqual: is {esc(b_name)} faster or slower than {esc(a_name)}?</h1>",
        f"<p class='sub'>threshold {result.threshold:.0%} (smallest change of the median that counts) · "
        f"alpha {result.alpha:g} family-wise (t-test of log replicate medians, paired by block where both "
        f"name blocks; Holm over {families['primary']} primaries and "
        f"{families['control']} negative controls, Benjamini-Hochberg over "
        f"{families['exploratory']} exploratory at alpha/4) · "
        f"{len(result.only_in_a) + len(result.only_in_b)} on one side only</p>",
        f"<p class='sub'><b>{esc(a_name)}</b>: {esc(a.get('created', ''))}</p>",
        environment_line(a.get("environment") or {}),
        f"<p class='sub'><b>{esc(b_name)}</b>: {esc(b.get('created', ''))}</p>",
        environment_line(b.get("environment") or {}),
        "<div class='badges'>",
    ]
    for verdict in VERDICTS:
        parts.append(
            f"<div class='count'><b style='color:{VERDICT_COLOURS[verdict]}'>{counts.get(verdict, 0)}</b>"
            f"{esc(verdict)}</div>"
        )
    parts.append("</div>")
    if result.host_drifted:
        parts.append(
            f"<p><b style='color:{VERDICT_COLOURS[SLOWER]}'>The host drifted</b>: negative control(s) moved "
            f"({esc(', '.join(labels[m.key] for m in result.controls_flagged))}), metrics no guest kernel can "
            "move. The decisions below are not to be trusted; re-run with A and B interleaved.</p>"
        )
    if result.regressions:
        parts.append(
            f"<p><b style='color:{VERDICT_COLOURS[SLOWER]}'>{len(result.regressions)} metric(s) slower beyond "
            f"{result.threshold:.0%}</b>: {esc(', '.join(labels[m.key] for m in result.regressions))}</p>"
        )
    else:
        parts.append("<p>No regression beyond the threshold.</p>")
    if result.undecided:
        parts.append(
            f"<p><b style='color:{VERDICT_COLOURS[UNDECIDED]}'>"
            f"{len(result.undecided)} metric(s) undecided</b>: neither a change nor equivalence shown; "
            "each row says about how many units a side would decide it.</p>"
        )
    if result.not_comparable:
        # A regime covers a whole scenario's metrics: one line per scenario and reason.
        refused = collections.Counter(
            (m.scenario, m.regime.reason() if m.regime else NOT_COMPARABLE) for m in result.not_comparable
        )
        parts.append(
            f"<p><b style='color:{VERDICT_COLOURS[NOT_COMPARABLE]}'>{len(result.not_comparable)} metric(s) not "
            "comparable</b>: the two runs measured them in different regimes, so they decide nothing.</p><ul>"
            + "".join(f"<li>{esc(sc)} ({n} metric(s)): {esc(reason)}</li>" for (sc, reason), n in refused.items())
            + "</ul>"
        )

    plot = forest_plot(result, labels)
    if plot:
        parts.append(
            f"<h2>Every ratio</h2><img alt='forest plot of B/A per metric' src='data:image/png;base64,{plot}'>"
        )

    parts.append(
        "<h2>Metrics</h2><table><tr><th>metric</th>"
        f"<th>{esc(a_name)} median</th><th>{esc(b_name)} median</th>"
        "<th>B/A [95% CI]</th><th>role</th><th>replicates A/B</th><th>p</th><th>p corrected</th>"
        "<th>TOST p corrected</th><th>verdict</th></tr>"
    )
    for m in result.metrics:
        c = m.comparison
        changed = (
            "<div class='small'>settings changed: "
            + esc(", ".join(f"{k}: {va} -> {vb}" for k, (va, vb) in m.settings_changed.items()))
            + "</div>"
            if m.settings_changed
            else ""
        )
        parts.append(
            f"<tr><td>{esc(labels[m.key])}{changed}</td>"
            f"<td class='num'>{esc(num(c.a.median))} {esc(m.unit)}</td>"
            f"<td class='num'>{esc(num(c.b.median))} {esc(m.unit)}</td>"
            f"<td class='num'>{esc(num(c.ratio))} [{esc(num(c.ci_low))}, {esc(num(c.ci_high))}]</td>"
            f"<td>{esc(m.role)}</td>"
            f"<td class='num'>{c.n_replicates_a}/{c.n_replicates_b}{f' ({c.n_blocks} blocks)' if c.paired else ''}</td>"
            f"<td class='num'>{c.p_value:.2g}</td>"
            f"<td class='num'>{'n/a' if c.p_adjusted is None else f'{c.p_adjusted:.2g}'}</td>"
            f"<td class='num'>{'n/a' if c.p_equivalence_adjusted is None else f'{c.p_equivalence_adjusted:.2g}'}</td>"
            f"<td>{badge(m.verdict, verdict_text(m))}</td></tr>"
        )
    parts.append("</table>")

    if result.only_in_a or result.only_in_b:
        parts.append("<h2>Metrics on one side only (not compared)</h2><table><tr><th>run</th><th>metric</th></tr>")
        for name, keys in ((a_name, result.only_in_a), (b_name, result.only_in_b)):
            for key in keys:
                parts.append(f"<tr><td>{esc(name)}</td><td class='small'>{esc(key)}</td></tr>")
        parts.append("</table>")

    moved = [claim for claim in result.claims if claim["a"] != claim["b"]]
    if moved:
        parts.append(
            "<h2>Claims whose verdict moved</h2><table><tr><th>claim</th>"
            f"<th>{esc(a_name)}</th><th>{esc(b_name)}</th></tr>"
        )
        for claim in moved:
            parts.append(f"<tr><td>{esc(claim['id'])}</td><td>{esc(claim['a'])}</td><td>{esc(claim['b'])}</td></tr>")
        parts.append("</table>")
    if result.environment:
        parts.append(
            "<h2>What differs between the two environments</h2><table><tr><th>key</th>"
            f"<th>{esc(a_name)}</th><th>{esc(b_name)}</th></tr>"
        )
        for key, (va, vb) in result.environment.items():
            parts.append(f"<tr><td>{esc(key)}</td><td>{esc(va)}</td><td>{esc(vb)}</td></tr>")
        parts.append("</table>")
    parts.append(
        "<p class='small'>Each ratio is the geometric mean of B / A over the replicate medians (per block "
        "when both runs name blocks: a block is one A and one B guest minutes apart), with its 95% "
        "t-interval.  A replicate is an independent unit: a fresh guest, a round or a block.  The p of a "
        "difference comes from a paired t-test of the blocks' log ratios (Welch's t-test of the log replicate "
        "medians when there are no blocks); the p of equivalence from the two one-sided tests against "
        "the threshold band.  Both are corrected within the metric's family: Holm over the primaries, Holm "
        "over the negative controls, Benjamini-Hochberg over the rest at alpha/4.  Slower or faster: the "
        "corrected p below alpha and the ratio beyond the threshold.  Equivalent: the corrected TOST p "
        "below alpha.  Undecided: neither; the row says about how many units a side would decide it "
        "at the spread observed.  Error rates of each decision are measured in docs/ab-calibration.md.</p>"
    )
    parts.append("</main></body></html>")
    return "".join(parts)


def write_comparison_html(
    result: RunComparison,
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    path: str | Path,
    a_name: str = "A",
    b_name: str = "B",
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, render_comparison_html(result, a, b, a_name, b_name).encode(), 0o644)
    return path

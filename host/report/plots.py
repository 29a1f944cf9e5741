"""The pages' plots: report.html's (each claim's A and B with the published
figures, each metric's distribution) and the one forest plot of B / A that
comparison.html (each metric's decision) and bisect.html (each probe
against K1) draw (``forest_png``: a log axis, the margin band, intervals
clipped at the edge and marked).  PNGs for the pages' typed views; no markup.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from memqual.host.core.printable import format_number as num
from memqual.host.judge.results import MetricEntry, variant_label
from memqual.host.report.badges import VERDICT_COLOURS
from memqual.host.report.claim_lines import published_on_axis
from memqual.host.report.figures import png, pyplot, tidy
from memqual.host.report.terminal import time_scale

_A_COLOUR, _B_COLOUR, _PUB_COLOUR = "#2563eb", "#ea580c", "#111827"
log = logging.getLogger("memqual.plots")
_Draw = TypeVar("_Draw", bound=Callable[..., "str | None"])


def one_figure(draw: _Draw) -> _Draw:
    """A figure that cannot be drawn (labels come from results files, and
    matplotlib refuses some text) is left out of its page, with a warning:
    the page and every other figure are still written."""

    @functools.wraps(draw)
    def drawn(*args: Any, **kwargs: Any) -> str | None:
        try:
            return draw(*args, **kwargs)
        except Exception as exc:  # any failure of matplotlib's: this figure only
            log.warning("a figure was left out: %s: %s", type(exc).__name__, str(exc).splitlines()[0][:200])
            pyplot().close("all")
            return None

    return cast(_Draw, drawn)


@one_figure
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
    tidy(fig)
    return png(fig)


@one_figure
def distribution_plot(metric_name: str, unit: str, entries: Sequence[MetricEntry]) -> str | None:
    """The repeats of one metric, a box and the points per variant."""
    plt = pyplot()
    import numpy as np

    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    labels = [variant_label(e.variant or {}) for e in entries]
    scale, unit = time_scale(unit, [x for e in entries for x in e.samples])
    data = [[x * scale for x in e.samples] for e in entries]
    ax.boxplot(data, widths=0.45, showfliers=False, medianprops={"color": _PUB_COLOUR})
    rng = np.random.default_rng(0)
    palette = [_A_COLOUR, _B_COLOUR, "#059669", "#7c3aed", "#db2777"]
    for i, samples in enumerate(data, start=1):
        jitter = rng.uniform(-0.1, 0.1, len(samples))
        ax.scatter(i + jitter, samples, s=12, color=palette[(i - 1) % len(palette)], zorder=3)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=0 if len(labels) < 4 else 20)
    ax.set_ylabel(unit)
    ax.set_title(metric_name, fontsize=9)
    tidy(fig)
    return png(fig)


@dataclasses.dataclass(frozen=True)
class ForestRow:
    """One row of the forest plot (a metric of comparison.html, a kernel of
    bisect.html): its B / A and interval, its verdict's colour, and the
    words at its right (verdict and look).  No ratio (or one <= 0, which a
    log axis cannot show) leaves the row empty but labelled."""

    label: str
    colour: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    note: str = ""
    # Its own margin when it differs from the band's (a primary judged at
    # its own, its scenario row): drawn as a band of its row only.
    margin: float | None = None
    marker: str = "o"  # matplotlib's: "o" a measured ratio, "s" the reference itself


# The axis spans the point estimates and the margin, never less than
# MIN_SPAN either side of 1 and never more than MAX_SPAN: an interval of a
# metric decided on two blocks can span 0.03-27x, and an axis that wide
# puts every other ratio on the line (a 0.95 and a 1.05 a pixel apart).
# What runs past the edge is clipped there and drawn as an arrow, with its
# true end written beside it; an estimate past it, as a diamond at the
# edge with its B / A and interval written inside the axis.
MIN_SPAN = 1.25
MAX_SPAN = 2.0


def axis_limits(rows: Sequence[ForestRow], margin: float) -> tuple[float, float]:
    """The log axis's ends: the estimates, the margin and the intervals that
    fit, padded, within [1 / MAX_SPAN, MAX_SPAN]."""
    import math

    points = [r.ratio for r in rows if r.ratio and r.ratio > 0 and math.isfinite(r.ratio)]
    ends = [x for r in rows for x in (r.ci_low, r.ci_high) if x and x > 0 and math.isfinite(x)]
    logs = [math.log(x) for x in points] + [math.log(1 - margin), math.log(1 + margin)]
    # An interval's ends widen the axis as far as twice the farthest estimate.
    reach = max(abs(v) for v in logs) * 2.0
    logs += [max(-reach, min(reach, math.log(x))) for x in ends]
    low = max(min(min(logs) * 1.1, -math.log(MIN_SPAN)), -math.log(MAX_SPAN))
    high = min(max(max(logs) * 1.1, math.log(MIN_SPAN)), math.log(MAX_SPAN))
    return math.exp(low), math.exp(high)


def forest_png(rows: Sequence[ForestRow], margin: float, xlabel: str) -> str:
    """Ratios B / A with their intervals, first row at the top, on a log
    axis (1.25x and 0.8x equally far from 1), the margin band 1 ± ``margin``
    drawn, and intervals (or estimates) beyond the axis clipped at its edge
    and marked with an arrow and their value; base64 PNG."""
    plt = pyplot()
    low, high = axis_limits(rows, margin)
    fig, ax = plt.subplots(figsize=(9.2, 0.34 * len(rows) + 1.3))
    ax.axvspan(1 - margin, 1 + margin, color="#e0f2fe", zorder=0)
    for edge in (1 - margin, 1 + margin):
        ax.axvline(edge, color="#0e7490", linewidth=0.8, linestyle="--", zorder=1)
    ax.axvline(1.0, color="#111827", linewidth=0.8, zorder=1)
    for y, row in enumerate(reversed(rows)):
        _draw_row(ax, y, row, margin, low, high)
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(ratio_ticks(low, high)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_yticks(range(len(rows)))
    labels = ax.set_yticklabels([row.label for row in reversed(rows)], fontsize=7)
    for label in labels:
        label.set_parse_math(False)
    ax.set_xlabel(xlabel)
    ax.xaxis.label.set_parse_math(False)
    tidy(fig)
    return png(fig)


# The words written beside an end clipped at the axis's edge.
CLIPPED_TEXT = {"fontsize": 6.5, "va": "center", "parse_math": False}


def _draw_row(ax: Any, y: int, row: ForestRow, margin: float, low: float, high: float) -> None:
    """One row of the forest plot at height ``y``: its own margin band when
    it has one, its interval, its estimate and its note."""
    import math

    lo, hi, r = row.ci_low, row.ci_high, row.ratio
    if row.margin is not None and row.margin != margin:
        ax.fill_betweenx([y - 0.4, y + 0.4], 1 - row.margin, 1 + row.margin, color="#bae6fd", zorder=0.5)
        for edge in (1 - row.margin, 1 + row.margin):
            ax.plot([edge, edge], [y - 0.4, y + 0.4], color="#0e7490", linewidth=0.8, zorder=1)
    has_ci = bool(lo and hi and lo > 0 and math.isfinite(lo) and math.isfinite(hi))
    beyond = bool(r and r > 0 and math.isfinite(r) and not low <= r <= high)
    if has_ci and lo is not None and hi is not None:
        _draw_interval(ax, y, row.colour, lo, hi, low, high, beyond)
    if r and r > 0 and math.isfinite(r):
        if not beyond:
            ax.plot([r], [y], row.marker, color=row.colour, markersize=5, zorder=4)
        else:
            edge, side = (low, "left") if r < low else (high, "right")
            ax.plot([edge], [y], "D", color=row.colour, markersize=5, zorder=4, clip_on=False)
            span = f" [{num(lo)}, {num(hi)}]" if has_ci else ""
            inside = edge * 1.03 if side == "left" else edge / 1.03
            ax.text(inside, y + 0.3, f"B/A {num(r)}{span}", ha=side, color=row.colour, **CLIPPED_TEXT)
    if row.note:
        ax.text(
            1.03,
            y,
            row.note,
            transform=ax.get_yaxis_transform(),
            ha="left",
            fontsize=7,
            color=row.colour,
            va="center",
            parse_math=False,
        )


def _draw_interval(
    ax: Any, y: int, colour: str, lo: float, hi: float, low: float, high: float, estimate_beyond: bool
) -> None:
    """An interval [lo, hi] clipped to the axis [low, high]: an arrow at
    each edge it passes, with its true end written beside it unless the
    estimate's text (past the edge too) gives it."""
    a, b = max(lo, low), min(hi, high)
    if a < b:
        ax.plot([a, b], [y, y], color=colour, linewidth=1.8, zorder=2)
    if lo < low:
        ax.plot([low], [y], "<", color=colour, markersize=6, zorder=3, clip_on=False)
        if not estimate_beyond:
            ax.text(low * 1.015, y + 0.3, num(lo), ha="left", color=colour, **CLIPPED_TEXT)
    if hi > high:
        ax.plot([high], [y], ">", color=colour, markersize=6, zorder=3, clip_on=False)
        if not estimate_beyond:
            ax.text(high / 1.015, y + 0.3, num(hi), ha="right", color=colour, **CLIPPED_TEXT)


def ratio_ticks(low: float, high: float) -> list[float]:
    """The round ratios within [low, high], nearest 1 first, each no closer
    than a twelfth of the axis to one already taken; sorted."""
    import math

    # Ticks no closer than a twelfth of the axis: 0.95 and 1.05 only on a narrow one.
    ticks: list[float] = []
    gap = (math.log(high) - math.log(low)) / 12.0
    for t in sorted((0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0), key=lambda t: abs(math.log(t))):
        if low <= t <= high and all(abs(math.log(t) - math.log(u)) >= gap for u in ticks):
            ticks.append(t)
    ticks.sort()
    return ticks

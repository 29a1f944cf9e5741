"""report.html's plots: each claim's A and B with the published figures,
and each metric's distribution.  PNGs for the page's typed view; no markup.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from memqual.host.judge.results import variant_label
from memqual.host.report.claim_lines import published_on_axis
from memqual.host.report.html import (
    VERDICT_COLOURS,
    num,
    png,
    pyplot,
)
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
    fig.tight_layout()
    return png(fig)


@one_figure
def distribution_plot(metric_name: str, unit: str, entries: Sequence[Mapping[str, Any]]) -> str | None:
    """The repeats of one metric, a box and the points per variant."""
    plt = pyplot()
    import numpy as np

    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    labels = [variant_label(e.get("variant") or {}) for e in entries]
    scale, unit = time_scale(unit, [x for e in entries for x in e["samples"]])
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

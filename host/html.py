"""The HTML both pages share (report.html and comparison.html): the style
sheet, escaping, numbers, PNG plots embedded as base64, verdict badges and
their colours, and the line that says where a run's figures come from.

Every page is one self-contained file: no script, no external resource.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
from collections.abc import Mapping, Sequence
from typing import Any

from memqual.host import claims, comparison

GREY = "#6b7280"

# One colour per verdict, of a claim (memqual.host.claims) and of a comparison
# (memqual.host.comparison); "underpowered" and "undecided" share one colour.
VERDICT_COLOURS = {
    claims.REPRODUCED: "#1a7f37",
    claims.DIRECTION_ONLY: "#b7791f",
    claims.NOT_REPRODUCED: "#c62828",
    claims.UNDERPOWERED: "#7c3aed",
    claims.NOT_MEASURABLE: GREY,
    comparison.FASTER: "#15803d",
    comparison.SLOWER: "#b91c1c",
    comparison.EQUIVALENT: "#0e7490",
    comparison.UNDECIDED: "#7c3aed",
    comparison.NOT_COMPARABLE: GREY,
}

CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#111827;background:#f3f4f6;margin:0;line-height:1.45}
main{max-width:1080px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:26px;margin:8px 0 2px}
h2{font-size:19px;margin:34px 0 10px;border-bottom:1px solid #d1d5db;padding-bottom:4px}
h3{font-size:16px;margin:0 0 4px}
.sub{color:#4b5563;margin:0 0 16px}
.badges{display:flex;gap:10px;flex-wrap:wrap;margin:14px 0}
.badge{border-radius:999px;padding:3px 12px;color:#fff;font-weight:600;font-size:13px;white-space:nowrap}
.count{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:10px 16px;min-width:120px}
.count b{font-size:24px;display:block}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:16px 18px;margin:14px 0;
 box-shadow:0 1px 2px rgba(0,0,0,.04)}
.card header{display:flex;justify-content:space-between;align-items:flex-start;gap:12px}
.cid{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;color:#6b7280;font-size:13px}
.evidence{margin:6px 0;color:#111827}
.qualifier{margin:6px 0;padding:6px 10px;border-left:3px solid #d97706;background:#fffbeb;font-size:14px}
.ceiling{margin:6px 0;padding:6px 10px;border-left:3px solid #b91c1c;background:#fef2f2;font-size:14px}
table.sidebyside td{vertical-align:top;width:50%}
blockquote{margin:8px 0;padding:6px 12px;border-left:3px solid #d1d5db;color:#374151;font-style:italic;
 background:#f9fafb}
.reason{margin:8px 0;padding:8px 12px;border-radius:6px;background:#f9fafb;font-size:14px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{padding:4px 10px;border-bottom:1px solid #e5e7eb;text-align:left;vertical-align:top}
th{color:#374151;background:#f9fafb} td.num{text-align:right;font-variant-numeric:tabular-nums}
.summary td:nth-child(2){font-weight:600}
.env td:first-child{color:#4b5563;white-space:nowrap} .env td{font-family:ui-monospace,Menlo,monospace;font-size:12px}
img{max-width:100%} .grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:12px}
.small{font-size:12px;color:#6b7280} .seed{font-size:12px;color:#6b7280}
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


num = claims.format_number


def badge(verdict: str, text: str | None = None) -> str:
    """A verdict as a coloured pill (``text`` instead of the verdict's name
    when given)."""
    return f'<span class="badge" style="background:{VERDICT_COLOURS.get(verdict, GREY)}">{esc(text or verdict)}</span>'


def pyplot() -> Any:
    """matplotlib.pyplot without a display, in the pages' style."""
    import matplotlib

    matplotlib.use("Agg")  # no display; before pyplot is imported anywhere
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def png(fig: Any) -> str:
    """A figure as base64 PNG for an ``<img src='data:image/png;base64,...'>``;
    the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


@dataclasses.dataclass(frozen=True)
class ForestRow:
    """One row of a forest plot: a ratio and its CI, coloured by verdict.
    No ratio (or one <= 0, which a log axis cannot show) leaves the row
    empty but labelled."""

    label: str
    colour: str
    ratio: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    marker: str = "o"  # matplotlib's: "o" a measured ratio, "s" the reference itself


def forest_png(rows: Sequence[ForestRow], threshold: float, xlabel: str) -> str:
    """Ratios against 1 with their CIs, first row at the top, on a log axis
    (1.25x and 0.8x sit equally far from 1) with the band within
    ``threshold`` of 1 shaded; base64 PNG as ``png`` gives it."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 0.3 * len(rows) + 1.2))
    for y, row in enumerate(reversed(rows)):
        if row.ci_low and row.ci_high and row.ci_low > 0:
            ax.plot([row.ci_low, row.ci_high], [y, y], color=row.colour, linewidth=1.7)
        if row.ratio and row.ratio > 0:
            ax.plot([row.ratio], [y], row.marker, color=row.colour, markersize=5)
    ax.axvline(1.0, color="#111827", linewidth=0.8)
    ax.axvspan(1 - threshold, 1 + threshold, color="#e5e7eb", zorder=0)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter

    # Plain numbers on the log axis (0.9, 1.1), not matplotlib's 10^x.
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([row.label for row in reversed(rows)], fontsize=7)
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    return png(fig)


def environment_line(env: Mapping[str, Any]) -> str:
    """Where the figures come from, in one line under the title."""
    bits = []
    if env.get("accel"):
        reason = f" ({esc(env['accel_reason'])})" if env.get("accel_reason") else ""
        bits.append(f"<b>{esc(str(env['accel']).upper())}</b>{reason}")
    if env.get("host_kernel"):
        bits.append(f"host kernel {esc(env['host_kernel'])}")
    if env.get("qemu"):
        qemu = str(env["qemu"]).split(" (")[0]
        origin = str(env.get("qemu_origin") or "").split(" (cache ")[0]
        named = qemu if qemu.lower().startswith("qemu") else f"QEMU {qemu}"
        bits.append(esc(named + (f" ({origin})" if origin else "")))
    if env.get("guest_kernel") or env.get("guest_kernel_sha256"):
        sha = str(env.get("guest_kernel_sha256") or "")[:12]
        bits.append(f"guest kernel {esc(env.get('guest_kernel') or '')}" + (f" (sha256 {esc(sha)}...)" if sha else ""))
    return f"<p class='sub'>{' · '.join(bits)}</p>" if bits else ""

"""The request-size curve for report.html and docs/balloon.md: inflate and
deflate time against PFNs per request (log x), the median and the range of
the fresh guests at each size, from the records of the scenarios whose
row names this section (the balloon's request size);
beside it, the fitted per-request and per-page costs with 95 % intervals
over the guests.

Reads either a results.json's metric entries or measurement records (both
carry scenario, metric, variant, settings and replicates).
``memqual balloon curve`` writes the PNG on its own.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from memqual.host.core import descriptive, scenario
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.printable import format_number as num
from memqual.host.judge.stats.ratio_ci import mean_interval
from memqual.host.report import pages
from memqual.host.report.figures import Plot, png, pyplot, tidy

SECTION = "balloon"  # its memqual.report_sections entry point, which scenario rows name


def drawn() -> frozenset[str]:
    """The scenarios it draws: those whose row names this section."""
    return frozenset(row.name for row in scenario.table() if row.section == SECTION)


# One panel each: host-timed inflate, QEMU's CPU seconds over it (what a
# loaded shared host leaves measurable), host-timed deflate.
CURVE_METRICS = {
    "inflate_s": ("inflate, host-timed", "#2563eb"),
    "qemu_cpu_s": ("QEMU CPU over the inflate", "#059669"),
    "deflate_s": ("deflate, host-timed", "#ea580c"),
}
COST_METRICS = (
    "per_request_us",
    "per_page_ns",
    "qemu_cpu_per_request_us",
    "qemu_cpu_per_page_ns",
    "deflate_per_request_us",
    "deflate_per_page_ns",
)
_SHORT = {"1/16 guest": "1/16", "1/8 guest": "1/8", "whole guest": "all"}


@dataclasses.dataclass(frozen=True)
class Point:
    """One size of one metric: each guest's value, their median and range."""

    metric: str
    label: str
    pfns: int
    values: tuple[float, ...]  # one per fresh guest

    @property
    def median(self) -> float:
        return descriptive.median(list(self.values))


@dataclasses.dataclass(frozen=True)
class Cost:
    """A fitted cost: each guest's own fit, their mean and a t interval."""

    metric: str
    unit: str
    values: tuple[float, ...]

    def interval(self) -> tuple[float, float, float]:
        """(mean, low, high): the guests are the independent units; with one
        guest there is no interval (NaN bounds)."""
        return mean_interval(self.values)


def _get(entry: Any, key: str) -> Any:
    return entry.get(key) if isinstance(entry, Mapping) else getattr(entry, key, None)


def _per_guest(entry: Any) -> list[float]:
    """One value per independent unit: its replicate's median."""
    reps = _get(entry, "replicates")
    if reps:
        return [descriptive.median(r) for r in reps if r]
    return list(_get(entry, "samples") or [])


# Labels of records written before the variant carried ``pfns``.
_FRACTION = re.compile(r"^(?:1/(\d+)|whole) guest$")
_ABSOLUTE = re.compile(r"^(\d+) pfns$")


def pfns_of(variant: Mapping[str, Any], settings: Mapping[str, Any]) -> int | None:
    """PFNs per request of a record: its ``pfns``, else read from the label
    (records written before the variant carried it)."""
    if isinstance(variant.get("pfns"), int):
        return int(variant["pfns"])
    label = str(variant.get("per_request", ""))
    if m := _ABSOLUTE.match(label):
        return int(m.group(1))
    if (m := _FRACTION.match(label)) and isinstance(settings.get("guest_mib"), int):
        return settings["guest_mib"] * 256 // int(m.group(1) or 1)
    return None


@dataclasses.dataclass(frozen=True)
class Curve:
    """One settings group of the scenario: its points and fitted costs."""

    settings: dict[str, Any]
    points: list[Point]
    costs: list[Cost]

    def series(self, metric: str) -> list[Point]:
        return sorted((p for p in self.points if p.metric == metric), key=lambda p: p.pfns)


def curves(entries: Iterable[Any]) -> list[Curve]:
    """The scenario's curves, one per distinct settings."""
    groups: dict[str, list[Any]] = collections.defaultdict(list)
    names = drawn()
    for e in entries:
        if _get(e, "scenario") in names:
            groups[json.dumps(_get(e, "settings") or {}, sort_keys=True)].append(e)
    out = []
    for key, group in sorted(groups.items()):
        settings = json.loads(key)
        points, costs = [], []
        for e in group:
            metric, values = _get(e, "metric"), _per_guest(e)
            if not values:
                continue
            if metric in CURVE_METRICS:
                variant = _get(e, "variant") or {}
                pfns = pfns_of(variant, settings)
                if pfns is not None:
                    points.append(Point(metric, str(variant.get("per_request", pfns)), pfns, tuple(values)))
            elif metric in COST_METRICS:
                costs.append(Cost(metric, str(_get(e, "unit") or ""), tuple(values)))
        if points:
            costs.sort(key=lambda c: COST_METRICS.index(c.metric))
            out.append(Curve(settings, points, costs))
    return out


def _tick(pfns: int, label: str) -> str:
    """256, 1K ... 256K, with the seed's bitmap share under it."""
    text = f"{pfns >> 10}K" if pfns >= 1024 and pfns % 1024 == 0 else str(pfns)
    return f"{text}\n{_SHORT[label]}" if label in _SHORT else text


def figure(curve: Curve) -> Any:
    """Seconds against PFNs per request (log x), a panel per measure: every
    guest a dot, the median a line, the guests' range a bar."""
    plt = pyplot()
    metrics = [m for m in CURVE_METRICS if curve.series(m)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.3 * len(metrics), 3.0), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        name, colour = CURVE_METRICS[metric]
        series = curve.series(metric)
        xs = [p.pfns for p in series]
        meds = [p.median for p in series]
        low = [m - min(p.values) for m, p in zip(meds, series, strict=True)]
        high = [max(p.values) - m for m, p in zip(meds, series, strict=True)]
        ax.errorbar(xs, meds, yerr=[low, high], fmt="o-", color=colour, capsize=3, markersize=4, linewidth=1.2)
        for p in series:
            ax.scatter([p.pfns] * len(p.values), p.values, s=8, color=colour, alpha=0.45, zorder=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [_tick(p.pfns, p.label) for p in series], fontsize=7)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_ylabel("s")
        n = max(len(p.values) for p in series)
        ax.set_title(f"{name}\nmedian of {n} guests, bar = their range", fontsize=8)
    s = curve.settings
    moved = s["guest_mib"] - s["target_mib"] if "guest_mib" in s and "target_mib" in s else None
    fig.suptitle(
        "balloon: time against PFNs per request"
        + (f" ({moved} MiB of a {s['guest_mib']} MiB guest)" if moved is not None else ""),
        fontsize=9,
    )
    fig.supxlabel("PFNs per request (4 KiB pages; 1/16, 1/8, all: the seed's bitmaps scaled to the guest)", fontsize=8)
    tidy(fig)
    return fig


@dataclasses.dataclass(frozen=True)
class SizeRow:
    """A request size of the table: per curve metric "median [range]", or
    "-" where that metric has no point at this size."""

    label: str
    pfns: int
    guests: int
    cells: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CostRow:
    metric: str
    unit: str
    guests: int
    mean: str
    low: str
    high: str
    each: str


@dataclasses.dataclass(frozen=True)
class CurveView:
    """One curve's part of report.html: the plot, the table per size and
    the fitted costs."""

    plot: Plot
    columns: tuple[str, ...]
    sizes: tuple[SizeRow, ...]
    costs: tuple[CostRow, ...]


def curve_view(curve: Curve) -> CurveView:
    by_size: dict[int, dict[str, Point]] = collections.defaultdict(dict)
    for p in curve.points:
        by_size[p.pfns][p.metric] = p
    sizes = []
    for pfns, row in sorted(by_size.items()):
        cells = []
        for metric in CURVE_METRICS:
            q = row.get(metric)
            cells.append(f"{num(q.median)} [{num(min(q.values))}, {num(max(q.values))}]" if q else "-")
        sizes.append(
            SizeRow(next(iter(row.values())).label, pfns, max(len(q.values) for q in row.values()), tuple(cells))
        )
    costs = []
    for c in curve.costs:
        mean, low, high = c.interval()
        costs.append(
            CostRow(
                c.metric, c.unit, len(c.values), num(mean), num(low), num(high), ", ".join(num(v) for v in c.values)
            )
        )
    return CurveView(
        Plot("balloon inflate and deflate time against PFNs per request", png(figure(curve))),
        tuple(name for name, _ in CURVE_METRICS.values()),
        tuple(sizes),
        tuple(costs),
    )


def section(entries: Sequence[Any]) -> Markup:
    """report.html's section: the curve, the per-size table, the fitted
    costs with their intervals; empty when the run has no such records."""
    found = curves(entries)
    if not found:
        return Markup("")
    return pages.fragment("balloon.html.j2", curves=[curve_view(c) for c in found])


def write_png(entries: Sequence[Any], path: str) -> int:
    """The first curve as a PNG file (for docs/balloon.md); how many curves
    the entries hold."""
    found = curves(entries)
    if found:
        # Written whole through the private writer, never through a link at ``path``.
        write_private_atomic(Path(path), base64.b64decode(png(figure(found[0]))), 0o644)
    return len(found)

"""bisect.html: every probe's decision against K1, and each step of it, for
people.

Rendered from the state (bisect.json) alone, after every step, so an
interrupted bisect leaves a page of what it knew.  The state becomes a typed
view here (plain values, nothing escaped); templates/bisect.html.j2 lays it
out, and escapes it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from memqual.host.core.paths import write_private_atomic
from memqual.host.report import pages
from memqual.host.report.badges import GREY, VERDICT_COLOURS, Badge, badge
from memqual.host.report.figures import Plot
from memqual.host.report.plots import ForestRow, forest_png

TEMPLATE = "bisect.html.j2"

# The search's marks; the decisions (slower, faster, equivalent,
# undecided) take compare's colours.
MARK_COLOURS = {"good": "#15803d", "bad": "#b91c1c", "skip": "#7c3aed"}


@dataclasses.dataclass(frozen=True)
class Mark:
    """The search's mark of a kernel (good, bad, skip) in its colour."""

    text: str
    colour: str


def mark(name: str) -> Mark:
    return Mark(name, MARK_COLOURS.get(name, GREY))


@dataclasses.dataclass(frozen=True)
class KernelRow:
    """A kernel of the series: K1 the reference, one not probed (yet), or a
    probe with its last look.  ``status`` stands in the decision's cell when
    there is no decision."""

    label: str  # "K3 6.1.0-57-amd64:..." ("K3 host ..." in a series of host kernels)
    status: str = ""
    host: str = ""  # the host under test its guests ran on ("" this machine)
    decision: Badge | None = None
    mark: Mark | None = None
    ratio: str = ""  # B/A [95% CI]
    blocks: str = ""
    alpha: str = ""
    minutes: str = ""
    note: str = ""


@dataclasses.dataclass(frozen=True)
class StepRow:
    """One step (one avocado job) of a probe and the look after it."""

    probe: str  # "K3"
    step: int
    ratio: str
    blocks: str
    alpha: str
    decision: Badge
    minutes: str


@dataclasses.dataclass(frozen=True)
class Undecided:
    """A probe still undecided: what its last look said and why it stopped."""

    kernel: str  # "K3 6.1.0-57-amd64:..."
    colour: str
    text: str
    reason: str


def settings_of(metric_key: str) -> str:
    """The settings part of a metric's key ('scenario name [variant] {...}'):
    a JSON object too long for a heading."""
    _, brace, settings = metric_key.partition(" {")
    return "{" + settings if brace else ""


@dataclasses.dataclass(frozen=True)
class BisectPage:
    metric: str  # as given on the command line, for the title
    metric_key: str  # the metric found in the records (scenario, name, variant), or as given
    metric_settings: str  # the settings its records were taken under, beside the heading
    kernels: int
    axis: str  # what the series is of, and what stays fixed, in words
    kind: str  # "guest" or "host": the series' kernels
    on_hosts: bool  # do its guests run on hosts under test (a column names each probe's)?
    threshold: str  # as a percentage
    alpha: str  # a probe's, over all its looks
    budget_min: str
    max_rounds: int
    reference: str
    created: str
    interrupted: bool
    outcome: str
    plot: Plot | None
    undecided: tuple[Undecided, ...]
    rows: tuple[KernelRow, ...]
    probe_order: tuple[str, ...]  # "K6", "K3", ...
    steps: tuple[StepRow, ...]


def _decision(p: dict[str, Any]) -> str:
    return str(p.get("decision") or p["evidence"].get("verdict") or "undecided")


def forest_plot(state: dict[str, Any]) -> str | None:
    """One row per kernel of the series, K1 at the top: the probe's B/A
    against K1 at its last look with its 95 % CI on a log axis, coloured by
    its decision and saying it, the threshold band drawn."""
    probes = {p["index"]: p for p in state["probes"]}
    if not probes:
        return None
    rows = []
    axis = SeriesAxis.of(state["settings"])
    for index, kernel in enumerate(state["settings"]["kernels"]):
        label = axis.label(index, kernel)[:70]
        p = probes.get(index)
        if index == 0:
            rows.append(ForestRow(label, "#111827", 1.0, None, None, "reference", marker="s"))
        elif p is None:
            rows.append(ForestRow(label, GREY, None, None, None, "not probed"))
        else:
            e = p["evidence"]
            decision = _decision(p)
            colour = VERDICT_COLOURS.get(decision, GREY)
            rows.append(ForestRow(label, colour, e.get("ratio"), e.get("ci_low"), e.get("ci_high"), decision))
    threshold = state["settings"]["threshold"]
    return forest_png(
        rows,
        threshold,
        f"probe / K1 (B/A, 95% t-interval over blocks); band: within {threshold:.0%}; arrows: clipped at the edge",
    )


def _ratio(e: dict[str, Any]) -> str:
    if e.get("ratio") is None:
        return "n/a"
    ci = "" if e.get("ci_low") is None or e.get("ci_high") is None else f" [{e['ci_low']:.3f}, {e['ci_high']:.3f}]"
    return f"{e['ratio']:.3f}{ci}"


def _units(e: dict[str, Any]) -> str:
    if e.get("paired") or e.get("n_blocks"):
        return str(e.get("look") or e.get("n_blocks"))
    return f"unpaired {e.get('n_reference', 0)}+{e.get('n_probe', 0)}"


@dataclasses.dataclass(frozen=True)
class SeriesAxis:
    """A state's axis (bisect.json's settings.axis; a state from before
    axes: guest kernels on this machine)."""

    kind: str = "guest"
    host: str = ""
    host_params: tuple[str, ...] = ()
    text: str = "guest kernels: each probe's guests boot it, on this machine"

    @classmethod
    def of(cls, settings: dict[str, Any]) -> SeriesAxis:
        data = settings.get("axis")
        if not isinstance(data, dict):
            return cls()
        return cls(
            str(data.get("kind") or "guest"),
            str(data.get("host") or ""),
            tuple(str(p) for p in data.get("host_params") or ()),
            str(data.get("text") or cls.text),
        )

    def label(self, index: int, name: str) -> str:
        return f"K{index + 1} {'host ' if self.kind == 'host' else ''}{name}"

    def host_of(self, name: str) -> str:
        """The host under test a kernel of the series ran its guests on."""
        host = name if self.kind == "host" else self.host
        return " ".join([host, *self.host_params]) if host else ""


GUEST_SERIES = SeriesAxis()


def _row(index: int, name: str, p: dict[str, Any] | None, axis: SeriesAxis = GUEST_SERIES) -> KernelRow:
    label, host = axis.label(index, name), axis.host_of(name)
    if index == 0:
        return KernelRow(label, status="reference", host=host, mark=mark("good"), ratio="1")
    if p is None:
        return KernelRow(label, status="not probed", host=host)
    e = p["evidence"]
    return KernelRow(
        label,
        host=host,
        decision=badge(_decision(p), e.get("text") or _decision(p)),
        mark=mark(str(p["verdict"])),
        ratio=_ratio(e),
        blocks=_units(e),
        alpha=f"{e.get('alpha', 0.0):.2g}",
        minutes=f"{p['seconds'] / 60:.1f}",
        note=str(p.get("reason") or ""),
    )


def bisect_page(state: dict[str, Any]) -> BisectPage:
    """The page's view of a state (bisect.json)."""
    s = state["settings"]
    axis = SeriesAxis.of(s)
    probes = {p["index"]: p for p in state["probes"]}
    order = [i for i in state.get("probe_order") or []]
    png = forest_plot(state)
    return BisectPage(
        metric=str(s["metric"]),
        metric_key=str(state.get("metric_key") or s["metric"]).partition(" {")[0],
        metric_settings=settings_of(str(state.get("metric_key") or "")),
        kernels=len(s["kernels"]),
        axis=axis.text,
        kind=axis.kind,
        on_hosts=axis.kind == "host" or bool(axis.host),
        threshold=f"{s['threshold']:.0%}",
        alpha=f"{s.get('alpha', 0.05):g}",
        budget_min=f"{s['budget_min']:g}",
        max_rounds=int(s["max_rounds"]),
        reference=str(s["reference"]),
        created=str(state["created"]),
        interrupted=bool(state.get("interrupted")),
        outcome=str(state["outcome"]["text"]),
        plot=Plot("forest plot of every probe", png) if png else None,
        undecided=tuple(
            Undecided(
                axis.label(i, s["kernels"][i]),
                VERDICT_COLOURS["undecided"],
                str(probes[i]["evidence"].get("text") or "undecided"),
                str(probes[i].get("reason") or ""),
            )
            for i in sorted(probes)
            if _decision(probes[i]) == "undecided"
        ),
        rows=tuple(_row(i, name, probes.get(i), axis) for i, name in enumerate(s["kernels"])),
        probe_order=tuple(f"K{i + 1}" for i in order),
        steps=tuple(
            StepRow(
                f"K{i + 1}",
                int(look["step"]),
                _ratio(look),
                _units(look),
                f"{look.get('alpha', 0.0):.2g}",
                badge(str(look["verdict"]), look.get("text")),
                f"{look['seconds'] / 60:.1f}",
            )
            for i in order
            if i in probes
            for look in probes[i].get("looks") or []
            if look.get("step")
        ),
    )


def render(state: dict[str, Any]) -> str:
    return pages.render(TEMPLATE, page=bisect_page(state))


def write_page(state: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    write_private_atomic(path, render(state).encode(), 0o644)
    return path

"""report.html: a run's results.json as a typed view (ReportPage) for
templates/report.html.j2 (rendered by memqual.host.report.pages), with each
subject's own section from the registry (entry points group
memqual.report_sections; this package imports no subject).  Judges
nothing.
"""

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

from memqual.host.core.paths import write_private_atomic
from memqual.host.core.printable import format_number as num
from memqual.host.judge.claims.model import (
    DIRECTION_ONLY,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    UNDERPOWERED,
    format_ratio,
)
from memqual.host.judge.results import MetricEntry, Results, variant_label
from memqual.host.report import pages
from memqual.host.report.badges import Badge, Count, badge, counts
from memqual.host.report.claim_lines import (
    ceiling_line,
    clock_text,
    emulated_line,
    evidence_class,
    host_text,
    measured_text,
    note_line,
    published_text,
    qualifier_line,
    ran_on_line,
    short_qualifier,
    summary_line,
)
from memqual.host.report.environment_line import EnvironmentLine, environment_line
from memqual.host.report.figures import Plot
from memqual.host.report.plots import claim_plot, distribution_plot
from memqual.host.report.terminal import kernbench_tables, short_settings, time_scale


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """A claim in the table at the top."""

    claim: str
    evidence: str
    verdict: Badge
    measured: str
    published: str
    qualifier: str = ""  # the accelerator the verdict was made under, when it does not speak for another
    host: str = ""  # the host the evidence ran on ("no measurement": a model or nothing measured)
    clock: str = ""  # the clock its timings were read on


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
    newer: str = ""  # what of the guest came after 2011; "" when nothing
    decides: bool = False  # the guest built to the seed's description


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
    headers: tuple[str, ...] = ()  # one per structure: what its column counts


# What a column of the guest-of-today table counts: the guest's own slots,
# without the private slots a 2011 host added (the verdict's array walks 35).
TODAY_HEADERS = {
    "linear": "array over the guest's slots alone (a 2011 VMX host added 3 private slots: 35 entries)",
    "tree2011": "tree2011 over the guest's slots alone",
    "rbtree": "rbtree (today's kernel)",
}


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
    ran_on: str  # "host: ... · evidence: ... · clock: ..."
    emulated: str  # what an emulated CPU's figures are, under a host under test on TCG with SVM; or ""
    summary: str  # the evidence said once: what was measured, on what, and the verdict's reason
    note: str  # the claim's caveats
    details: tuple[str, ...]  # the arithmetic behind the verdict, folded under the card
    full_reason: str
    qualifier: str
    ceiling: str
    claimed: str
    instead: str
    inputs: tuple[str, ...]
    would_measure: str  # shown only when nothing here measures the claim
    quote: str
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
        ran_on=ran_on_line(c),
        emulated=emulated_line(c),
        summary=summary_line(c),
        note=note_line(c),
        details=tuple(str(d) for d in c.get("details") or ()),
        full_reason=str(c["reason"]),
        qualifier=qualifier_line(c),
        ceiling=ceiling_line(c),
        claimed=str(ev.get("claimed", "")),
        instead=str(ev.get("instead", "")),
        inputs=tuple(str(i) for i in ev.get("inputs") or []),
        would_measure=str(ev.get("would_measure") or "") if evidence_class(c) == NOT_MEASURABLE else "",
        quote=str(c.get("quote") or ""),
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
    return TodayTable(
        label=str(today["label"]),
        structures=structures,
        rows=tuple(rows),
        headers=tuple(TODAY_HEADERS.get(s, s) for s in structures),
    )


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
                newer="; ".join(str(x) for x in r.get("newer") or ()),
                decides=bool(r.get("seed_guest")),
            )
            for r in rows
        ),
    )


def _spread_rows(metrics: Sequence[MetricEntry]) -> tuple[SpreadRow, ...]:
    # One unit per metric, whatever its variant or settings.
    scales: dict[tuple[str, str], tuple[float, str]] = {}
    for key in {(m.scenario, m.metric) for m in metrics}:
        same = [m for m in metrics if (m.scenario, m.metric) == key]
        scales[key] = time_scale(same[0].unit, [x for m in same for x in m.samples])
    rows = []
    for m in metrics:
        s = m.summary
        scale, unit = scales[(m.scenario, m.metric)]
        rows.append(
            SpreadRow(
                scenario=str(m.scenario),
                metric=str(m.metric),
                unit=unit,
                better=str(m.better),
                variant=variant_label(m.variant or {}),
                settings=short_settings(json.dumps(m.settings or {})),
                n=s["n"],
                median=num(s["median"] * scale),
                iqr=num(s["iqr"] * scale),
                mad=num(s["mad"] * scale),
                cv="n/a" if s["cv"] is None else f"{100 * s['cv']:.1f} %",
            )
        )
    return tuple(rows)


def _distributions(metrics: Sequence[MetricEntry]) -> tuple[Plot, ...]:
    grouped: dict[tuple[str, str, str], list[MetricEntry]] = collections.defaultdict(list)
    for m in metrics:
        grouped[(m.scenario, m.metric, json.dumps(m.settings or {}, sort_keys=True))].append(m)
    # A single repeat has no distribution to show.
    plotted = {k: v for k, v in grouped.items() if any(len(e.samples) > 1 for e in v)}
    plots = []
    for (scenario, metric, settings), entries in sorted(plotted.items()):
        subtitle = short_settings(settings)
        image = distribution_plot(
            f"{scenario}: {metric}" + (f"\n{subtitle}" if subtitle else ""), entries[0].unit, entries
        )
        if image is not None:  # a figure that could not be drawn is left out (plots.one_figure)
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
    results = Results.from_json(results)
    claims = results.claims
    run = results.run or {}
    metrics = results.metrics
    env = results.environment or {}
    sources = env.get("environment_sources") or {}
    sections = subject_sections(metrics) if metrics else ()
    return ReportPage(
        created=str(results.created),
        version=str(results.memqual_version),
        profile=str(run.get("profile") or ""),
        label=str(run.get("label") or ""),
        avocado=str((run.get("avocado") or {}).get("summary") or ""),
        environment_line=environment_line(env),
        counts=counts(
            (c.verdict for c in claims), (REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, UNDERPOWERED, NOT_MEASURABLE)
        ),
        summary=tuple(
            SummaryRow(
                c.id,
                evidence_class(c.data),
                badge(c.verdict),
                measured_text(c.data),
                published_text(c.data),
                short_qualifier(c.data),
                host_text(c.data),
                clock_text(c.data),
            )
            for c in claims
        ),
        cards=tuple(claim_card(c.data) for c in claims),
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

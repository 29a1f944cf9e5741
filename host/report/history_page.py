"""history.html: the groups, runs and series of memqual.host.judge.history
as a typed view for templates/history.html.j2, each series plotted.
Judges nothing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from memqual.host.judge.history import TEST_NAME, Group, Run, Series
from memqual.host.judge.regime import NOT_COMPARABLE

if TYPE_CHECKING:
    from memqual.host.report.environment_line import EnvironmentLine
    from memqual.host.report.figures import Plot


def _plot(series: Series, runs: list[Run], threshold: float) -> str:
    from memqual.host.report.figures import png, pyplot, tidy

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 2.4))
    xs = [p.run for p in series.points]
    for p in series.points:
        if p.ci_low is not None and p.ci_high is not None:
            ax.plot([p.run, p.run], [p.ci_low, p.ci_high], color="#2563eb", linewidth=1.6)
    ax.plot(xs, [p.ratio for p in series.points], "o-", color="#2563eb", markersize=4, linewidth=0.8)
    ax.axhspan(1 - threshold, 1 + threshold, color="#e5e7eb", zorder=0)
    for st in series.steps:
        ax.axvline(st.after - 0.5, color="#b91c1c", linestyle="--", linewidth=1.2)
        ax.annotate(
            f"x{st.ratio:.2f}", (st.after - 0.5, ax.get_ylim()[1]), color="#b91c1c", fontsize=7, ha="left", va="top"
        )
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([f"{i + 1}" for i in range(len(runs))], fontsize=7)
    ax.set_xlabel("run (see the table above)", fontsize=7)
    ax.set_ylabel("ratio to run 1", fontsize=7)
    tidy(fig)
    return png(fig)


@dataclasses.dataclass(frozen=True)
class RunRow:
    number: int  # from 1, as the plots' x axis counts
    created: str
    guest_kernel: str
    label: str
    path: str


@dataclasses.dataclass(frozen=True)
class SeriesView:
    """A metric's series: its family, what the tests found, its plot."""

    key: str
    role: str
    unit: str
    better: str
    p_change: str
    p_change_adjusted: str
    steps: str  # the steps found, or "no step: " and the verdict, or why not comparable
    comparable: bool  # False: the runs' regimes differ, greyed
    plot: Plot


@dataclasses.dataclass(frozen=True)
class GroupView:
    """A group of runs of one host and QEMU."""

    number: int
    runs: tuple[RunRow, ...]
    metrics: int
    stepped: int
    environment: EnvironmentLine
    controls_stepped: tuple[str, ...]  # the host drifted when any
    family_changes: tuple[str, ...]  # "primaries: before run 5", one a family that changed
    equivalent: int
    undecided: int
    not_comparable: int
    series: tuple[SeriesView, ...]


@dataclasses.dataclass(frozen=True)
class DifferenceRow:
    """A host key that differs between the groups: its value in each, as JSON."""

    key: str
    values: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class HistoryPage:
    runs: int
    order: str
    threshold: str  # as a percentage
    alpha: str
    test: str
    not_comparable_colour: str
    differences: tuple[DifferenceRow, ...]
    groups: tuple[GroupView, ...]


FAMILY_NAMES = {
    "primary": "the primaries",
    "control": "the negative controls",
    "exploratory": "the exploratory metrics",
}


def _steps_text(s: Series) -> str:
    return "; ".join(
        f"step before run {st.after + 1}: x{st.ratio:.3f} [{st.ci_low:.3f}, {st.ci_high:.3f}], p={st.p_value:.3g}"
        + (" (confounded: a control stepped there too)" if st.confounded else "")
        for st in s.steps
    ) or (s.regime.reason() if s.regime and not s.comparable else "no step: " + s.verdict)


def _group_view(number: int, g: Group, threshold: float) -> GroupView:
    from memqual.host.report.environment_line import environment_line
    from memqual.host.report.figures import Plot

    return GroupView(
        number=number,
        runs=tuple(RunRow(i + 1, r.created, r.guest_kernel or "?", r.label, str(r.path)) for i, r in enumerate(g.runs)),
        metrics=len(g.series),
        stepped=sum(1 for s in g.series if s.decided_steps),
        environment=environment_line(g.runs[0].environment),
        controls_stepped=tuple(c.key for c in g.controls_stepped),
        family_changes=tuple(
            f"{FAMILY_NAMES.get(role, role)}: before run{'s' if len(at) > 1 else ''} "
            + ", ".join(str(k + 1) for k in at)
            for role, at in g.family_changes().items()
        ),
        equivalent=sum(1 for s in g.series if s.verdict == "equivalent"),
        undecided=sum(1 for s in g.series if s.verdict == "undecided"),
        not_comparable=sum(1 for s in g.series if s.verdict == NOT_COMPARABLE),
        series=tuple(
            SeriesView(
                s.key,
                s.role,
                s.unit,
                s.better,
                f"{s.p_change:.2g}",
                f"{s.p_change_adjusted:.2g}",
                _steps_text(s),
                s.comparable,
                Plot("series", _plot(s, g.runs, threshold)),
            )
            for s in sorted(g.series, key=lambda s: (not s.steps, s.key))
        ),
    )


def history_page(
    groups: list[Group], diffs: dict[str, list[Any]], order: str, threshold: float, alpha: float
) -> HistoryPage:
    from memqual.host.report.badges import VERDICT_COLOURS

    return HistoryPage(
        runs=sum(len(g.runs) for g in groups),
        order=order,
        threshold=f"{threshold:.0%}",
        alpha=f"{alpha:g}",
        test=TEST_NAME,
        not_comparable_colour=VERDICT_COLOURS[NOT_COMPARABLE],
        differences=tuple(DifferenceRow(key, tuple(json.dumps(v) for v in values)) for key, values in diffs.items()),
        groups=tuple(_group_view(gi + 1, g, threshold) for gi, g in enumerate(groups)),
    )


def render(groups: list[Group], diffs: dict[str, list[Any]], order: str, threshold: float, alpha: float) -> str:
    from memqual.host.report import pages

    return pages.render("history.html.j2", page=history_page(groups, diffs, order, threshold, alpha))

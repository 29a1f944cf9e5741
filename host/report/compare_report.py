"""comparison.html: run B against run A, for people, leading with the
decision.

Why it is built so: docs/architecture.md, "Module notes", host/report/compare_report.py.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memqual.host.core.paths import write_private_atomic
from memqual.host.core.printable import format_number as num
from memqual.host.core.printable import one_line
from memqual.host.judge import control_power, decisions
from memqual.host.judge.ab_outcome import ABOutcome
from memqual.host.judge.comparison import MetricComparison, short_labels, verdict_text
from memqual.host.judge.exit_status import ExitStatus
from memqual.host.judge.primaries import CONTROL, EXPLORATORY, PRIMARY
from memqual.host.judge.regime import NOT_COMPARABLE
from memqual.host.judge.results import Results
from memqual.host.judge.verdicts import EQUIVALENT, FASTER, SLOWER, UNDECIDED, VERDICTS
from memqual.host.report import pages
from memqual.host.report.badges import VERDICT_COLOURS, Badge, Count, badge, counts
from memqual.host.report.environment_line import EnvironmentLine, environment_line
from memqual.host.report.figures import Plot
from memqual.host.report.plots import ForestRow, forest_png

# The exploratory family can hold a hundred metrics: its plot shows the
# decided ones and the undecided nearest to a change, up to this many.
PLOT_ROWS = 40


def forest(table_rows: Sequence[decisions.Decision], margin: float, what: str) -> Plot | None:
    """The rows' B / A with intervals on a log axis, the margin band drawn,
    each row's verdict and look at its right."""
    rows = [
        ForestRow(
            r.label[:80],
            VERDICT_COLOURS.get(r.verdict, VERDICT_COLOURS[NOT_COMPARABLE]),
            r.ratio,
            r.ci_low,
            r.ci_high,
            r.verdict + ("" if r.look is None else f", look {r.look}"),
            r.margin,
        )
        for r in table_rows
    ]
    if not any(r.ratio and r.ratio > 0 for r in rows):
        return None
    png = forest_png(
        rows,
        margin,
        f"B / A, 95% interval at the deciding look; band: the {margin:.0%} margin (a row's own band: its own margin); "
        "arrows: clipped at the edge",
    )
    return Plot(f"forest plot of B/A for the {what}", png)


@dataclasses.dataclass(frozen=True)
class DecisionLine:
    """A metric's decision on the page: what decided it and on what."""

    label: str
    settings_changed: str
    verdict: Badge
    note: str  # what an undecided one would need, why one was not compared
    ratio: str  # "1.074 [1.066, 1.082]"
    margin: str
    look: str  # "3 at 4.2 min", "1" for one comparison, "-" undecided
    blocks: str
    test: str  # "p' 0.0004 < 0.0011"
    medians: str  # "1.946 s -> 11.79 s"
    power: str = ""  # a negative control's own power to catch a 10 % move of itself


@dataclasses.dataclass(frozen=True)
class Family:
    """One family's rows, its plot, and the sentence its folded heading says."""

    name: str
    heading: str
    rows: tuple[DecisionLine, ...]
    plot: Plot | None
    open: bool = False
    power_column: str = ""  # the controls: the heading of each one's power


@dataclasses.dataclass(frozen=True)
class LookLine:
    """One look of --until-decided."""

    look: int
    minutes: str
    fraction: str
    alpha: str
    metrics: str
    decided: str
    next_block: str


@dataclasses.dataclass(frozen=True)
class MetricRow:
    """A metric of both runs at full alpha (the descriptive table after
    --until-decided, the same figures as the decisions otherwise)."""

    label: str
    settings_changed: str  # "key: A -> B, ..." or ""
    a_median: str
    b_median: str
    unit: str
    ratio: str
    ci_low: str
    ci_high: str
    role: str
    replicates: str
    p: str
    p_adjusted: str
    p_equivalence_adjusted: str
    verdict: Badge


@dataclasses.dataclass(frozen=True)
class OneSided:
    """A metric found in one run only: not compared."""

    run: str
    key: str


@dataclasses.dataclass(frozen=True)
class Moved:
    """A claim whose verdict differs between the runs, or an environment key
    whose value does."""

    key: str
    a: str
    b: str


@dataclasses.dataclass(frozen=True)
class Refused:
    """A scenario's metrics not compared, and why: a regime covers a whole
    scenario, so the page says it once per scenario and reason."""

    scenario: str
    n: int
    reason: str


@dataclasses.dataclass(frozen=True)
class PatchLine:
    """A patch B was built with (memqual run --patch), as the page names it."""

    subject: str
    files: str
    sha256: str
    href: str  # its text, copied beside the page


GUEST_PATCH_TITLE = "The patch under test"
GUEST_PATCH_BUILT = "Both kernels built from source with memqual's guest config (memqual kernel build)"
HOST_PATCH_TITLE = "The host patch under test"
HOST_PATCH_BUILT = (
    "Both host kernels built from source with images/host.config (memqual kernel build) and run as "
    "--host-kernel A --host-kernel B"
)


@dataclasses.dataclass(frozen=True)
class PatchSection:
    a_kernel: str
    b_kernel: str
    patches: tuple[PatchLine, ...]
    config_diff: tuple[str, ...]
    built_diff: tuple[str, ...]  # the artefacts (bzImage, modules) that differ
    scope: str = ""  # which scenarios ran and why (host/run/patch_scope.py's line)
    title: str = GUEST_PATCH_TITLE
    built: str = GUEST_PATCH_BUILT  # how A and B were built
    axis: str = ""  # a host patch: what moved, one line (host/run/host_scope.py HostPatchRun.axis)


def patch_section(record: Mapping[str, Any] | None) -> PatchSection | None:
    """What OUTPUT/patch.json says of the two kernels and the patches, each
    text shown with its control characters as escapes (a patch's subject
    and file names, a source's label and .config values are the patch's)."""
    if not record:
        return None
    return PatchSection(
        a_kernel=one_line(f"{record['a']['name']} ({record['a']['source']})"),
        b_kernel=one_line(f"{record['b']['name']} ({record['b']['source']})"),
        patches=tuple(
            PatchLine(
                one_line(p["subject"]), one_line(", ".join(map(str, p["files"]))), one_line(p["sha256"]), str(p["text"])
            )
            for p in record.get("patches", ())
        ),
        config_diff=tuple(map(one_line, record.get("config_diff", ()))),
        built_diff=tuple(map(one_line, record.get("built_diff", ()))),
        scope=one_line((record.get("scope") or {}).get("line", "")),
    )


def host_patch_section(record: Mapping[str, Any] | None) -> PatchSection | None:
    """What comparison.json's ``host_patch`` says of the two host kernels,
    the patches and the axis that moved, shown as ``patch_section`` shows
    a guest patch's."""
    section = patch_section(record)
    if section is None or record is None:
        return None
    axis = one_line(record.get("axis", ""))
    return dataclasses.replace(section, title=HOST_PATCH_TITLE, built=HOST_PATCH_BUILT, axis=axis)


@dataclasses.dataclass(frozen=True)
class ComparisonPage:
    """Everything comparison.html shows, in its order."""

    a_name: str
    b_name: str
    threshold: str  # as a percentage
    alpha: str
    primaries: int  # the families' sizes: the metrics not comparable are in none
    controls: int
    exploratory: int
    one_sided_count: int
    a_created: str
    a_environment: EnvironmentLine
    b_created: str
    b_environment: EnvironmentLine
    decided_by: str
    exit_status: int
    exit_reason: str
    exit_colour: str
    sequential: bool
    stopped: str
    counts: tuple[Count, ...]  # the primaries' verdicts
    slower_colour: str
    undecided_colour: str
    not_comparable_colour: str
    controls_flagged: tuple[str, ...]  # negative controls that moved: the host drifted
    regressions: tuple[str, ...]
    undecided: int  # primaries undecided
    not_comparable: int
    refused: tuple[Refused, ...]
    primary: Family
    families: tuple[Family, ...]  # the controls, the exploratory
    power: str  # the controls' power, one line
    power_sufficient: bool
    looks: tuple[LookLine, ...]
    metrics: tuple[MetricRow, ...]  # the full-alpha table
    one_sided: tuple[OneSided, ...]
    claims_moved: tuple[Moved, ...]
    environment: tuple[Moved, ...]
    patch: PatchSection | None = None  # memqual run --patch: the kernels built and the patches on B
    drift: str = "10%"  # the move the controls' power is for


def _metric_row(m: MetricComparison, label: str) -> MetricRow:
    c = m.comparison
    return MetricRow(
        label=label,
        settings_changed=", ".join(f"{k}: {va} -> {vb}" for k, (va, vb) in m.settings_changed.items()),
        a_median=num(c.a.median),
        b_median=num(c.b.median),
        unit=m.unit,
        ratio=num(c.ratio),
        ci_low=num(c.ci_low),
        ci_high=num(c.ci_high),
        role=m.role,
        replicates=f"{c.n_replicates_a}/{c.n_replicates_b}" + (f" ({c.n_blocks} blocks)" if c.paired else ""),
        p=f"{c.p_value:.2g}",
        p_adjusted="n/a" if c.p_adjusted is None else f"{c.p_adjusted:.2g}",
        p_equivalence_adjusted="n/a" if c.p_equivalence_adjusted is None else f"{c.p_equivalence_adjusted:.2g}",
        # A metric not comparable: its scenario's reason is said once, above
        # the table, rather than in a pill as wide as the page.
        verdict=badge(m.verdict, f"{NOT_COMPARABLE} (above)" if m.verdict == NOT_COMPARABLE else verdict_text(m)),
    )


def _decision_line(r: decisions.Decision, m: MetricComparison, sequential: bool) -> DecisionLine:
    if r.look is None:
        look = "-"
    else:
        look = f"{r.look}" + ("" if r.minutes is None else f" at {r.minutes:.1f} min")
    mark = "p'" if sequential else "p"
    if r.verdict == NOT_COMPARABLE or r.level <= 0:
        test = "-"
    else:
        test = f"{mark} {r.p:.2g} {'<' if r.p < r.level else '≥'} {r.level:.2g}" + (
            " (TOST)" if r.test != "difference" else ""
        )
    note = r.text[len(r.verdict) :].strip(" ()") if r.text.startswith(r.verdict) else r.text
    unit = f" {r.unit}" if r.unit else ""
    return DecisionLine(
        label=r.label,
        settings_changed=", ".join(f"{k}: {va} -> {vb}" for k, (va, vb) in m.settings_changed.items()),
        verdict=badge(r.verdict),
        note="its regimes differ: see under the primaries" if r.verdict == NOT_COMPARABLE else note,
        ratio=f"{num(r.ratio)} [{num(r.ci_low)}, {num(r.ci_high)}]",
        margin=f"±{r.margin * 100:.3g}%",
        look=look,
        blocks=(f"{r.blocks}" if r.paired else f"{r.blocks} a side"),
        test=test,
        medians=f"{num(r.a_median)}{unit} → {num(r.b_median)}{unit}",
    )


def _nearest(rows: list[decisions.Decision]) -> list[decisions.Decision]:
    """The decided rows, then the undecided by how far their estimate is
    from no change, up to PLOT_ROWS."""
    import math

    def distance(r: decisions.Decision) -> float:
        return abs(math.log(r.ratio)) if r.ratio and r.ratio > 0 and math.isfinite(r.ratio) else -1.0

    ranked = sorted(rows, key=lambda r: (not r.decided, -distance(r)))
    kept = {r.key for r in ranked[:PLOT_ROWS]}
    return [r for r in rows if r.key in kept]


def _exit(table: decisions.DecidingTable, power: control_power.ControlPower) -> tuple[str, str]:
    if table.exit_status == ExitStatus.HOST_DRIFTED:
        return "a negative control moved: the host drifted, and no decision here is to be trusted", SLOWER
    controls = (
        "no negative control moved"
        if power.sufficient
        else "the negative controls cannot tell whether the host drifted"
        if power.controls
        else "no negative control measured"
    )
    if table.exit_status == ExitStatus.SLOWER:
        return f"a primary metric is slower on B; {controls}", SLOWER
    return f"no primary slower on B; {controls}", EQUIVALENT


def _look_line(x: decisions.LookRow) -> LookLine:
    after = x.next_block
    return LookLine(
        look=x.look,
        minutes="-" if x.minutes is None else f"{x.minutes:.1f}",
        fraction=f"{x.fraction:.0%}",
        alpha=f"{x.alpha:.2g}",
        metrics=str(x.metrics),
        decided=", ".join(x.decided) or "-",
        next_block=(
            "-"
            if after is None
            else f"block {after.block}: " + ", ".join(after.scenarios) + (" + the controls" if after.controls else "")
        ),
    )


def comparison_page(
    outcome: ABOutcome,
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    a_name: str = "A",
    b_name: str = "B",
    *,
    patch: Mapping[str, Any] | None = None,
    host_patch: Mapping[str, Any] | None = None,
) -> ComparisonPage:
    """comparison.html's view of an outcome and its two results files
    (with a guest patch's or a host patch's record, what the A/B moved)."""
    a, b = Results.from_json(a), Results.from_json(b)
    result, table, power = outcome.comparison, outcome.table, outcome.power
    by_key = {m.key: m for m in result.metrics}
    families = result.families()
    refused = collections.Counter(
        (m.scenario, m.regime.reason() if m.regime else NOT_COMPARABLE) for m in result.not_comparable
    )
    labels = short_labels(result.metrics)
    own = control_power.each(control_power.designs_of(result.metrics), power, threshold=result.threshold)

    def family(role: str, name: str, heading: str, is_open: bool = False) -> Family:
        rows = table.of_role(role)
        if role != PRIMARY:
            # A folded family leads with what moved, then what was decided.
            rows = sorted(rows, key=lambda r: (r.verdict not in (SLOWER, FASTER), not r.decided))
        lines = tuple(_decision_line(r, by_key[r.key], table.sequential) for r in rows)
        column = ""
        if role == CONTROL and own:
            lines = tuple(
                dataclasses.replace(line, power=f"{own[r.key]:.0%}" if r.key in own else "-")
                for line, r in zip(lines, rows, strict=True)
            )
            column = f"power alone ({power.drift:.0%} move, {power.unit_text()}, alpha {power.alpha:.2g}/{len(own)})"
        plotted = rows if role != EXPLORATORY else _nearest(rows)
        what = name if len(plotted) == len(rows) else f"{len(plotted)} of the {len(rows)} {name}"
        return Family(name, heading, lines, forest(plotted, table.margin, what) if rows else None, is_open, column)

    primaries = table.of_role(PRIMARY)
    controls = table.of_role(CONTROL)
    exploratory = table.of_role(EXPLORATORY)
    flagged = table.controls_flagged
    control_heading = (
        f"Negative controls ({len(controls)}): "
        + (f"{len(flagged)} moved, the host drifted" if flagged else "none flagged")
        + f"; power to catch a {power.drift:.0%} drift {power.power:.0%}"
        + ("" if power.sufficient or not power.controls else " (too low to tell)")
    )
    decided = sum(1 for r in exploratory if r.decided)
    slower = sum(1 for r in exploratory if r.verdict in (SLOWER, FASTER))
    exploratory_heading = (
        f"Exploratory metrics ({len(exploratory)}): {decided} decided ({slower} slower or faster), "
        "decide nothing" + (" (--all-metrics: they set the exit status)" if result.all_metrics else "")
    )
    reason, colour = _exit(table, power)
    return ComparisonPage(
        a_name=one_line(a_name),  # run --patch names B by its patches' subjects
        b_name=one_line(b_name),
        threshold=f"{result.threshold:.0%}",
        alpha=f"{result.alpha:g}",
        primaries=families["primary"],
        controls=families["control"],
        exploratory=families["exploratory"],
        one_sided_count=len(result.only_in_a) + len(result.only_in_b),
        a_created=str(a.created),
        a_environment=environment_line(a.environment or {}),
        b_created=str(b.created),
        b_environment=environment_line(b.environment or {}),
        decided_by=table.decided_by,
        exit_status=int(table.exit_status),
        exit_reason=reason,
        exit_colour=VERDICT_COLOURS[colour],
        sequential=table.sequential,
        stopped=table.stopped,
        counts=counts((r.verdict for r in primaries), VERDICTS),
        slower_colour=VERDICT_COLOURS[SLOWER],
        undecided_colour=VERDICT_COLOURS[UNDECIDED],
        not_comparable_colour=VERDICT_COLOURS[NOT_COMPARABLE],
        controls_flagged=tuple(r.label for r in flagged),
        regressions=tuple(
            r.label
            for r in (
                table.regressions
                if not result.all_metrics
                else [d for d in table.rows if d.verdict == SLOWER and d.role in (PRIMARY, EXPLORATORY)]
            )
        ),
        undecided=sum(1 for r in primaries if r.verdict == UNDECIDED),
        not_comparable=len(result.not_comparable),
        refused=tuple(Refused(scenario, n, reason) for (scenario, reason), n in refused.items()),
        primary=family(PRIMARY, "primaries", "Primaries", True),
        families=tuple(
            f
            for f, rows in (
                (family(CONTROL, "negative controls", control_heading), controls),
                (family(EXPLORATORY, "exploratory metrics", exploratory_heading), exploratory),
            )
            if rows
        ),
        power=power.line(),
        power_sufficient=power.sufficient,
        looks=tuple(_look_line(x) for x in table.looks),
        metrics=tuple(_metric_row(m, labels[m.key]) for m in result.metrics),
        one_sided=tuple(
            OneSided(name, key)
            for name, keys in ((a_name, result.only_in_a), (b_name, result.only_in_b))
            for key in keys
        ),
        claims_moved=tuple(
            Moved(str(claim["id"]), str(claim["a"]), str(claim["b"]))
            for claim in result.claims
            if claim["a"] != claim["b"]
        ),
        environment=tuple(Moved(str(key), str(va), str(vb)) for key, (va, vb) in result.environment.items()),
        patch=patch_section(patch) or host_patch_section(host_patch),
        drift=f"{power.drift:.0%}",
    )


def render_comparison_html(page: ComparisonPage) -> str:
    return pages.render("comparison.html.j2", page=page)


def write_comparison_html(page: ComparisonPage, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, render_comparison_html(page).encode(), 0o644)
    return path

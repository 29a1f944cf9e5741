"""comparison.html: run B against run A, for people.

``memqual compare A.json B.json --html FILE`` and a two-kernel ``memqual
run`` (OUTPUT/comparison.html) write it.  One self-contained page: where
each run's figures come from, how many metrics got faster or slower and how
many were equivalent or undecided, whether a negative control says the
host drifted, a forest plot of every ratio B/A with its confidence
interval against the threshold band, the table that ``memqual compare``
prints (replicates a side, raw and corrected p, TOST p), the metrics
found on one side only, the metrics not comparable (measured in different
regimes, host/judge/regime.py: listed, never decided), the claims whose verdict
moved and the environment that differs.  The page is templates/comparison.html.j2 over a
``ComparisonPage``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memqual.host.core import pages
from memqual.host.core.paths import write_private_atomic
from memqual.host.judge.comparison import (
    NOT_COMPARABLE,
    SLOWER,
    UNDECIDED,
    VERDICTS,
    MetricComparison,
    RunComparison,
    short_labels,
    verdict_text,
)
from memqual.host.judge.results import Results
from memqual.host.report.html import (
    VERDICT_COLOURS,
    Badge,
    Count,
    EnvironmentLine,
    ForestRow,
    Plot,
    badge,
    counts,
    environment_line,
    forest_png,
    num,
)


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


@dataclasses.dataclass(frozen=True)
class MetricRow:
    """A metric of both runs: medians, ratio and CI, tests and verdict."""

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
    counts: tuple[Count, ...]
    slower_colour: str
    undecided_colour: str
    not_comparable_colour: str
    controls_flagged: tuple[str, ...]  # negative controls that moved: the host drifted
    regressions: tuple[str, ...]
    undecided: int
    not_comparable: int
    refused: tuple[Refused, ...]
    forest: Plot | None
    metrics: tuple[MetricRow, ...]
    one_sided: tuple[OneSided, ...]
    claims_moved: tuple[Moved, ...]
    environment: tuple[Moved, ...]


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


def comparison_page(
    result: RunComparison,
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    a_name: str = "A",
    b_name: str = "B",
) -> ComparisonPage:
    """comparison.html's view of a comparison and its two results files."""
    labels = short_labels(result.metrics)
    plot = forest_plot(result, labels)
    families = result.to_json()["families"]
    refused = collections.Counter(
        (m.scenario, m.regime.reason() if m.regime else NOT_COMPARABLE) for m in result.not_comparable
    )
    return ComparisonPage(
        a_name=a_name,
        b_name=b_name,
        threshold=f"{result.threshold:.0%}",
        alpha=f"{result.alpha:g}",
        primaries=families["primary"],
        controls=families["control"],
        exploratory=families["exploratory"],
        one_sided_count=len(result.only_in_a) + len(result.only_in_b),
        a_created=str(a.get("created", "")),
        a_environment=environment_line(a.get("environment") or {}),
        b_created=str(b.get("created", "")),
        b_environment=environment_line(b.get("environment") or {}),
        counts=counts((m.verdict for m in result.metrics), VERDICTS),
        slower_colour=VERDICT_COLOURS[SLOWER],
        undecided_colour=VERDICT_COLOURS[UNDECIDED],
        not_comparable_colour=VERDICT_COLOURS[NOT_COMPARABLE],
        controls_flagged=tuple(labels[m.key] for m in result.controls_flagged),
        regressions=tuple(labels[m.key] for m in result.regressions),
        undecided=len(result.undecided),
        not_comparable=len(result.not_comparable),
        refused=tuple(Refused(scenario, n, reason) for (scenario, reason), n in refused.items()),
        forest=Plot("forest plot of B/A per metric", plot) if plot else None,
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
    )


def render_comparison_html(
    result: RunComparison,
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    a_name: str = "A",
    b_name: str = "B",
) -> str:
    return pages.render("comparison.html.j2", page=comparison_page(result, a, b, a_name, b_name))


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

"""What the pages share besides their templates (host/report/pages.py renders
them): numbers and PNG plots (from host/report/figures.py), verdict badges and their
colours, and the line that says where a run's figures come from, as typed
values the templates (host/report/templates/macros.html.j2) lay out.

Every page is one self-contained file: no script, no external resource.
Nothing here returns markup: escaping is the templates'.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memqual.host.core.printable import format_number
from memqual.host.judge.claims.model import DIRECTION_ONLY, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, UNDERPOWERED
from memqual.host.judge.regime import NOT_COMPARABLE
from memqual.host.judge.verdicts import CHANGED, EQUIVALENT, FASTER, RUNS_DIFFER, SLOWER, UNDECIDED

# The number format and the plot helpers live in host/report/figures.py (below the
# subjects, whose own sections draw with them); the pages import them from here.
from memqual.host.report.figures import Plot as Plot
from memqual.host.report.figures import png as png
from memqual.host.report.figures import pyplot as pyplot
from memqual.host.report.figures import tidy

GREY = "#6b7280"

# One colour per verdict, of a claim (memqual.host.judge.claims) and of a comparison
# (memqual.host.judge.comparison); "underpowered" and "undecided" share one colour.
VERDICT_COLOURS = {
    REPRODUCED: "#1a7f37",
    DIRECTION_ONLY: "#b7791f",
    NOT_REPRODUCED: "#c62828",
    UNDERPOWERED: "#7c3aed",
    NOT_MEASURABLE: GREY,
    FASTER: "#15803d",
    SLOWER: "#b91c1c",
    EQUIVALENT: "#0e7490",
    UNDECIDED: "#7c3aed",
    NOT_COMPARABLE: GREY,
    CHANGED: "#b7791f",
    RUNS_DIFFER: GREY,
}

num = format_number


@dataclasses.dataclass(frozen=True)
class Badge:
    """A verdict as a coloured pill (macros.html.j2's ``badge``)."""

    text: str
    colour: str


def badge(verdict: str, text: str | None = None) -> Badge:
    """The pill of ``verdict`` in its colour, saying ``text`` instead of the
    verdict's name when given."""
    return Badge(text or verdict, VERDICT_COLOURS.get(verdict, GREY))


@dataclasses.dataclass(frozen=True)
class Count:
    """How many claims or metrics got one verdict: a box of the badges row."""

    verdict: str
    n: int
    colour: str


def counts(verdicts: Iterable[str], order: Sequence[str]) -> tuple[Count, ...]:
    """One box per verdict of ``order``, zero included."""
    tally = collections.Counter(verdicts)
    return tuple(Count(v, tally.get(v, 0), VERDICT_COLOURS.get(v, GREY)) for v in order)


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
    tidy(fig)
    return png(fig)


@dataclasses.dataclass(frozen=True)
class EnvironmentLine:
    """Where a run's figures come from, in one line under a page's title:
    the accelerator (in bold) and why, then host kernel, QEMU and guest
    kernel."""

    accel: str = ""
    accel_reason: str = ""
    rest: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.accel or self.rest)

    @property
    def text(self) -> str:
        accel = self.accel + (f" ({self.accel_reason})" if self.accel_reason else "")
        return " · ".join(bit for bit in (accel, *self.rest) if bit)


def clock_words(label: str, vcpus: Any = None) -> str:
    """The clock of a results file's guests, in words a reader needs: on
    icount a guest-timed figure counts guest instructions, not time."""
    if label.startswith("icount"):
        shift = label.partition(":")[2] or "?"
        turns = f", {vcpus} vCPUs taking turns in one thread" if isinstance(vcpus, int) and vcpus > 1 else ""
        return (
            f"clock {label}: guest-timed figures count guest instructions (2^{shift} ns each{turns}); "
            "host-timed ones are wall time"
        )
    if label.startswith("auto"):
        shift = label.partition(":")[2] or "?"
        return (
            f"clock {label}: each scenario on the clock that decides its primaries, icount (guest instructions, "
            f"2^{shift} ns each) or wall time; every metric's row names its own"
        )
    return f"clock {label}: wall time"


def environment_line(env: Mapping[str, Any]) -> EnvironmentLine:
    """The line of a results file's environment."""
    rest = []
    if env.get("host_kernel"):
        rest.append(f"host kernel {env['host_kernel']}")
    if env.get("qemu"):
        qemu = str(env["qemu"]).split(" (")[0]
        origin = str(env.get("qemu_origin") or "").split(" (cache ")[0]
        named = qemu if qemu.lower().startswith("qemu") else f"QEMU {qemu}"
        rest.append(named + (f" ({origin})" if origin else ""))
    if env.get("clock"):
        rest.append(clock_words(str(env["clock"]), env.get("vcpus")))
    if env.get("guest_cpu"):
        # QEMU's CPU model as the guest saw it: it changes between QEMU versions.
        rest.append(f"guest CPU {env['guest_cpu']}")
    if env.get("guest_kernel") or env.get("guest_kernel_sha256"):
        sha = str(env.get("guest_kernel_sha256") or "")[:12]
        rest.append(f"guest kernel {env.get('guest_kernel') or ''}" + (f" (sha256 {sha}...)" if sha else ""))
    return EnvironmentLine(
        str(env["accel"]).upper() if env.get("accel") else "",
        str(env.get("accel_reason") or "") if env.get("accel") else "",
        tuple(rest),
    )

"""Plots as every page shows them: matplotlib without a display, a figure
as base64 PNG, and the typed Plot a template lays out.  The one number
format is memqual.host.core.printable.format_number (verdict texts use it
too).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from memqual.host.core.printable import printable


@dataclasses.dataclass(frozen=True)
class Plot:
    """A PNG in a page (macros.html.j2's ``img``): its alt text and its
    base64 data, as ``png`` gives it."""

    alt: str
    png: str


def pyplot() -> Any:
    """matplotlib.pyplot without a display, in the pages' style."""
    # Imported here: matplotlib takes a second to import, and most commands
    # (and ``memqual --help``) draw nothing.
    import matplotlib

    matplotlib.use("Agg")  # no display; before pyplot is imported anywhere
    import matplotlib.pyplot as plt

    # Labels come from data (metric names, hosts): "$" is text, never
    # mathtext, which refuses some of it (``$\\frac{1}{$``) and aborts the page.
    plt.rcParams.update(
        {"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "text.parse_math": False}
    )
    return plt


def clean_texts(fig: Any) -> None:
    """Every text of ``fig`` with its control characters (but its line
    breaks) shown as escapes (host/core/printable.py), the tick labels an axis draws from a fixed
    list among them: labels come from records and hosts, and matplotlib's
    missing-glyph warning would echo an escape sequence to the operator's
    terminal raw."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    for text in fig.findobj(Text):
        shown = printable(text.get_text())
        if shown != text.get_text():
            text.set_text(shown)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for formatter in (axis.get_major_formatter(), axis.get_minor_formatter()):
                # set_ticklabels keeps its labels in one of these (which one
                # depends on matplotlib's version) and draws them later.
                if isinstance(formatter, FixedFormatter):
                    formatter.seq = [printable(label) for label in formatter.seq]
                elif isinstance(formatter, FuncFormatter) and not getattr(formatter.func, ESCAPES, False):
                    formatter.func = escaping(formatter.func)


ESCAPES = "_memqual_escapes"


def escaping(func: Callable[..., object]) -> Callable[..., str]:
    """``func``'s labels with their control characters escaped (once)."""

    def label(value: float, pos: int | None = None) -> str:
        return printable(func(value, pos))

    setattr(label, ESCAPES, True)
    return label


@contextlib.contextmanager
def warnings_printable() -> Iterator[None]:
    """What matplotlib warns while drawing, warned again with its control
    characters escaped: a text ``clean_texts`` could not reach (a label a
    formatter makes at draw time) still never reaches a terminal raw."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for found in caught:
        warnings.warn_explicit(printable(found.message), found.category, found.filename, found.lineno)


def tidy(fig: Any) -> None:
    """``clean_texts``, then the layout (which draws the texts)."""
    clean_texts(fig)
    with warnings_printable():
        fig.tight_layout()


def png(fig: Any) -> str:
    """A figure as base64 PNG for an ``<img src='data:image/png;base64,...'>``;
    the figure is closed."""
    clean_texts(fig)
    buf = io.BytesIO()
    with warnings_printable():
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt  # imported by pyplot() already, which drew the figure

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")

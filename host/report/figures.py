"""Plots as every page shows them: matplotlib without a display, a figure
as base64 PNG, and the typed Plot a template lays out.  The one number
format is memqual.host.core.printable.format_number (verdict texts use it
too).
"""

from __future__ import annotations

import base64
import dataclasses
import io
from typing import Any


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


def png(fig: Any) -> str:
    """A figure as base64 PNG for an ``<img src='data:image/png;base64,...'>``;
    the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt  # imported by pyplot() already, which drew the figure

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")

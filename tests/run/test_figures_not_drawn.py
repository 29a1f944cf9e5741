"""tests/run checks the run's flow, not its pictures: its figures are built
and saved as one pixel, never drawn (tests/conftest.py), which took half
its CPU time.  tests/report draws them for real."""

from __future__ import annotations

import io

from undrawn_figures import ONE_PIXEL

from memqual.host.report.figures import pyplot


def test_a_figure_here_is_saved_as_one_pixel_without_its_layout() -> None:
    fig, ax = pyplot().subplots()
    ax.set_title("drawn?")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    pyplot().close(fig)
    assert buf.getvalue() == ONE_PIXEL

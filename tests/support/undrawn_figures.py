"""Figures built but not drawn: for the tests of the run's flow (its blocks,
looks, files and decisions), where matplotlib's drawing of every page's
figures took half their CPU time.  The pictures themselves are
tests/report's subject, which draws them for real."""

from __future__ import annotations

import base64
from typing import Any

import pytest

# The smallest valid PNG (one transparent pixel): a page still embeds a
# well-formed image.
ONE_PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


def undraw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every matplotlib figure saved as ``ONE_PIXEL``, its layout not computed."""
    from matplotlib.figure import Figure

    def save(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> None:
        fname.write(ONE_PIXEL)

    monkeypatch.setattr(Figure, "savefig", save)
    monkeypatch.setattr(Figure, "tight_layout", lambda self, *a, **k: None)

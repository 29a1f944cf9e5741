"""This room's tests check the run's flow and decisions, not its pictures:
figures are built but not drawn (tests/support/undrawn_figures.py)."""

from __future__ import annotations

import pytest
from undrawn_figures import undraw


@pytest.fixture(autouse=True)
def figures_not_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    undraw(monkeypatch)

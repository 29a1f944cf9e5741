"""A metric's role in a comparison, read from the scenario table: a
primary of its row (host/core/primary.py: why, instrument, margin,
measured spreads), any metric of a negative control's row, or
exploratory.  Nothing here is per scenario: each row carries its own
(host/<subject>/table.py).  docs/architecture.md, "Module notes".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memqual.host.core import scenario
from memqual.host.core.primary import Primary

PRIMARY = "primary"
CONTROL = "control"
EXPLORATORY = "exploratory"


def role(
    name: str,
    metric: str,
    variant: Mapping[str, Any] | None = None,
    clock: str = "",
    host_under_test: bool = False,
) -> str:
    """PRIMARY, CONTROL or EXPLORATORY, for a record of scenario ``name``
    read on ``clock``, its guest on a host under test where ``host_under_test``."""
    if is_control(name):
        return CONTROL
    if primary_of(name, metric, variant, clock, host_under_test) is not None:
        return PRIMARY
    return EXPLORATORY


def is_primary(
    name: str,
    metric: str,
    variant: Mapping[str, Any] | None = None,
    clock: str = "",
    host_under_test: bool = False,
) -> bool:
    return role(name, metric, variant, clock, host_under_test) == PRIMARY


def primary_of(
    name: str,
    metric: str,
    variant: Mapping[str, Any] | None = None,
    clock: str = "",
    host_under_test: bool = False,
) -> Primary | None:
    """The primary this record's metric decides on ``clock`` (on a host
    under test where ``host_under_test``), if any."""
    row = scenario.find(name)
    if row is None:
        return None
    return next((p for p in row.primaries if p.matches(metric, variant, clock, host_under_test)), None)


def margin(
    name: str,
    metric: str,
    variant: Mapping[str, Any] | None,
    clock: str,
    default: float,
    host_under_test: bool = False,
) -> float:
    """The equivalence margin of this metric: its primary's (on a host
    under test where both arms ran on one), else ``default``."""
    found = primary_of(name, metric, variant, clock, host_under_test)
    return found.margin_on(clock, host_under_test) if found is not None else default


def is_control(name: str) -> bool:
    """Whether scenario ``name`` is a negative control (its row says so)."""
    row = scenario.find(name)
    return row is not None and row.control


def controls() -> frozenset[str]:
    """The negative controls' scenario names."""
    return frozenset(row.name for row in scenario.table() if row.control)

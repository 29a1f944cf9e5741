"""Which scenario rows, and so which e2e tests, run under a host under test
(``--host-kernel``): a row whose test reads only its guests' own clock and
turns no host knob (clock_plan.py ``shares_host``), or whose row says its
test runs there (``Scenario.on_a_host_under_test``: KSM's drive L1's
ksmd); a test, when every row it records does.  The one source for e2e's
skips (e2e/base.py) and a host patch's scope (host/run/host_scope.py):
docs/architecture.md, "host/judge/host_under_test_plan.py".
"""

from __future__ import annotations

import functools

from memqual.host.core import scenario
from memqual.host.core.primary import GUEST_CLOCK
from memqual.host.judge.clock_plan import ICOUNT_LABEL, shares_host


def own_reason(row: scenario.Scenario[object]) -> str:
    """Why ``row`` alone would read or turn this machine's host under a host
    under test, in a few words; "" when it runs there."""
    if row.off_a_host_under_test:
        return row.off_a_host_under_test
    if row.on_a_host_under_test or shares_host(row):
        return ""
    if row.knobs:
        return f"it sets this machine's {', '.join(k.what for k in row.knobs)}"
    host_read = [p for p in row.primaries if p.instrument_on(ICOUNT_LABEL) != GUEST_CLOCK]
    if host_read:
        return f"its {host_read[0].metric} is a {host_read[0].instrument} read on this machine"
    return "it has no primary on its guests' own clock"


def why_not(row: scenario.Scenario[object], rows: tuple[scenario.Scenario[object], ...] | None = None) -> str:
    """Why the test of ``row`` does not run under a host under test ("":
    it does).  A test runs there only when every row it records does: a
    row that would run is held back by a sibling of its test."""
    if not row.e2e:
        return "no e2e test records it"
    mine = own_reason(row)
    if mine:
        return mine
    for sibling in scenario.table() if rows is None else rows:
        theirs = own_reason(sibling) if sibling.e2e == row.e2e else ""
        if theirs:
            return f"its test records {sibling.name} too, and {theirs}"
    return ""


@functools.cache
def tests() -> frozenset[str]:
    """The e2e tests (``test_file_stem:Class.method``, the rows' ``e2e``)
    that run under a host under test: those whose every row does."""
    return frozenset(row.e2e for row in scenario.table() if row.e2e and not why_not(row))


@functools.cache
def row_tests() -> frozenset[str]:
    """Every test a row names: where ``tests`` alone decides."""
    return frozenset(row.e2e for row in scenario.table() if row.e2e)


def reason_for(reference: str) -> str:
    """Why the test ``reference`` (``test_file_stem:Class.method``) does
    not run under a host under test, in its rows' words; "" when it runs
    there or no row names it."""
    for row in scenario.table():
        if row.e2e == reference:
            reason = why_not(row)
            if reason:
                return reason
    return ""

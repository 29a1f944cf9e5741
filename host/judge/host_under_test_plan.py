"""Which scenario rows, and so which e2e tests, run under a host under test
(``--host-kernel``: the guests' host is an L1 memqual boots).  A row runs
there when all its test reads is its guests' own clock and it turns no host
knob (host/judge/clock_plan.py ``shares_host``: under a host under test
that clock is L1's, the host's work included), or when its row says its
test runs there anyway (``Scenario.on_a_host_under_test``: KSM's tests
drive L1's ksmd).  Any other row's test would turn or read this machine's
host (its knobs, its processes, its /dev/kvm), not the host under test.

One source for both sides: e2e/base.py's GuestTest asks ``tests`` whether
to run or skip, and a host patch's scope (host/run/host_scope.py) keeps
only the rows whose tests run, naming each dropped one with ``why_not``.
docs/host-under-test.md, "Using it" and "Qualifying a host patch".
"""

from __future__ import annotations

import functools

from memqual.host.core import scenario
from memqual.host.core.primary import GUEST_CLOCK
from memqual.host.judge.clock_plan import ICOUNT_LABEL, shares_host


def own_reason(row: scenario.Scenario[object]) -> str:
    """Why ``row`` alone would read or turn this machine's host under a host
    under test, in a few words; "" when it runs there."""
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

"""What the icount clock changes in an A/B's plan: the checks' reserve of
the budget, and the scenario rows' sizes on icount."""

from __future__ import annotations

import pytest

from memqual.host.run import blocks


def test_checks_reserve_is_longer_on_icount():
    """Every vCPU in one host thread: a check costs about three times a
    wall run, and the budget keeps that much for the checks."""
    wall = blocks.checks_reserve_s(9)
    icount = blocks.checks_reserve_s(9, icount=True)
    assert icount > 2.5 * wall
    assert icount == pytest.approx(18 * blocks.CHECK_RUN_ICOUNT_S + blocks.job_overhead_s(18))
    assert blocks.checks_reserve_s(0, icount=True) == 0.0
    with pytest.raises(ValueError):
        blocks.checks_reserve_s(-1, icount=True)

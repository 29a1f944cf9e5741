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


def test_on_icount_the_drivers_guest_timed_slope_decides_the_request_size():
    """The host-timed slope moved fivefold in one icount block of 6.1
    against 6.12; the driver's own span, read with the guest's clock,
    decides the primary there, and the wall clock keeps the host's."""
    from memqual.host.core.primary import GUEST_CLOCK
    from memqual.host.judge.primaries import is_primary, primary_of

    assert is_primary("balloon.request_size", "per_page_ns", {}, "wall")
    assert not is_primary("balloon.request_size", "driver_per_page_ns", {}, "wall")
    assert is_primary("balloon.request_size", "driver_per_page_ns", {}, "icount:4")
    assert not is_primary("balloon.request_size", "per_page_ns", {}, "icount:4")
    found = primary_of("balloon.request_size", "driver_per_page_ns", {}, "icount:4")
    assert found is not None and found.instrument_on("icount:4") == GUEST_CLOCK
    spread = found.spread_on("icount:4")
    assert spread is not None and spread.blocks >= 3 and spread.sd < 0.1


def test_primaries_icount_spreads_more_carry_their_spread_and_say_to_use_the_wall_clock():
    """Where an icount block spread far more than the wall clock's, the
    row says so and what decides it instead."""
    from memqual.host.judge.primaries import primary_of

    for scenario, metric, variant in (
        ("balloon.floor", "floor_mib", {}),
        ("balloon.free_page_reporting", "rss_return_s", {"free_page_reporting": True}),
    ):
        found = primary_of(scenario, metric, variant, "icount:4")
        assert found is not None
        on_icount, on_wall = found.spread_on("icount:4"), found.spread_on("wall")
        assert on_icount is not None and on_wall is not None and on_icount.sd > 5 * on_wall.sd
        assert "wall clock" in found.needs

"""A control's own power (control_power.alone): what comparison.html's
controls table shows beside each one."""

from __future__ import annotations

import math

from memqual.host.judge import control_power


def _design(blocks: int, sd: float) -> control_power.ControlDesign:
    return control_power.ControlDesign("c", blocks, blocks, blocks, sd / math.sqrt(blocks))


def test_a_tight_control_on_many_blocks_would_be_caught_and_a_noisy_one_on_two_would_not():
    tight = control_power.alone(_design(8, 0.01), alpha=0.01 / 26, threshold=0.05)
    noisy = control_power.alone(_design(2, 0.14), alpha=0.01 / 26, threshold=0.05)
    assert tight > 0.95 and noisy < 0.02


def test_the_power_rises_with_blocks_and_falls_with_the_level():
    by_blocks = [control_power.alone(_design(n, 0.05), alpha=0.001, threshold=0.05) for n in (3, 6, 12)]
    assert by_blocks[0] < by_blocks[1] < by_blocks[2]
    assert control_power.alone(_design(6, 0.05), alpha=0.01, threshold=0.05) > by_blocks[1]


def test_a_move_inside_the_margin_is_never_flagged():
    # A 3 % move with a 5 % margin: the estimate must lie beyond the margin.
    low = control_power.alone(_design(30, 0.001), alpha=0.01, threshold=0.05, drift=0.03)
    assert low == 0.0

"""KSM's rows: the volatile scan's sizes where it runs."""

from __future__ import annotations

import pytest

from memqual.host.core.profiles import AB, QUICK, SMOKE
from memqual.host.ksm import table


@pytest.mark.parametrize(
    ("profile", "on_l1", "smart_windows"),
    [
        # On this machine the A/B's median over 3 windows leaves out bursts of other work.
        (AB, False, 3),
        # In L1 nothing else runs: one window.
        (AB, True, 1),
        (QUICK, True, 1),
        (SMOKE, False, 1),
    ],
)
def test_one_smart_window_a_turn_on_a_host_under_test(profile: str, on_l1: bool, smart_windows: int) -> None:
    sizes = table.VOLATILE[profile]
    chosen = table.volatile_sizes(sizes, on_l1)
    assert chosen.smart_windows == smart_windows
    # Nothing else changes: the guests, the windows and the reference scans are the profile's.
    assert (chosen.guests, chosen.windows, chosen.reference_scans) == (
        sizes.guests,
        sizes.windows,
        sizes.reference_scans,
    )

"""Guests of an A/B block boot cold: a warm start would repeat one saved
boot's memory state in every block of an arm (e2e/base.py)."""

from types import SimpleNamespace

import pytest

from memqual.e2e.base import GuestTest
from memqual.host.core.qemu import MachineConfig


@pytest.mark.parametrize(
    ("block", "warm"),
    [
        (0, True),  # no A/B: the snapshot may be restored
        (1, False),
        (7, False),
    ],
)
def test_a_blocks_guest_boots_cold(block, warm):
    test = SimpleNamespace(block=block)
    assert GuestTest.block_config(test, MachineConfig()).warm is warm  # type: ignore[arg-type]


def test_a_config_already_cold_stays_cold_outside_blocks():
    assert GuestTest.block_config(SimpleNamespace(block=0), MachineConfig(warm=False)).warm is False  # type: ignore[arg-type]

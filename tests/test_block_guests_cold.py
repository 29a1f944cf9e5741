"""Guests of an A/B block boot cold: a warm start would repeat one saved
boot's memory state in every block of an arm (e2e/base.py)."""

from types import SimpleNamespace
from typing import cast

import pytest

from memqual.e2e.base import GuestTest
from memqual.host.core.qemu import MachineConfig


def as_test(block: int) -> GuestTest:
    """What block_config reads of a test: its block (0 outside an A/B)."""
    return cast(GuestTest, SimpleNamespace(block=block))


@pytest.mark.parametrize(
    ("block", "warm"),
    [
        (0, True),  # no A/B: the snapshot may be restored
        (1, False),
        (7, False),
    ],
)
def test_a_blocks_guest_boots_cold(block, warm):
    assert GuestTest.block_config(as_test(block), MachineConfig()).warm is warm


def test_a_config_already_cold_stays_cold_outside_blocks():
    assert GuestTest.block_config(as_test(0), MachineConfig(warm=False)).warm is False

"""Guests of an A/B block boot cold, and so do a measuring test's guests
under ``memqual run``: a warm start would repeat one saved boot's memory
state in every block of an arm, or every run of a host (e2e/base.py)."""

from types import SimpleNamespace
from typing import cast

import pytest

from memqual.e2e.base import GuestTest
from memqual.host.core.qemu import MachineConfig


def as_test(block: int, measures: bool = True) -> GuestTest:
    """What block_config reads of a test: its block (0 outside an A/B) and
    whether it measures."""
    return cast(GuestTest, SimpleNamespace(block=block, measures=lambda: measures))


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


@pytest.mark.parametrize(("measures", "warm"), [(True, False), (False, True)])
def test_memqual_runs_measuring_guests_boot_cold_outside_blocks(monkeypatch, measures, warm):
    """memqual run sets MEMQUAL_COLD_MEASURING for its jobs: a measuring
    test's guest boots cold outside blocks; one that measures nothing (the
    warm-start tests themselves) keeps its warm start."""
    from memqual.host.core import settings
    from memqual.host.run import avocado as run_avocado

    config = SimpleNamespace(profile="quick", clock=SimpleNamespace(label="wall"), environment={})
    env = run_avocado.scenario_environment(config, None)  # type: ignore[arg-type]  # the fields it reads
    assert env[settings.COLD_MEASURING] == "1"
    monkeypatch.setenv(settings.COLD_MEASURING, env[settings.COLD_MEASURING])
    assert GuestTest.block_config(as_test(0, measures), MachineConfig()).warm is warm
    monkeypatch.delenv(settings.COLD_MEASURING)
    assert GuestTest.block_config(as_test(0, measures), MachineConfig()).warm is True  # avocado run e2e/ directly

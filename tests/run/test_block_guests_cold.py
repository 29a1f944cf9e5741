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

    config = SimpleNamespace(profile="quick", clock=SimpleNamespace(label="wall"), environment={}, hosts=())
    env = run_avocado.scenario_environment(config, None)  # type: ignore[arg-type]  # the fields it reads
    assert env[settings.COLD_MEASURING] == "1"
    monkeypatch.setenv(settings.COLD_MEASURING, env[settings.COLD_MEASURING])
    assert GuestTest.block_config(as_test(0, measures), MachineConfig()).warm is warm
    monkeypatch.delenv(settings.COLD_MEASURING)
    assert GuestTest.block_config(as_test(0, measures), MachineConfig()).warm is True  # avocado run e2e/ directly


@pytest.mark.parametrize("hosts", [1, 2])
def test_one_host_under_test_is_every_jobs_and_two_are_each_arms(monkeypatch, hosts):
    """A run on one host under test hands it to every job it starts (its
    guests run in L1 whatever the arm); with two, each arm's variant names
    its own and the job's environment names none."""
    from memqual.host.core import nested, settings
    from memqual.host.run import avocado as run_avocado

    monkeypatch.setenv(settings.HOST_KERNEL, "stale-from-the-shell")
    both = (nested.parse_host("6.12.111+deb12-amd64", ["kvm.mmio_caching=0"]), nested.parse_host("6.1.0-57-amd64"))
    config = SimpleNamespace(profile="ab", clock=SimpleNamespace(label="icount:0"), environment={}, hosts=both[:hosts])
    env = run_avocado.scenario_environment(config, None)  # type: ignore[arg-type]  # the fields it reads
    if hosts == 1:
        assert env[settings.HOST_KERNEL] == "6.12.111+deb12-amd64"
        assert env[settings.HOST_KERNEL_PARAMS] == "kvm.mmio_caching=0"
    else:
        assert settings.HOST_KERNEL not in env and settings.HOST_KERNEL_PARAMS not in env


@pytest.mark.parametrize(
    ("block", "measures", "start"),
    [
        (0, True, "cold"),  # a measuring test of memqual run
        (2, False, "cold"),  # an A/B's block
        (0, False, "warm"),  # a test that measures nothing
    ],
)
def test_a_host_under_test_starts_warm_only_where_a_guest_of_this_machine_would(monkeypatch, block, measures, start):
    """Under a host under test the guest's start follows the same choice:
    its config (cold for a measuring test of memqual run, or in a block)
    decides between a restore of the saved L1 and a cold boot."""
    from memqual.host.core import nested, settings, snapshot
    from memqual.host.core.kernelspec import KernelSpec
    from memqual.host.core.machine import Machine

    monkeypatch.setenv(settings.COLD_MEASURING, "1")
    monkeypatch.setattr(snapshot, "usable", lambda: True)
    started: list[str] = []
    monkeypatch.setattr(snapshot, "start", lambda machine: started.append("warm"))
    monkeypatch.setattr(Machine, "boot_cold", lambda machine: started.append("cold"))
    config = GuestTest.block_config(as_test(block, measures), MachineConfig())
    vm = Machine(config, host=nested.HostUnderTest(KernelSpec("6.1.0-57-amd64")))
    vm._launch()  # the start's choice alone: no L1 is built or booted
    assert started == [start]

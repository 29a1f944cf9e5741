"""Host kernels as an A/B axis: two --host-kernel make two arms, each arm's
variants name its host, the comparison of the two arms compares across
hosts on purpose (and only then), and what a run prints names each arm's
host."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memqual.host.core import nested
from memqual.host.core.errors import BadInput
from memqual.host.run import ab_run, blocks
from memqual.host.run import config as run_config

HOST_A = nested.parse_host("6.1.0-57-amd64", ["kvm.mmio_caching=0"])
HOST_B = nested.parse_host("6.12.111+deb12-amd64", ["kvm.mmio_caching=0"])


@pytest.mark.parametrize(
    ("kernels", "qemus", "hosts", "pairing"),
    [
        (0, 0, 1, ((None, None),)),
        (1, 0, 1, ((0, None),)),
        (0, 0, 2, ((None, None), (None, None))),
        (1, 1, 2, ((0, 0), (0, 0))),
        (2, 0, 2, ((0, None), (1, None))),
        (0, 2, 1, ((None, 0), (None, 1))),
    ],
)
def test_two_hosts_make_two_arms(kernels: int, qemus: int, hosts: int, pairing: object) -> None:
    assert run_config.arm_pairing(kernels, qemus, hosts) == pairing


def test_three_hosts_are_refused() -> None:
    with pytest.raises(BadInput, match="--host-kernel given 3 times"):
        run_config.arm_pairing(0, 0, 3)


def _config(tmp_path: Path, hosts: tuple[nested.HostUnderTest, ...]) -> run_config.RunConfig:
    base = run_config.RunConfig(output=tmp_path / "out")
    return dataclasses.replace(base, hosts=hosts, pairing=run_config.arm_pairing(0, 0, len(hosts)))


def test_each_arm_gets_its_host_and_its_variants_name_it(tmp_path: Path) -> None:
    arms = run_config.run_arms(_config(tmp_path, (HOST_A, HOST_B)))
    assert [(a.label, a.host) for a in arms] == [("A", HOST_A), ("B", HOST_B)]
    params = {a.label: a.variant_params() for a in arms}
    out = blocks.variants(blocks.block_order(1, 1), params)
    seen = [{k: v for _, k, v in variant["variant"][0][1]} for variant in out]
    assert [(p["arm"], p["host_kernel"], p["host_kernel_params"]) for p in seen] == [
        ("A", "6.1.0-57-amd64", "kvm.mmio_caching=0"),
        ("B", "6.12.111+deb12-amd64", "kvm.mmio_caching=0"),
    ]
    assert "host 6.12.111+deb12-amd64 kvm.mmio_caching=0 (under test)" in ab_run.arm_line(arms[1])
    # One host: both arms on it (two kernels make the arms).
    one = dataclasses.replace(_config(tmp_path, (HOST_A,)), pairing=run_config.arm_pairing(2, 0, 1))
    kernels = tuple(run_config.GuestKernel(x, tmp_path / f"bz{x}", None, x * 64) for x in "AB")
    arms = run_config.run_arms(dataclasses.replace(one, kernels=kernels))
    assert [a.host for a in arms] == [HOST_A, HOST_A]
    # None: this machine's, and the variants say so with empty names.
    assert run_config.Arm("A", None, None).variant_params().host_kernel == ""
    assert "this machine's host" in ab_run.arm_line(run_config.Arm("A", None, None))


def test_on_icount_every_test_of_a_run_on_hosts_under_test_shares_this_machine(tmp_path: Path) -> None:
    """Each test's guests run on an L1 of their own, whose instructions are
    the clock: the KSM tests that drive L1's ksmd run side by side too, and
    on the wall clock nothing does."""
    from memqual.host.core import clock
    from memqual.host.run import block_jobs
    from memqual.host.run.config import RunConfig

    listed = ["e2e/test_ksm.py:KsmTest.test_volatile_scan_4k", "e2e/test_fault.py:FaultTest.test_anon"]
    host = nested.parse_host("6.12.111+deb12-amd64", [])
    on_hosts = RunConfig(output=tmp_path, hosts=(host,), clock=clock.icount(0))
    assert block_jobs.split_beside_others(on_hosts, listed) == (listed, [])
    here = dataclasses.replace(on_hosts, hosts=())
    assert block_jobs.split_beside_others(here, listed) == (listed[1:], listed[:1])
    assert block_jobs.split_beside_others(dataclasses.replace(on_hosts, clock=clock.WALL_CLOCK), listed) == ([], [])
    assert block_jobs.split_beside_others(on_hosts, None) == ([], [])  # avocado could not list them

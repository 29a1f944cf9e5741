"""Fixtures that more than one test module needs.  None is autouse: a module
that wants one for every test says so with ``pytestmark``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fake_kernel
import pytest
from fake_avocado import fake  # noqa: F401  (the fake avocado fixture, for any test that names it)

from memqual.host.core import kvm as kvm_api
from memqual.host.core import kvm_uapi as uapi
from memqual.images.build import KernelSource


@pytest.fixture
def memqual_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """memqual's cache (images, snapshots) in the test's own directory, so
    no test reads or fills the user's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEMQUAL_CACHE", str(cache))
    return cache


@pytest.fixture
def kernel(tmp_path: Path, memqual_cache: Path) -> KernelSource:
    """A tiny fake kernel build (tests/support/fake_kernel.py) to build images from."""
    bzimage, modules = fake_kernel.make(tmp_path / "kernel")
    return KernelSource(bzimage, modules)


@pytest.fixture
def snapshot_cache(memqual_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache for warm-start snapshots, with warm starts left to their
    default and one fixed QEMU version (it is part of a snapshot's key)."""
    monkeypatch.delenv("MEMQUAL_WARM", raising=False)
    monkeypatch.setattr("memqual.host.core.qemu.qemu_version", lambda binary=None: "7.2.22")
    return memqual_cache


@pytest.fixture
def kvm() -> Iterator[kvm_api.Kvm]:
    """/dev/kvm, open, with the one capability every memslot needs; the
    test is skipped, with the reason, where there is none."""
    try:
        handle = kvm_api.Kvm()
    except kvm_api.KvmUnavailable as exc:
        pytest.skip(str(exc))
    with handle:
        if not handle.check_extension(uapi.KVM_CAP_USER_MEMORY):
            pytest.skip("/dev/kvm has no KVM_CAP_USER_MEMORY")
        yield handle

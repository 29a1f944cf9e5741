"""Fixtures that more than one test module needs.  None is autouse: a module
that wants one for every test says so with ``pytestmark``; one room, tests/run,
gets ``figures_not_drawn`` for every test here (below)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fake_kernel
import pytest
from fake_avocado import fake  # noqa: F401  (the fake avocado fixture, for any test that names it)
from undrawn_figures import undraw

from memqual.host.core import kvm as kvm_api
from memqual.host.core import kvm_uapi as uapi
from memqual.images.build import KernelSource

# tests/run checks the run's flow (blocks, looks, files, decisions), not its
# pictures: drawing every page's figures there took half its CPU time.
# tests/report draws them for real.
UNDRAWN_ROOMS = ("run",)


@pytest.fixture
def figures_not_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib figures built, saved as one pixel, never laid out or drawn."""
    undraw(monkeypatch)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # Named among the item's fixtures: a usefixtures mark added here
        # comes after pytest has read the marks and is never set up
        # (tests/run/test_figures_not_drawn.py).
        if item.path.parent.name in UNDRAWN_ROOMS and isinstance(item, pytest.Function):
            item.fixturenames.append("figures_not_drawn")


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

"""The host's pool of 2 MiB huge pages and a hugetlbfs mount on it: the
pages a scenario reserves (``nr_hugepages``, a knob saved and put back by
host/core/knobs.py, also after a kill) and the mount QEMU's
``memory-backend-file`` maps guest RAM from."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.knobs import KnobGroup, KnobSet, Sysfs, changing, default_state_dir
from memqual.host.core.qemu import opt_value

PAGE_KIB = 2048
PAGE_BYTES = PAGE_KIB << 10
POOL_ROOT = Path("/sys/kernel/mm/hugepages/hugepages-2048kB")
MOUNTS = Path("/proc/mounts")
MOUNT_NAME = "hugetlbfs-2M"  # under the state directory: one fixed place, reused after a kill
BACKEND_ID = "mem-huge"


@dataclasses.dataclass(frozen=True)
class PoolCounts:
    """The pool's counters (sysfs, in pages): ``free`` counts reserved
    pages too; ``reserved`` are promised to a mapping, not yet faulted."""

    total: int
    free: int
    reserved: int
    surplus: int


def read_pool(root: Path = POOL_ROOT) -> PoolCounts:
    fs = Sysfs(root)
    return PoolCounts(
        fs.read_int("nr_hugepages"),
        fs.read_int("free_hugepages"),
        fs.read_int("resv_hugepages"),
        fs.read_int("surplus_hugepages"),
    )


class HugePool(Protocol):
    """A host's pool as the scenarios read it: this machine's sysfs
    (``ThisPool``) or a host under test's over its SSH (l1_pool.L1Pool)."""

    def read_pool(self) -> PoolCounts: ...
    def free_pages(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class ThisPool:
    """This machine's pool, read from its sysfs."""

    root: Path = POOL_ROOT

    def read_pool(self) -> PoolCounts:
        return read_pool(self.root)

    def free_pages(self) -> int:
        return read_pool(self.root).free


def capability(root: Path = POOL_ROOT, mounts: Path = MOUNTS) -> str:
    """Why this host cannot back a guest with 2 MiB hugetlbfs pages, or ""."""
    if not root.is_dir():
        return f"host huge pages: {root} does not exist (a kernel without CONFIG_HUGETLBFS or 2 MiB pages)"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "hugetlbfs" not in filesystems:
        return "host huge pages: hugetlbfs is not in /proc/filesystems"
    if not os.access(root / "nr_hugepages", os.W_OK):
        return f"host huge pages: {root}/nr_hugepages is not writable: run as root"
    return ""


def backend_args(memory_mib: int, mount: Path) -> tuple[str, ...]:
    """QEMU arguments that back all guest RAM with a file on ``mount``
    (QEMU creates and unlinks it at once); private, so it is guest RAM as
    anonymous memory is, and marked mergeable, so only the page size
    differs from an anonymous guest."""
    return (
        "-object",
        f"memory-backend-file,id={BACKEND_ID},size={memory_mib}M,mem-path={opt_value(mount)},share=off,merge=on",
        "-machine",
        f"memory-backend={BACKEND_ID}",
    )


def pages_for(memory_mib: int) -> int:
    return -(-memory_mib * 1024 // PAGE_KIB)


def _mounted(path: Path, mounts: Path) -> bool:
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return False
    return any(len(f) >= 3 and f[1] == str(path) and f[2] == "hugetlbfs" for f in (line.split() for line in lines))


Runner = Callable[[list[str]], None]


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def unmount_stale(state_dir: Path, mounts: Path = MOUNTS, run: Runner = _run) -> None:
    """Unmount the hugetlbfs mount a killed run left in ``state_dir``
    (its pages went back with the pool's restore; the mount stays until
    unmounted)."""
    mount = state_dir / MOUNT_NAME
    if _mounted(mount, mounts):
        run(["umount", "--lazy", str(mount)])


KNOBS = KnobSet(
    "hugepages",
    "host huge pages",
    (KnobGroup("hugepages_2m", POOL_ROOT, names=("nr_hugepages",)),),
    after_restore=unmount_stale,
)


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Pages reserved on top of what the host had, and the mount."""

    pages: int
    mount: Path
    before: PoolCounts


@contextlib.contextmanager
def reserved(
    pages: int,
    root: Path = POOL_ROOT,
    state_dir: Path | None = None,
    mounts: Path = MOUNTS,
    run: Runner = _run,
    lock_timeout_s: float = 600.0,
) -> Iterator[Reservation]:
    """``pages`` more 2 MiB pages in the host's pool and a hugetlbfs mount
    on them, for the block; after it the pool is as it was and the mount
    gone.  CapabilityMissing when the kernel cannot find the pages (memory
    too fragmented or too small): it says so and gives what it can."""
    state_dir = state_dir if state_dir is not None else default_state_dir()
    knob_set = KNOBS.with_roots(hugepages_2m=root)
    with changing(knob_set, state_dir, lock_timeout_s) as state:
        fs = state.dirs["hugepages_2m"]
        before = read_pool(root)
        fs.write("nr_hugepages", before.total + pages)
        got = read_pool(root).total - before.total
        if got < pages:
            raise CapabilityMissing(f"host huge pages: asked for {pages} more 2 MiB pages, the kernel found {got}")
        mount = state_dir / MOUNT_NAME
        mount.mkdir(mode=0o700, exist_ok=True)
        if not _mounted(mount, mounts):
            run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M,mode=0700", "none", str(mount)])
        try:
            yield Reservation(pages, mount, before)
        finally:
            # Lazy: a guest still running (a failed test, before its tearDown)
            # keeps its pages until it exits; the mount point is free at once.
            run(["umount", "--lazy", str(mount)])

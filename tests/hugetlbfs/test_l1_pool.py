"""A host under test's huge page pool (host/hugetlbfs/l1_pool.py): its
reading script run for real under this machine's sh against a fake sysfs
tree, as it runs in L1; the pool on L1's command line, the mount rc.host
makes and the guest's argv that maps its RAM from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_shell import LocalShell

from memqual.host.core import clock, nested
from memqual.host.core.errors import BadInput, GuestError
from memqual.host.core.qemu import MachineConfig
from memqual.host.hugetlbfs import l1_pool, pool
from memqual.images.agents import GUEST_DIR
from memqual.images.host_image import L2_INITRD, L2_KERNEL


def fake_pool(tmp_path: Path, **values: int) -> Path:
    root = tmp_path / "hugepages-2048kB"
    root.mkdir()
    counts = {"nr_hugepages": 256, "free_hugepages": 200, "resv_hugepages": 3, "surplus_hugepages": 0, **values}
    for name, value in counts.items():
        (root / name).write_text(f"{value}\n")
    return root


def test_a_reading_is_one_command_that_names_its_files_as_arguments(tmp_path: Path) -> None:
    shell = LocalShell()
    reads = l1_pool.L1Pool(shell, str(fake_pool(tmp_path)))
    assert reads.read_pool() == pool.PoolCounts(total=256, free=200, reserved=3, surplus=0)
    assert reads.free_pages() == 200
    script = shell.commands[0]
    assert script[:2] == ["sh", "-c"] and str(tmp_path) not in script[2]
    assert script[4:] == [reads.root, *l1_pool.COUNTERS]
    assert shell.commands[1] == ["cat", f"{reads.root}/free_hugepages"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "no nr_hugepages"),
        ("nr_hugepages 256\nfree_hugepages 200\nresv_hugepages 0\n", "no surplus_hugepages"),
        ("nr_hugepages 256\nfree_hugepages x\nresv_hugepages 0\nsurplus_hugepages 0\n", "no free_hugepages"),
        ("sh: cd: can't cd to /sys/kernel/mm/hugepages/hugepages-2048kB\n", "can't cd"),
    ],
)
def test_a_reading_that_is_not_one_says_what_came_back(text: str, fragment: str) -> None:
    with pytest.raises(GuestError, match=fragment):
        l1_pool.parse_pool(text)


def test_a_pool_l1_lacks_is_a_guest_error_not_a_count(tmp_path: Path) -> None:
    reads = l1_pool.L1Pool(LocalShell(), str(tmp_path / "none"))
    with pytest.raises(GuestError, match="not a reading"):
        reads.read_pool()
    with pytest.raises(GuestError, match="not a count"):
        reads.free_pages()


def test_this_machines_pool_reads_the_same_counters(tmp_path: Path) -> None:
    reads = pool.ThisPool(fake_pool(tmp_path, free_hugepages=17))
    assert reads.free_pages() == 17 and reads.read_pool().total == 256


@pytest.mark.parametrize(
    ("guest_mib", "pages", "word"),
    [(512, 256, "hugepages=256"), (512, 1, "hugepages=1"), (3, 2, "hugepages=2")],
)
def test_the_pool_takes_the_guests_share_of_l1(guest_mib: int, pages: int, word: str) -> None:
    assert l1_pool.boot_knob(guest_mib, pages) == word


@pytest.mark.parametrize(
    ("guest_mib", "pages", "fragment"),
    [
        (512, 257, "257 2 MiB pages (514 MiB) does not fit L1: it has 512 MiB for its guest"),
        (512, 1024, f"beside its own {nested.L1_OVERHEAD_MIB} MiB; give at most 256 pages"),
        (3, 3, "give at most 2 pages"),
        (512, 0, "give at least one"),
    ],
)
def test_a_pool_too_big_for_l1_is_refused_in_one_line(guest_mib: int, pages: int, fragment: str) -> None:
    with pytest.raises(BadInput) as caught:
        l1_pool.boot_knob(guest_mib, pages)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_l1_boots_with_the_pool_and_its_guest_maps_ram_from_the_mount(tmp_path: Path) -> None:
    held = l1_pool.reservation(512)
    assert (held.pages, held.mount, held.before.total) == (256, l1_pool.L1_MOUNT, 0)
    host = nested.parse_host("6.12.111+deb12-amd64").with_boot_knobs(l1_pool.boot_knob(512, held.pages))
    config = MachineConfig(memory_mib=512, machine="microvm", extra_args=pool.backend_args(512, held.mount))
    l1 = nested.host_config(config, host, tmp_path / "argv", "tcg", clock.icount(0))
    assert "hugepages=256" in l1.cmdline_extra.split()
    # the pool is the guest's share of L1's memory: L1 keeps its own
    assert l1.memory_mib - held.pages * pool.PAGE_KIB // 1024 == nested.L1_OVERHEAD_MIB
    assert not any("mem-path" in word for word in l1.extra_args)  # L1's own RAM stays anonymous
    argv = nested.guest_argv(config, clock.icount(0), L2_KERNEL, L2_INITRD)
    backend = argv[argv.index("-object") + 1]
    assert f"size=512M,mem-path={l1_pool.L1_MOUNT},share=off" in backend
    assert f"memory-backend={pool.BACKEND_ID}" in argv


def test_rc_host_mounts_the_pool_where_the_argv_maps_ram_before_the_guest_starts() -> None:
    lines = (GUEST_DIR / "rc.host").read_text().splitlines()
    mount = next(i for i, line in enumerate(lines) if "mount -t hugetlbfs" in line)
    assert f"none {l1_pool.L1_MOUNT}" in lines[mount] and "pagesize=2M" in lines[mount]
    assert any(l1_pool.POOL_DIR + "/nr_hugepages" in line for line in lines[:mount])
    start = next(i for i, line in enumerate(lines) if "xargs -0" in line)
    assert mount < start

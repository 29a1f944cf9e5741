"""memqual.host.virtio_mem against a fake QMP: a resize met, a resize the
guest cannot meet ending at its deadline, the device's memslots read from
a flat view, and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeClock, VirtioMemQmp

from memqual.host import virtio_mem as V
from memqual.host.core.flatview import FlatRange

MIB = 1 << 20


def test_resize_met() -> None:
    device, clock = VirtioMemQmp(step=64 * MIB), FakeClock()
    result = V.resize(device, V.VirtioMemDevice(1024), 256 * MIB, 10.0, period_s=0.01, clock=clock, sleep=clock.sleep)
    assert result.met and result.size_bytes == 256 * MIB and result.start_bytes == 0
    assert result.polls == 4


def test_resize_the_guest_cannot_meet_ends_at_the_deadline_unmet() -> None:
    device, clock = VirtioMemQmp(step=64 * MIB, floor=384 * MIB), FakeClock()
    device.size = device.requested = 768 * MIB
    result = V.resize(device, V.VirtioMemDevice(1024), 0, 5.0, period_s=0.01, clock=clock, sleep=clock.sleep)
    assert not result.met
    assert result.size_bytes == 384 * MIB
    assert 5.0 <= result.seconds < 5.05


def test_device_ranges_are_its_memslots() -> None:
    device = V.VirtioMemDevice(4096, dynamic_memslots=True)
    ranges = [
        FlatRange(0, 0x9FFFF, "ram", "pc.ram"),
        FlatRange(0x100000000, 0x13FFFFFFF, "ram", "vmem0"),
        FlatRange(0x140000000, 0x17FFFFFFF, "ram", "vmem0"),
        FlatRange(0xFEB00000, 0xFEB00FFF, "i/o", "vmem0"),
    ]
    assert [r.start for r in V.device_ranges(ranges, device)] == [0x100000000, 0x140000000]


def test_args_ask_for_dynamic_memslots_only_when_wanted() -> None:
    plain = " ".join(V.VirtioMemDevice(1024).args())
    dynamic = " ".join(V.VirtioMemDevice(1024, dynamic_memslots=True).args())
    assert "dynamic-memslots" not in plain
    assert "dynamic-memslots=on" in dynamic
    assert "memory-backend-ram,id=vmem0,size=1024M" in plain
    assert "requested-size=0" in plain


def test_args_map_the_backend_without_reserving_only_when_asked() -> None:
    assert "reserve" not in " ".join(V.VirtioMemDevice(1024).args())
    assert "memory-backend-ram,id=vmem0,size=8192M,reserve=off" in " ".join(
        V.VirtioMemDevice(8192, reserve=False).args()
    )


def _tree(root: Path, dep_text: str, files: list[str]) -> Path:
    from memqual.images.modules import GUEST_MODULES

    release = root / "lib/modules/6.1.0-test"
    release.mkdir(parents=True)
    (release / "modules.builtin").write_text("".join(f"kernel/drivers/{m}.ko\n" for m in GUEST_MODULES))
    (release / "modules.dep").write_text(dep_text)
    for rel in files:
        (release / rel).parent.mkdir(parents=True, exist_ok=True)
        (release / rel).write_bytes(b"\0" * 64)
    return release


def test_image_ships_virtio_mem_and_its_dependencies(tmp_path: Path) -> None:
    from memqual.images.modules import stage_modules

    files = ["kernel/drivers/virtio/virtio_mem.ko", "kernel/mm/helper.ko"]
    release = _tree(tmp_path / "src", f"{files[0]}: {files[1]}\n{files[1]}:\n", files)
    assert stage_modules(release, "6.1.0-test", tmp_path / "out") == sorted(files)
    assert (tmp_path / "out/lib/modules/6.1.0-test" / files[0]).is_file()


def test_a_kernel_without_virtio_mem_still_builds(tmp_path: Path) -> None:
    from memqual.images.modules import stage_modules

    release = _tree(tmp_path / "src", "kernel/extra/dummy.ko:\n", ["kernel/extra/dummy.ko"])
    assert stage_modules(release, "6.1.0-test", tmp_path / "out") == []


def test_resize_timing_cycles_each_size_and_records_its_figures() -> None:
    asked: list[int] = []

    def resize(target: int) -> tuple[V.Resize, float]:
        asked.append(target)
        return V.Resize(target, 0, target, True, 0.2 if target else 0.4, 3), 0.1

    timings = V.time_resizes(resize, lambda size: 0.1, (256, 1024), repeats=2)
    assert asked == [256 * V.MIB, 0, 256 * V.MIB, 0, 1024 * V.MIB, 0, 1024 * V.MIB, 0]
    assert [t.size_mib for t in timings] == [256, 1024]
    assert timings[0].figures["shrink_s"] == [0.4, 0.4] and timings[0].shrink_over_inflate == pytest.approx(4.0)
    records = timings[0].records(512, 2)
    assert [r.metric for r in records] == list(V.RESIZE_FIGURES)
    assert records[2].extra == {"shrink_over_balloon_inflate": pytest.approx(4.0)} and records[0].extra == {}


def test_resize_timing_fails_on_a_resize_not_met() -> None:
    def stuck(target: int) -> tuple[V.Resize, float]:
        return V.Resize(target, 0, 0 if target else 64 * V.MIB, not target == 0, 60.0, 9), 0.1

    with pytest.raises(V.ResizeFailed, match="did not reach 0 MiB"):
        V.time_resizes(stuck, lambda size: 0.1, (256,), repeats=1)

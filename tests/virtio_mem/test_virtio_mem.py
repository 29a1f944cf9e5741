"""memqual.host.virtio_mem against a fake QMP: a resize met, a resize the
guest cannot meet ending at its deadline, the device's memslots read from
a flat view, and the command line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import AgentShell, FakeBackground, FakeClock, FakeVirtioMemGuest, VirtioMemQmp

from memqual.host import virtio_mem
from memqual.host.core.flatview import FlatRange

MIB = 1 << 20


def test_resize_met() -> None:
    device, clock = VirtioMemQmp(step=64 * MIB), FakeClock()
    result = virtio_mem.resize(
        device, virtio_mem.VirtioMemDevice(1024), 256 * MIB, 10.0, period_s=0.01, clock=clock, sleep=clock.sleep
    )
    assert result.met and result.size_bytes == 256 * MIB and result.start_bytes == 0
    assert result.polls == 4


def test_resize_the_guest_cannot_meet_ends_at_the_deadline_unmet() -> None:
    device, clock = VirtioMemQmp(step=64 * MIB, floor=384 * MIB), FakeClock()
    device.size = device.requested = 768 * MIB
    result = virtio_mem.resize(
        device, virtio_mem.VirtioMemDevice(1024), 0, 5.0, period_s=0.01, clock=clock, sleep=clock.sleep
    )
    assert not result.met
    assert result.size_bytes == 384 * MIB
    assert 5.0 <= result.seconds < 5.05


def test_device_ranges_are_its_memslots() -> None:
    device = virtio_mem.VirtioMemDevice(4096, dynamic_memslots=True)
    ranges = [
        FlatRange(0, 0x9FFFF, "ram", "pc.ram"),
        FlatRange(0x100000000, 0x13FFFFFFF, "ram", "vmem0"),
        FlatRange(0x140000000, 0x17FFFFFFF, "ram", "vmem0"),
        FlatRange(0xFEB00000, 0xFEB00FFF, "i/o", "vmem0"),
    ]
    assert [r.start for r in virtio_mem.device_ranges(ranges, device)] == [0x100000000, 0x140000000]


def test_args_ask_for_dynamic_memslots_only_when_wanted() -> None:
    plain = " ".join(virtio_mem.VirtioMemDevice(1024).args())
    dynamic = " ".join(virtio_mem.VirtioMemDevice(1024, dynamic_memslots=True).args())
    assert "dynamic-memslots" not in plain
    assert "dynamic-memslots=on" in dynamic
    assert "memory-backend-ram,id=vmem0,size=1024M" in plain
    assert "requested-size=0" in plain


def test_args_map_the_backend_without_reserving_only_when_asked() -> None:
    assert "reserve" not in " ".join(virtio_mem.VirtioMemDevice(1024).args())
    assert "memory-backend-ram,id=vmem0,size=8192M,reserve=off" in " ".join(
        virtio_mem.VirtioMemDevice(8192, reserve=False).args()
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

    def resize(target: int) -> tuple[virtio_mem.Resize, float]:
        asked.append(target)
        return virtio_mem.Resize(target, 0, target, True, 0.2 if target else 0.4, 3), 0.1

    timings = virtio_mem.time_resizes(resize, lambda size: 0.1, (256, 1024), repeats=2)
    assert asked == [
        256 * virtio_mem.MIB,
        0,
        256 * virtio_mem.MIB,
        0,
        1024 * virtio_mem.MIB,
        0,
        1024 * virtio_mem.MIB,
        0,
    ]
    assert [t.size_mib for t in timings] == [256, 1024]
    assert timings[0].figures["shrink_s"] == [0.4, 0.4] and timings[0].shrink_over_inflate == pytest.approx(4.0)
    records = timings[0].records(512, 2)
    assert [r.metric for r in records] == list(virtio_mem.RESIZE_FIGURES)
    assert records[2].extra == {"shrink_over_balloon_inflate": pytest.approx(4.0)} and records[0].extra == {}


def test_resize_timing_fails_on_a_resize_not_met() -> None:
    def stuck(target: int) -> tuple[virtio_mem.Resize, float]:
        return virtio_mem.Resize(target, 0, 0 if target else 64 * virtio_mem.MIB, not target == 0, 60.0, 9), 0.1

    with pytest.raises(virtio_mem.ResizeFailed, match="did not reach 0 MiB"):
        virtio_mem.time_resizes(stuck, lambda size: 0.1, (256,), repeats=1)


MEMINFO = "MemTotal:       {} kB\n"
FILLED = "event=filled pages=81920 in_range=80000"


def plug_guest(floor: int = 0, dmesg: str = "", fill_status: int = 0) -> tuple[FakeVirtioMemGuest, FakeClock]:
    """A 256 MiB guest whose MemTotal follows its plugged memory, and whose
    agent fills, then verifies with no bad word."""
    machine = VirtioMemQmp(step=32 * MIB, floor=floor)
    base = 256 * 1024
    totals = [base, base + virtio_mem.PLUG_MIB * 1024, base]
    shell = AgentShell(
        {"cat": [MEMINFO.format(t) for t in totals], "dmesg": dmesg},
        background=FakeBackground([FILLED, "event=verified bad_words=0"], status=fill_status),
    )
    return FakeVirtioMemGuest(machine, shell), FakeClock()


def test_plug_unplug_sees_each_step_and_the_rss_given_back() -> None:
    vm, clock = plug_guest()
    rss = iter([100_000, 450_000, 450_000] + [100_000] * 5)
    run = virtio_mem.run_plug_unplug(
        vm, virtio_mem.VirtioMemDevice(512), "/tmp/vmem_agent", lambda: next(rss), clock, clock.sleep
    )
    assert run.plugged.met and run.total_plugged_kib == run.base_kib + virtio_mem.PLUG_MIB * 1024
    assert run.in_range_share == 80000 / 81920 and virtio_mem.agent_field(run.verified, "bad_words") == 0
    assert run.partial.met and run.unmet.met and run.killed == []  # this fake's guest gives all back at once
    assert run.emptied.met and run.total_emptied_kib == run.base_kib
    assert run.rss_returned and run.rss_after_kib == 100_000
    assert ["/tmp/vmem_agent", "fill", "320", "0x5eed", hex(1 << 32), hex((1 << 32) + 512 * MIB), "120"] in vm.ssh.ran


def test_plug_unplug_reports_an_unmet_request_and_rss_that_stays() -> None:
    # The guest cannot give back its last 256 MiB: the request for 0 stays
    # unmet for the whole window, and so does the final unplug.
    vm, clock = plug_guest(floor=256 * MIB)
    run = virtio_mem.run_plug_unplug(
        vm, virtio_mem.VirtioMemDevice(512), "/tmp/vmem_agent", lambda: 450_000, clock, clock.sleep
    )
    assert not run.unmet.met and run.unmet.size_bytes == 256 * MIB
    assert 5.0 <= run.unmet.seconds < 5.1
    assert not run.emptied.met and not run.rss_returned
    assert run.rss_waited_s >= virtio_mem.RSS_DEADLINE_S


def test_plug_unplug_refuses_to_go_on_when_nothing_plugs() -> None:
    vm, clock = plug_guest()
    vm.machine.step = 0
    with pytest.raises(virtio_mem.ResizeFailed, match="did not plug"):
        virtio_mem.run_plug_unplug(
            vm, virtio_mem.VirtioMemDevice(512), "/tmp/vmem_agent", lambda: 0, clock, clock.sleep
        )


def test_plug_states_read_the_devices_memslots_at_each_step() -> None:
    vm, _ = plug_guest()
    vm.machine.step = 4096 * MIB  # each resize met at its first poll
    states = virtio_mem.plug_states(vm, virtio_mem.VirtioMemDevice(4096, dynamic_memslots=True), (0, 512, 2048, 0))
    assert [len(s.device_slots) for s in states] == [0, 1, 2, 0]
    assert [s.size_mib for s in states] == [0, 512, 2048, 0]


def test_guest_timed_resize_needs_both_sides() -> None:
    machine = VirtioMemQmp(step=4096 * MIB)
    seen = FakeVirtioMemGuest(machine, AgentShell({}, FakeBackground(["watching", "reached seconds=0.25"])))
    result, guest_s = virtio_mem.guest_timed(
        seen, "/tmp/vmem_agent", virtio_mem.VirtioMemDevice(1024), 256 * MIB, 262144
    )
    assert result.met and guest_s == 0.25
    unseen = FakeVirtioMemGuest(machine, AgentShell({}, FakeBackground(["watching", "timeout"])))
    with pytest.raises(virtio_mem.ResizeFailed, match="never saw MemTotal"):
        virtio_mem.guest_timed(unseen, "/tmp/vmem_agent", virtio_mem.VirtioMemDevice(1024), 0, 262144)


def test_on_a_host_under_test_only_the_guest_times_and_the_ratio_is_the_guest_s() -> None:
    def resize(target: int) -> tuple[virtio_mem.Resize, float]:
        return virtio_mem.Resize(target, 0, target, True, 9.0, 1), 0.3 if target == 0 else 0.1

    (timing,) = virtio_mem.time_resizes(resize, lambda size: 0.15, (256,), repeats=2, host_timed=False)
    assert list(timing.figures) == list(virtio_mem.GUEST_FIGURES)
    assert timing.figures["balloon_inflate_guest_s"] == [0.15, 0.15]
    assert timing.shrink_over_inflate == pytest.approx(2.0)
    records = timing.records(512, 2, {"timed_by": "the guest"})
    assert [r.metric for r in records] == ["grow_guest_s", "shrink_guest_s", "balloon_inflate_guest_s"]
    assert records[1].extra == {"shrink_over_balloon_inflate": pytest.approx(2.0)}
    assert all(r.settings["timed_by"] == "the guest" for r in records)


class LoggedQmp(VirtioMemQmp):
    """QOM's virtio-mem that writes each size read and request into ``log``."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(step=4096 * MIB)
        self.log = log

    def answer(self, command: str, arguments: dict[str, Any]) -> Any:
        if command == "qom-set" or arguments.get("property") == "size":
            self.log.append(f"{command} {arguments['property']}")
        return super().answer(command, arguments)


class LoggedAgent(FakeBackground):
    """The guest's agent, whose report reaches ``log`` when it is read."""

    def __init__(self, lines: list[str], log: list[str]) -> None:
        super().__init__(lines)
        self.log = log

    def lines(self, timeout: float = 0) -> Iterator[str]:
        for line in super().lines(timeout):
            if line.startswith("reached"):
                self.log.append("reached")
            yield line


@pytest.mark.parametrize(
    ("quiet", "order"),
    [
        # on a host under test: nothing read between the request and the guest's report
        (True, ["qom-get size", "qom-set requested-size", "reached", "qom-get size"]),
        # here: the host polls the size as the guest resizes
        (False, ["qom-get size", "qom-set requested-size", "qom-get size", "reached"]),
    ],
)
def test_a_quiet_resize_reads_the_size_only_once_the_guest_has_seen_it(quiet: bool, order: list[str]) -> None:
    """On a host under test nothing polls while the guest resizes: one QOM
    read before the request, then reads only after the guest's report."""
    log: list[str] = []
    agent = LoggedAgent(["watching", "reached seconds=0.25"], log)
    seen = FakeVirtioMemGuest(LoggedQmp(log), AgentShell({}, agent))
    result, guest_s = virtio_mem.guest_timed(
        seen, "/tmp/vmem_agent", virtio_mem.VirtioMemDevice(1024), 256 * MIB, 262144, quiet=quiet
    )
    assert result.met and guest_s == 0.25 and result.start_bytes == 0
    assert log == order
    if not quiet:
        return
    machine = VirtioMemQmp(step=4096 * MIB)
    unseen = FakeVirtioMemGuest(machine, AgentShell({}, FakeBackground(["watching", "timeout"])))
    with pytest.raises(virtio_mem.ResizeFailed, match="never saw MemTotal"):
        virtio_mem.guest_timed(unseen, "/tmp/vmem_agent", virtio_mem.VirtioMemDevice(1024), 0, 262144, quiet=True)

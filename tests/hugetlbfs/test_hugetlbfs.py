"""host/hugetlbfs/ on fakes: the pool reserved and given back, the
backend's arguments, and the procedures' counting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fake_hugetlbfs import FakeBalloon, Reach

from memqual.host.core.errors import CapabilityMissing
from memqual.host.hugetlbfs import pool
from memqual.host.hugetlbfs import scenarios as hs


def _tree(tmp_path: Path, total: int = 0) -> Path:
    root = tmp_path / "hugepages-2048kB"
    root.mkdir()
    for name, value in (("nr_hugepages", total), ("free_hugepages", total), ("resv_hugepages", 0)):
        (root / name).write_text(f"{value}\n")
    (root / "surplus_hugepages").write_text("0\n")
    return root


def test_the_pool_is_reserved_mounted_and_given_back(tmp_path: Path) -> None:
    root = _tree(tmp_path, total=4)
    calls: list[list[str]] = []
    mounts = tmp_path / "mounts"
    mounts.write_text("")
    with pool.reserved(256, root, tmp_path / "state", mounts, calls.append) as held:
        assert pool.read_pool(root).total == 260 and held.before.total == 4
        assert held.mount == tmp_path / "state" / pool.MOUNT_NAME and held.mount.is_dir()
    assert pool.read_pool(root).total == 4
    assert calls == [
        ["mount", "-t", "hugetlbfs", "-o", "pagesize=2M,mode=0700", "none", str(held.mount)],
        ["umount", "--lazy", str(held.mount)],
    ]


def test_a_mount_left_by_a_killed_run_is_reused(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    mount = tmp_path / "state" / pool.MOUNT_NAME
    mounts = tmp_path / "mounts"
    mounts.write_text(f"none {mount} hugetlbfs rw,relatime,pagesize=2M 0 0\n")
    calls: list[list[str]] = []
    with pool.reserved(1, root, tmp_path / "state", mounts, calls.append):
        pass
    assert calls == [["umount", "--lazy", str(mount)]]


def test_too_few_pages_is_a_missing_capability_and_nothing_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path, total=2)
    real = pool.read_pool
    counts = iter([real(root), dataclasses.replace(real(root), total=12)])
    monkeypatch.setattr(pool, "read_pool", lambda r=root: next(counts))
    with pytest.raises(CapabilityMissing, match="asked for 256 more 2 MiB pages, the kernel found 10"):
        with pool.reserved(256, root, tmp_path / "state", tmp_path / "mounts", lambda argv: None):
            pass
    assert (root / "nr_hugepages").read_text().strip() == "2"


def test_capability_says_why_not(tmp_path: Path) -> None:
    assert "does not exist" in pool.capability(tmp_path / "none")


def test_the_backend_maps_all_ram_from_the_mount() -> None:
    args = pool.backend_args(512, Path("/run/a,share=on"))
    assert args[0] == "-object" and args[2:] == ("-machine", f"memory-backend={pool.BACKEND_ID}")
    assert "size=512M,mem-path=/run/a,,share=on,share=off" in args[1]
    assert pool.pages_for(512) == 256 and pool.pages_for(3) == 2


def test_an_inflate_counts_the_pages_back_and_deflates_again() -> None:
    free = [100]
    balloon = FakeBalloon(free, whole=3)
    touched: list[bool] = []
    found = hs.inflate(balloon, 192 * hs.MIB, "hugetlbfs", lambda: free[0], lambda: touched.append(True))
    assert (found.returned_pages, found.whole_pages_at_most, found.moved_bytes) == (3, 96, 192 * hs.MIB)
    assert found.faulted_pages == 0  # the fake's touch faults nothing
    assert balloon.targets == [320 * hs.MIB, 512 * hs.MIB] and touched == [True]
    record = hs.returned_record(found, [found], {})
    assert record.samples == [3 * pool.PAGE_BYTES / (192 * hs.MIB)]
    # The kernel's own driver: its request size is not claimed (a patch may change it).
    assert record.variant == {"backing": "hugetlbfs", "pfns_per_request": "kernel's own"}
    assert hs.returned_record(None, [found], {}, 4096).variant["pfns_per_request"] == 4096
    anon = hs.inflate(FakeBalloon([0], 0), hs.MIB, "anon")
    assert anon.returned_pages is None and hs.time_record([anon], "anon", {}).samples == [0.5]


def test_an_inflate_that_stops_short_fails_the_scenario() -> None:
    with pytest.raises(hs.ScenarioFailed, match="stopped short"):
        hs.inflate(FakeBalloon([0], 0, stops_short=True), hs.MIB, "hugetlbfs", lambda: 0)


def test_reporting_waits_for_pages_back_and_fails_when_none_come() -> None:
    free = iter([10, 10, 20, 60, 60])
    found = hs.reported(lambda: next(free), lambda: None, touched_mib=320, interval_s=0.001)
    assert (found.touched_pages, found.returned_pages) == (160, 50)
    assert hs.reported_record(found, {}).samples == [50.0]
    with pytest.raises(hs.ScenarioFailed, match="gave back 0 of 160"):
        hs.reported(lambda: 10, lambda: None, touched_mib=320, deadline_s=0.05, interval_s=0.01)


def test_the_ksm_record_counts_growth_over_the_agent_s_pages() -> None:
    record = hs.ksm_record("hugetlbfs", 65536, 0, 0, {})
    assert record.samples == [0.0] and record.scenario == "hugetlbfs.ksm"
    assert hs.ksm_record("anon", 65536, 65536, 12, {}).samples == [1.0]


def test_a_killed_run_s_mount_is_unmounted_only_when_it_is_there(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    state_dir = tmp_path / "state"
    ran: list[list[str]] = []
    mounts.write_text("proc /proc proc rw 0 0\n")
    pool.unmount_stale(state_dir, mounts, ran.append)
    assert ran == []
    mount = state_dir / pool.MOUNT_NAME
    mounts.write_text(f"proc /proc proc rw 0 0\nnone {mount} hugetlbfs rw,pagesize=2M 0 0\n")
    pool.unmount_stale(state_dir, mounts, ran.append)
    assert ran == [["umount", "--lazy", str(mount)]]
    assert pool.KNOBS.after_restore is pool.unmount_stale


class FakeTracker:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.cancelled, self.asked = seconds, False, 0

    def result(self) -> FakeTracker:
        return self

    def cancel(self) -> None:
        self.cancelled = True


def test_a_tracked_inflate_carries_the_guests_time_and_its_record() -> None:
    trackers: list[FakeTracker] = []

    def track(pages: int) -> FakeTracker:
        trackers.append(FakeTracker(0.25))
        trackers[-1].asked = pages
        return trackers[-1]

    found = hs.inflate(FakeBalloon([5], 2), 192 * hs.MIB, "hugetlbfs", lambda: 5, track=track)
    assert found.guest_seconds == 0.25 and found.seconds == 0.5
    assert [t.asked for t in trackers] == [192 * 256]  # the inflate's 4 KiB pages; the deflate untracked
    record = hs.guest_time_record([found], "hugetlbfs", {})
    assert (record.metric, record.samples, record.extra["host_s"]) == ("inflate_guest_s", [0.25], [0.5])
    assert hs.inflate(FakeBalloon([0], 0), hs.MIB, "anon").guest_seconds is None


class BrokenBalloon(FakeBalloon):
    def reach(self, target_bytes: int, deadline_s: float = 0.0) -> Reach:
        raise TimeoutError("the monitor went away")


@pytest.mark.parametrize(
    ("balloon", "raised"),
    [
        (FakeBalloon([0], 0, stops_short=True), hs.ScenarioFailed),
        (BrokenBalloon([0], 0), TimeoutError),
    ],
)
def test_a_tracker_whose_inflate_fails_is_cancelled(balloon: FakeBalloon, raised: type[Exception]) -> None:
    tracker = FakeTracker(1.0)
    with pytest.raises(raised):
        hs.inflate(balloon, hs.MIB, "hugetlbfs", lambda: 0, track=lambda pages: tracker)
    assert tracker.cancelled


def test_the_tracker_starts_before_the_count_so_its_own_start_is_not_counted() -> None:
    events: list[str] = []

    def free() -> int:
        events.append("count")
        return 5

    def track(pages: int) -> FakeTracker:
        events.append("armed")
        return FakeTracker(0.1)

    hs.inflate(FakeBalloon([5], 0), 192 * hs.MIB, "hugetlbfs", free, lambda: events.append("touch"), track=track)
    assert events == ["count", "touch", "armed", "count", "count"]

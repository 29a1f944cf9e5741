"""Warm-start snapshots fail safe, without QEMU: a failed save resumes the
guest and leaves no temporary directory; a slow restore keeps a good
snapshot, a corrupt one is deleted; new image keys mean a new snapshot;
the snapshot directory is private."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import FakeMachine

from memqual.host.core import snapshot
from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.machine import Machine

# Every test here reads and writes snapshots, none of them the user's.
pytestmark = pytest.mark.usefixtures("snapshot_cache")


def real(machine: FakeMachine) -> Machine:
    """The fake as the Machine snapshot's functions take: it has every
    attribute and step of Machine that they use."""
    return cast(Machine, machine)


def _saved(machine: FakeMachine) -> Path:
    directory = snapshot.snapshot_dir(real(machine))
    directory.mkdir(parents=True)
    (directory / "state").write_bytes(b"good" * 10)
    (directory / "meta.json").write_text(json.dumps({"bytes": 40, "image": str(machine.image.directory)}))
    return directory


def test_a_failed_save_resumes_the_guest_and_leaves_no_temporary_directory(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, migrate_status="failed")
    directory = snapshot.snapshot_dir(real(machine))
    with pytest.raises(GuestError, match="saving the snapshot failed"):
        snapshot._save(real(machine), directory)
    assert machine.running, "the guest stayed paused"
    assert machine.calls[-2:] == ["cont", "wait_ssh"]
    assert list(directory.parent.iterdir()) == []
    assert not directory.exists()


def test_start_after_a_failed_save_is_a_cold_guest_with_ssh(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, migrate_status="failed")
    snapshot.start(real(machine))
    assert machine.running and machine.calls[-1] == "wait_ssh"
    leftovers = [p.name for p in snapshot.snapshot_root().iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_a_good_save_is_private_and_complete(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path)
    snapshot.start(real(machine))
    root = snapshot.snapshot_root()
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    (entry,) = [p for p in root.iterdir() if p.is_dir()]
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(entry / "state").st_mode) == 0o600
    assert snapshot._valid(entry / "state", entry / "meta.json")


def test_a_slow_restore_keeps_the_snapshot_and_boots_cold(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, restore_error=Timeout("the guest did not answer SSH within 90 s"))
    directory = _saved(machine)
    snapshot.start(real(machine))
    assert (directory / "state").read_bytes() == b"good" * 10
    assert machine.calls[-1] == "cold"


def test_a_corrupt_snapshot_is_deleted_and_saved_anew(tmp_path: Path) -> None:
    machine = FakeMachine(
        tmp_path,
        restore_error=GuestError("QEMU exited"),
        qemu_output="qemu-system-x86_64: load of migration failed: Invalid argument",
    )
    directory = _saved(machine)
    machine.restore_error = GuestError("QEMU exited")
    snapshot.start(real(machine))
    assert (directory / "state").read_bytes() == b"state" * 10  # the new save


def test_new_image_keys_mean_another_snapshot(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path)
    before = snapshot.snapshot_key(real(machine))
    (machine.image.key.parent / "host_key.pub").write_text("ssh-ed25519 AAAA2")  # image build --force
    assert snapshot.snapshot_key(real(machine)) != before


def test_a_snapshot_directory_others_may_write_is_not_used(tmp_path: Path, snapshot_cache: Path) -> None:
    (snapshot_cache / "snapshots").mkdir(parents=True)
    os.chmod(snapshot_cache / "snapshots", 0o777)
    snapshot._warned_unwritable = False
    assert not snapshot.usable()


def test_a_guest_that_cannot_be_resumed_after_a_failed_save_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = FakeMachine(tmp_path, migrate_status="failed")

    def no_ssh(started: float, first_command: Any = None, probe_banner: bool = True) -> None:
        raise Timeout("the guest did not answer SSH within 90 s")

    monkeypatch.setattr(machine, "wait_ssh", no_ssh)
    with pytest.raises(GuestError, match="did not resume after a failed snapshot save"):
        snapshot.start(real(machine))
    assert [p for p in snapshot.snapshot_root().iterdir() if not p.name.endswith(".lock")] == []


def test_a_host_under_test_is_saved_with_its_guest_paused_and_resumed_after(tmp_path: Path) -> None:
    """L1 is saved with its guest's QEMU stopped (QEMU cannot load a state
    saved while L1 ran its guest) and memqual on L1's monitor; after the
    save L1 runs on, then its guest, then SSH is awaited.  The snapshot
    dies with L1's image, not the guest's."""
    machine = FakeMachine(tmp_path).under_host(tmp_path)
    snapshot.start(real(machine))
    calls = [c for c in machine.calls if c not in ("query-migrate", "migrate-set-parameters")]
    assert calls == ["cold", "pause_nested", "stop", "migrate", "cont", "resume_nested", "wait_ssh"]
    (meta,) = snapshot.snapshot_root().glob("*/meta.json")
    assert json.loads(meta.read_text())["image"] == str(tmp_path / "l1")


def test_a_restored_host_under_test_runs_its_guest_before_ssh(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path).under_host(tmp_path)
    _saved(machine)
    snapshot.start(real(machine))
    assert machine.started_warm
    restore = machine.calls[machine.calls.index("start:incoming") :]
    assert restore == ["start:incoming", "query-status", "resume_nested", "wait_ssh"]


def test_a_restored_host_whose_guest_monitor_is_silent_is_deleted_and_saved_anew(tmp_path: Path) -> None:
    """A guest's monitor that a connection held at the save would be held
    in every restore: such a snapshot is bad, not the host busy."""
    silent = snapshot.Unloadable("the guest's monitor in the restored host did not answer")
    machine = FakeMachine(tmp_path).under_host(tmp_path, resume_error=silent)
    directory = _saved(machine)
    snapshot.start(real(machine))
    assert not machine.started_warm
    assert machine.calls[-2:] == ["resume_nested", "wait_ssh"]  # the cold guest's save, resumed
    assert (directory / "state").read_bytes() == b"state" * 10  # the new save

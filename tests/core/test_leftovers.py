"""A killed run's half-written cache entries and temporary directories
are removed by the next start, and a live run's never are: the liveness
rule is a lock its writer holds (host/core/leftovers.py), tested here with a
second process holding it and with a real SIGKILL."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from memqual.host.core import leftovers, snapshot
from memqual.host.core.paths import REPO_ROOT

KEY24 = "0123456789abcdef01234567"
KEY20 = "0123456789abcdef0123"


@contextmanager
def held(lock: Path, exclusive: bool = True) -> Iterator[None]:
    """``lock`` held by another process, as a concurrent run holds it."""
    code = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
        f"fcntl.flock(fd, fcntl.{'LOCK_EX' if exclusive else 'LOCK_SH'}); print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        yield
    finally:
        proc.kill()
        proc.wait(10)


def _half_saved(root: Path, key: str = KEY24, size: int = 4096) -> Path:
    tmp = root / f".{key}.tmpab12cd_3"
    tmp.mkdir(parents=True, mode=0o700)
    (tmp / "state").write_bytes(b"\0" * size)  # no meta.json: the save was killed
    return tmp


# -- cache entries under their key's lock ------------------------------------------------
def test_a_killed_snapshot_save_is_removed_and_a_live_one_kept(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    tmp = _half_saved(root)
    with held(root / f"{KEY24}.lock"):  # a concurrent run is saving it
        assert leftovers.sweep_snapshots(root) == 0
        assert (tmp / "state").exists()
    with held(root / f"{KEY24}.lock", exclusive=False):  # a restore under way holds it shared
        assert leftovers.sweep_snapshots(root) == 0
    assert leftovers.sweep_snapshots(root) == 1
    assert not tmp.exists()


def test_the_snapshot_cap_counts_saves_under_way_and_removes_killed_ones(snapshot_cache: Path, monkeypatch) -> None:
    root = snapshot.snapshot_root()
    image = snapshot_cache / "image"
    image.mkdir()
    done = root / ("f" * 24)
    done.mkdir()
    (done / "state").write_bytes(b"\0" * 1000)
    (done / "meta.json").write_text(json.dumps({"bytes": 1000, "image": str(image)}))
    killed = _half_saved(root, "e" * 24, 1000)
    live = _half_saved(root, KEY24, 1000)
    monkeypatch.setattr(snapshot, "CACHE_CAP_BYTES", 1500)
    with held(root / f"{KEY24}.lock"):
        snapshot._enforce_cap()
        assert not killed.exists()  # removed: no writer holds its lock
        assert (live / "state").exists()  # its writer is at work
        assert not done.exists()  # 1000 + the 1000 being saved exceed the cap of 1500


def test_a_killed_image_build_is_removed_by_the_next_build(kernel, memqual_cache: Path) -> None:
    from memqual.images.build import build

    images = memqual_cache / "images"
    staging = images / f".{KEY20}-ab12cd_3"
    (staging / "root").mkdir(parents=True)
    with held(images / f".{KEY20}.lock"):  # another run is building that entry
        build(kernel)
        assert staging.exists()
    build(kernel)
    assert not staging.exists()


def test_a_killed_download_is_removed_and_a_live_one_kept(tmp_path: Path) -> None:
    debs = tmp_path / "debs"
    staging = debs / ".dl-linux-image-6.1.0-57-amd64-ab12cd_3"
    partial = debs / ".linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb.x1y2z3_4"
    staging.mkdir(parents=True)
    partial.write_bytes(b"half")
    memo = debs / ".linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb.sha256"
    memo.write_text("kept\n")
    with held(leftovers.package_lock(debs, "linux-image-6.1.0-57-amd64")):
        assert leftovers.sweep_debs(debs) == 0
    assert leftovers.sweep_debs(debs) == 2
    assert not staging.exists() and not partial.exists() and memo.exists()


# -- temporary directories of processes ---------------------------------------------------
def _process_with_tempdir(socket_dir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    code = (
        "from memqual.host.core.paths import short_tempdir; import sys; "
        "print(short_tempdir('mq'), flush=True); sys.stdin.read()"
    )
    env = {**os.environ, "MEMQUAL_SOCKET_DIR": str(socket_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().decode().strip())


def test_a_socket_dir_is_kept_while_its_process_lives_and_removed_after_a_sigkill(tmp_path: Path) -> None:
    proc, directory = _process_with_tempdir(tmp_path)
    try:
        (directory / "qmp.sock").write_text("")
        assert leftovers.sweep_tempdirs(tmp_path) == 0 and directory.exists()
        os.utime(directory, (0, 0))  # however old: the lock decides
        assert leftovers.sweep_tempdirs(tmp_path) == 0 and directory.exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert leftovers.sweep_tempdirs(tmp_path) == 1
    assert not directory.exists()


def test_a_socket_dir_without_a_lock_goes_only_when_old_and_never_anothers(tmp_path: Path) -> None:
    young, old, foreign = (tmp_path / f"mq-{name}00000"[:11] for name in ("you", "old", "for"))
    for directory in (young, old, foreign):
        directory.mkdir()
    hours_ago = time.time() - 3600  # a run of an older memqual may well last hours
    os.utime(young, (hours_ago, hours_ago))
    os.utime(old, (0, 0))
    os.utime(foreign, (0, 0))
    if os.geteuid() == 0:
        os.chown(foreign, pwd.getpwnam("nobody").pw_uid, -1)
    else:
        foreign.rmdir()
        foreign.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "mine-not-memquals").mkdir()
    assert leftovers.sweep_tempdirs(tmp_path) == 1
    assert young.exists() and not old.exists() and os.path.lexists(foreign)
    assert (tmp_path / "mine-not-memquals").exists()


def test_own_live_tempdirs_are_released_whole(tmp_path: Path) -> None:
    directory = leftovers.live_tempdir("mq", tmp_path)
    assert (directory / leftovers.LIVE_LOCK).exists()
    fd = os.open(directory / leftovers.LIVE_LOCK, os.O_RDONLY)
    with pytest.raises(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    leftovers.release_tempdir(directory)
    assert not directory.exists()


# -- aexpect's session directories ----------------------------------------------------------
def test_aexpect_dirs_are_kept_while_the_session_lives_and_removed_after(tmp_path: Path) -> None:
    """A real aexpect session started by a controller that is then killed
    with SIGKILL: its server lives on (its dir is kept) until it dies."""
    code = (
        "import aexpect, sys; s = aexpect.Expect('sleep 300'); print(s.a_id, s.get_pid(), flush=True); sys.stdin.read()"
    )
    # aexpect starts its helper by name: the one beside this Python
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PATH": path}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    a_id, shell_pid = proc.stdout.readline().decode().split()
    session = tmp_path / f"aexpect_{a_id}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    try:
        assert session.is_dir()
        os.utime(session, (0, 0))
        assert leftovers.sweep_aexpect(tmp_path) == 0 and session.exists()  # its server still runs
    finally:
        os.kill(int(shell_pid), signal.SIGKILL)
    deadline = time.monotonic() + 20
    while leftovers.sweep_aexpect(tmp_path) == 0:
        assert time.monotonic() < deadline, "the session's server never let go of its lock"
        os.utime(session, (0, 0))
        time.sleep(0.1)  # the server notices its shell's death and ends
    assert not session.exists()


def test_the_next_memqual_command_removes_a_killed_runs_socket_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    from memqual.host.cli import main as cli

    proc, directory = _process_with_tempdir(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    monkeypatch.setenv("MEMQUAL_SOCKET_DIR", str(tmp_path))
    # a command that fails on its input still starts, and sweeps first
    assert cli.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    capsys.readouterr()
    assert not directory.exists()

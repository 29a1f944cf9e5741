"""memqual.host.core.locks: the one file lock.  Exclusive and shared holds
exclude each other across open files (flock is per open file, so one
process shows it), a wait ends at its deadline naming the holder, a
symlink is refused, and no other module calls flock."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import pytest

from memqual.host.core import locks
from memqual.host.core.errors import Timeout

ROOT = Path(__file__).resolve().parents[2]


def test_an_exclusive_hold_keeps_out_every_other(tmp_path: Path) -> None:
    first, second = locks.FileLock(tmp_path / "x.lock"), locks.FileLock(tmp_path / "x.lock")
    assert first.try_take()
    assert not second.try_take() and not second.try_take(exclusive=False)
    assert locks.is_free(tmp_path / "x.lock") is False
    first.release()
    assert second.try_take()
    second.release()
    assert locks.is_free(tmp_path / "x.lock") is True


def test_shared_holds_share(tmp_path: Path) -> None:
    a, b, c = (locks.FileLock(tmp_path / "s.lock") for _ in range(3))
    assert a.try_take(exclusive=False) and b.try_take(exclusive=False)
    assert not c.try_take()
    a.release()
    b.release()
    assert c.try_take()
    c.release()


def test_a_wait_ends_at_its_deadline_naming_the_holder(tmp_path: Path) -> None:
    holder = locks.FileLock(tmp_path / "m.lock", holder_pid=True)
    assert holder.try_take()
    started = time.monotonic()
    with pytest.raises(Timeout, match=rf"still held by pid {os.getpid()} after 0 s"):
        locks.FileLock(tmp_path / "m.lock").take(deadline_s=0.2, poll_s=0.05)
    assert 0.2 <= time.monotonic() - started < 2
    holder.release()
    assert locks.holder(tmp_path / "m.lock") is None  # an exclusive holder leaves no stale pid
    assert locks.FileLock(tmp_path / "m.lock").take(deadline_s=1) < 0.5


def test_file_lock_says_what_was_held(tmp_path: Path) -> None:
    with locks.file_lock(tmp_path / "b.lock", exclusive=True, deadline_s=1, held="x"):
        with pytest.raises(Timeout, match="the build runs after 0 s"):
            with locks.file_lock(tmp_path / "b.lock", exclusive=False, deadline_s=0.1, held="the build runs"):
                pass
    with locks.file_lock(tmp_path / "b.lock", exclusive=True, deadline_s=0.1, held="x"):
        pass  # let go on leaving the block


def test_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "l.lock").symlink_to(victim)
    with pytest.raises(OSError):
        locks.FileLock(tmp_path / "l.lock", holder_pid=True).try_take()
    assert locks.is_free(tmp_path / "l.lock") is None
    assert locks.is_free(tmp_path / "absent.lock") is None
    assert victim.read_text() == "precious\n"


def test_only_the_lock_module_calls_flock() -> None:
    found = []
    for folder in ("host", "images", "e2e"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.relative_to(ROOT) == Path("host/core/locks.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr in ("flock", "lockf"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"a file lock goes through memqual.host.core.locks: {found}"

"""What a killed memqual leaves behind, and the rule that removes it
without ever touching a live run's files.

The liveness rule is a lock, never an age or a PID alone: a keyed entry
is removed only under its writer's lock taken without waiting, a
``live_tempdir`` only once its ``.live`` lock is free, aexpect's session
directories only with both of aexpect's locks free.  Only the running
user's entries of these exact name forms are touched.  The entries and
the rule in full: docs/architecture.md, "Leftovers of killed runs".
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from memqual.host.core import settings, trust
from memqual.host.core.errors import BadInput
from memqual.host.core.locks import FileLock, is_free

log = logging.getLogger("memqual.leftovers")

STALE_AGE_S = 60.0  # an aexpect directory younger than this may be one being set up
# A temporary directory without its .live lock was made by an older memqual
# (or one killed within microseconds of mkdtemp): no lock can tell whether
# its run still lives, so only one older than any run is taken for stale.
LOCKLESS_AGE_S = 86400.0
LIVE_LOCK = ".live"
_MKDTEMP = r"[a-z0-9_]{8}"  # tempfile's random part
TEMPDIR_NAME = re.compile(rf"mq(?:-dl|-apt|pm|probe)?-{_MKDTEMP}")
IMAGE_STAGING = re.compile(rf"\.([0-9a-f]{{20}})-{_MKDTEMP}")
SNAPSHOT_STAGING = re.compile(rf"\.([0-9a-f]{{24}})\.tmp{_MKDTEMP}")
DEB_STAGING = re.compile(rf"\.dl-([a-z0-9][a-z0-9+.-]*)-{_MKDTEMP}")
QEMU_STAGING = re.compile(rf"\.unpack-([0-9A-Za-z.+~_-]+)-{_MKDTEMP}")
DEB_PARTIAL = re.compile(rf"\.([a-z0-9][a-z0-9+.-]*)_[^/]*\.deb\.{_MKDTEMP}")
AEXPECT_NAME = re.compile(r"aexpect_[A-Za-z0-9]+")

_held: dict[Path, FileLock] = {}  # live_tempdir's directories and their locked .live


def live_tempdir(prefix: str, parent: str | os.PathLike[str]) -> Path:
    """A fresh private directory ``parent``/``prefix``-XXXXXXXX whose
    ``.live`` this process holds locked until ``release_tempdir`` (or its
    death): the sweep never removes it while this process lives."""
    directory = Path(tempfile.mkdtemp(prefix=prefix + "-", dir=parent))
    # A fresh private directory: nobody else can hold, or plant, its lock.
    lock = FileLock(directory / (LIVE_LOCK + ".new"))
    if not lock.try_take():
        raise OSError(errno.EWOULDBLOCK, f"{lock.path} is locked in a directory just made")
    os.rename(lock.path, directory / LIVE_LOCK)  # appears already locked
    lock.path = directory / LIVE_LOCK
    _held[directory] = lock
    return directory


def release_tempdir(directory: Path) -> None:
    """Remove a ``live_tempdir`` and let go of its lock."""
    shutil.rmtree(directory, ignore_errors=True)
    lock = _held.pop(Path(directory), None)
    if lock is not None:
        lock.release()


def _ours(path: Path) -> os.stat_result | None:
    """lstat of ``path`` when it is the running user's, else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if st.st_uid == os.geteuid() and not stat.S_ISLNK(st.st_mode) else None


def _remove(path: Path, st: os.stat_result, why: str) -> int:
    size = tree_size(path) if stat.S_ISDIR(st.st_mode) else st.st_size
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    log.info("removed %s (%d MiB): %s", path, size >> 20, why)
    return 1


def tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _old(st: os.stat_result, age_s: float = STALE_AGE_S) -> bool:
    return time.time() - st.st_mtime > age_s


def sweep_keyed(parent: Path, pattern: re.Pattern[str], lock_of: Callable[[str], Path]) -> int:
    """Remove the stale entries of ``parent`` named like ``pattern``, each
    under its key's lock ``lock_of(key)`` taken without waiting."""
    removed = 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for name in names:
        match = pattern.fullmatch(name)
        if not match:
            continue
        path = parent / name
        st = _ours(path)
        if st is None:
            continue
        lock = FileLock(lock_of(match.group(1)))
        try:
            if not lock.try_take():
                continue  # its writer is at work
        except OSError:
            continue
        try:
            removed += _remove(path, st, "left by a run that was killed while writing it")
        finally:
            lock.release()
    return removed


def _our_dirs(parent: str | os.PathLike[str], pattern: re.Pattern[str]) -> Iterator[tuple[Path, os.stat_result]]:
    """The directories in ``parent`` whose names match ``pattern`` and that
    we own (never through a link), with their stat."""
    parent = Path(parent)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not pattern.fullmatch(name):
            continue
        path = parent / name
        st = _ours(path)
        if st is not None and stat.S_ISDIR(st.st_mode):
            yield path, st


def sweep_tempdirs(parent: str | os.PathLike[str]) -> int:
    """Remove ``parent``'s ``live_tempdir`` directories whose process died."""
    removed = 0
    for path, st in _our_dirs(parent, TEMPDIR_NAME):
        if path in _held:
            continue
        free = is_free(path / LIVE_LOCK)
        if free or (free is None and _old(st, LOCKLESS_AGE_S)):
            removed += _remove(path, st, "its process is gone")
    return removed


def sweep_aexpect(parent: str | os.PathLike[str]) -> int:
    """Remove aexpect session directories (and their close locks) that no
    aexpect server or starting client holds any more."""
    removed = 0
    for path, st in _our_dirs(parent, AEXPECT_NAME):
        if not _old(st):
            continue
        if is_free(path / "lock-server-running") is False or is_free(path / "lock-client-starting") is False:
            continue
        close_lock = path.with_name(f"{path.name}.lock")
        if is_free(close_lock) is False:
            continue
        removed += _remove(path, st, "no aexpect session behind it")
        lock_st = _ours(close_lock)
        if lock_st is not None and stat.S_ISREG(lock_st.st_mode):
            close_lock.unlink(missing_ok=True)
    return removed


def sweep_images(images: Path) -> int:
    return sweep_keyed(images, IMAGE_STAGING, lambda key: images / f".{key}.lock")


def sweep_snapshots(snapshots: Path) -> int:
    return sweep_keyed(snapshots, SNAPSHOT_STAGING, lambda key: snapshots / f"{key}.lock")


def package_lock(debs: Path, package: str) -> Path:
    """The lock a download of ``package`` holds while it writes into debs/."""
    return debs / f".{package}.lock"


def sweep_debs(debs: Path) -> int:
    return sweep_keyed(debs, DEB_STAGING, lambda p: package_lock(debs, p)) + sweep_keyed(
        debs, DEB_PARTIAL, lambda p: package_lock(debs, p)
    )


def qemu_lock(root: Path, name: str) -> Path:
    """The lock a fetch of the archive QEMU ``name`` holds while it unpacks
    into the cache's qemu/ and renames its tree into place."""
    return root / f".{name}.lock"


def sweep_qemu(root: Path) -> int:
    return sweep_keyed(root, QEMU_STAGING, lambda name: qemu_lock(root, name))


def sweep_process_dirs() -> int:
    """The socket and aexpect directories of killed runs, for a memqual
    command's start (the cache's own leftovers are swept where the cache is
    next used: the image build, a download, the snapshot cap)."""
    socket_dir = settings.socket_dir()
    try:
        trust.work_dir(socket_dir, "socket folder")
    except BadInput:
        # Not ours to clean: another user could have swapped what we left
        # there.  The command that needs it says so in one line.
        socket_dir = "/tmp"
    places = {socket_dir, "/tmp"}
    removed = sum(sweep_tempdirs(p) for p in places)
    return removed + sum(sweep_aexpect(p) for p in {*places, os.environ.get("TMPDIR", "/tmp")})

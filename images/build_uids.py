"""A uid of its own for each confined build (images/unprivileged.py
``confined``): taken from a reserved range that no account and no running
process has, and held, through its lock file, for the build's life, so no
two builds at once share one.  docs/patch-qualification.md, "Built
without root"."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memqual.host.core.errors import BadInput
from memqual.host.core.locks import FileLock

# Above every range a distribution hands out: accounts (below 60000),
# systemd's dynamic users (61184-65519), nobody (65534), and useradd's
# subordinate ranges for user namespaces (from 100000 to 600100000 by
# default); below 2**31, which some tools read as negative.
BUILD_UIDS = range(2_000_000_000, 2_000_000_064)
# Host-wide, not in a folder a setting moves: two memqual processes with
# different caches or build folders draw on the one range.  Under /run, so
# a reboot, which ends every build, frees every uid.
LOCKS = Path("/run/memqual-build-uids")
PROC = Path("/proc")


def _lock_folder() -> Path:
    try:
        LOCKS.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(LOCKS)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        raise BadInput(f"{LOCKS} is not root's private folder: remove it and try again")
    return LOCKS


def running_uids(proc: Path = PROC) -> set[int]:
    """Every uid a process has now (real, effective, saved, filesystem)."""
    uids: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:  # ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("Uid:"):
                uids.update(int(field) for field in line.split()[1:])
                break
    return uids


def _has_account(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


@contextmanager
def own_uid() -> Iterator[int]:
    """A uid of BUILD_UIDS (its gid the same number) that no account, no
    group and no process has, nor another build holds, for the ``with``
    block; refused in one line when all are taken."""
    folder = _lock_folder()
    busy = running_uids()
    for uid in BUILD_UIDS:
        if uid in busy or _has_account(uid):
            continue
        lock = FileLock(folder / str(uid))
        if not lock.try_take():
            continue
        try:
            if uid in running_uids():  # a process of it started since the first look
                continue
            yield uid
            return
        finally:
            lock.release()
    raise BadInput(f"all {len(BUILD_UIDS)} build uids are in use by other builds: wait for one to finish")

"""File locks between memqual processes on one host: flock, the one way.
The measurement lock, the host KSM lock, the snapshot, image, package and
QEMU fetch locks, the leftovers sweep's live-directory locks all go
through ``FileLock``.  A wait has a deadline (a non-blocking flock polled
through ``poll``), and ends in an exception saying what was held, by
whom.  The kernel drops a flock when its holder dies, even by SIGKILL.
Lock files are opened with O_NOFOLLOW: a symlink planted where a lock file
goes is refused, not followed.  docs/architecture.md lists the locks.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from memqual.host.core.errors import Timeout
from memqual.host.core.polling import poll

POLL_S = 0.05  # how often a waiting run retries: short beside any save or build


class FileLock:
    """One lock file.  ``take`` waits for it (shared or exclusive) up to a
    deadline, ``try_take`` tries once, ``release`` lets go (closing the file
    drops the flock).  With ``holder_pid`` the taker writes its pid into
    the file, so a waiter can say who holds it (``holder``)."""

    def __init__(self, path: Path, *, mode: int = 0o600, holder_pid: bool = False) -> None:
        self.path = path
        self.mode = mode
        self.holder_pid = holder_pid
        self._fd: int | None = None
        self._exclusive = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_take(self, *, exclusive: bool = True) -> bool:
        """Take the lock if it is free (True), else False at once.  The
        file is created if need be; OSError from opening it (a symlink:
        ELOOP) is the caller's."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, self.mode)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        if self.holder_pid:
            # With shared holders, the last one to take it is named.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd, self._exclusive = fd, exclusive
        return True

    def take(
        self,
        *,
        deadline_s: float,
        exclusive: bool = True,
        poll_s: float = POLL_S,
        on_timeout: Callable[[], BaseException] | None = None,
    ) -> float:
        """Wait up to ``deadline_s`` for the lock; the seconds waited.  Past
        the deadline: what ``on_timeout`` builds, else Timeout naming the
        file and its holder."""

        def timed_out() -> BaseException:
            if on_timeout is not None:
                return on_timeout()
            return Timeout(f"the lock {self.path} is still held by pid {self.holder() or '?'} after {deadline_s:.0f} s")

        return poll(
            lambda: self.try_take(exclusive=exclusive),
            deadline_s,
            poll_s,
            what=f"the lock {self.path}",
            on_timeout=lambda _: timed_out(),
        ).elapsed_s

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if self.holder_pid and self._exclusive:
                    # No stale pid for the next waiter to name (a shared
                    # holder leaves it: another may still hold the lock).
                    os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # closing drops the flock

    def holder(self) -> int | None:
        """The pid written by the lock's current (or last) holder."""
        return holder(self.path)


def holder(path: Path) -> int | None:
    """The pid a ``holder_pid`` lock's holder wrote into ``path``, if any."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() else None


def is_free(path: Path) -> bool | None:
    """Whether nobody holds ``path`` locked (tried exclusive and let go at
    once): True or False, None when there is no such file (or it is a
    link, or no regular file to flock).  Creates nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    finally:
        os.close(fd)


@contextmanager
def file_lock(path: Path, *, exclusive: bool, deadline_s: float, held: str) -> Iterator[None]:
    """Hold ``path`` locked (shared or exclusive) for the ``with`` block.
    ``held`` completes the Timeout's sentence: "<held> after N s"."""
    lock = FileLock(path)
    lock.take(
        deadline_s=deadline_s, exclusive=exclusive, on_timeout=lambda: Timeout(f"{held} after {deadline_s:.0f} s")
    )
    try:
        yield
    finally:
        lock.release()

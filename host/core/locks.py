"""File locks between memqual runs on one host: flock with a deadline.

A run that waits for another (a snapshot being saved, an image being built)
polls a non-blocking flock rather than blocking in the kernel, so the wait
has a deadline and ends in memqual's ``Timeout`` with a sentence saying what
was held.  Lock files are opened with O_NOFOLLOW: a symlink planted where a
lock file goes is refused, not followed.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memqual.host.core.errors import Timeout
from memqual.host.core.polling import poll

POLL_S = 0.05  # how often a waiting run retries: short beside any save or build


@contextmanager
def file_lock(path: Path, *, exclusive: bool, deadline_s: float, held: str) -> Iterator[None]:
    """Hold ``path`` locked (shared or exclusive) for the ``with`` block.
    ``held`` completes the Timeout's sentence: "<held> after N s"."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

        def taken() -> bool:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        poll(
            taken,
            deadline_s,
            POLL_S,
            what=f"the lock {path}",
            on_timeout=lambda _: Timeout(f"{held} after {deadline_s:.0f} s"),
        )
        yield
    finally:
        os.close(fd)

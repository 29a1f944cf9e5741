"""Where memqual keeps things: the cache (images, snapshots) and short
temporary directories for UNIX sockets (Avocado's work dirs exceed the
108-byte AF_UNIX limit).

Each folder is checked where it is handed out, by host/core/trust.py: the
cache with ``trusted_dir``, the sockets' folder with ``work_dir``.
"""

from __future__ import annotations

import errno
import importlib.resources
import os
import stat
import tempfile
from pathlib import Path

from memqual.host.core import leftovers, settings, trust
from memqual.host.core.errors import BadInput

# The checkout's top directory; in an installed wheel, site-packages/memqual.
# Resolved: in a checkout the code is imported through the links in src/memqual/.
REPO_ROOT = Path(__file__).resolve().parents[2]


def shipped(name: str) -> Path:
    """A folder the code reads at run time that is not Python: ``guest`` or
    ``claims``, package data of ``memqual`` found through importlib.resources
    (a checkout's src/memqual/ links it, a wheel holds it; pyproject.toml).
    Resolved, as REPO_ROOT is.  The agents are compiled from it, so it must
    be files on a disk, not inside an archive."""
    found = importlib.resources.files("memqual") / name
    if not isinstance(found, Path):
        raise RuntimeError(f"memqual's {name}/ is not on a file system ({found}): install memqual unpacked")
    return found.resolve()


def cache_dir() -> Path:
    """The user's cache directory for memqual (``$MEMQUAL_CACHE`` overrides),
    created private (0700) and checked with ``trust.trusted_dir``."""
    override = settings.cache()
    if override:
        base = override
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memqual"
    return trust.trusted_dir(base, f"cache directory (${settings.CACHE})" if override else "cache directory")


def short_tempdir(prefix: str = "mq") -> Path:
    """A fresh private directory with a short path, for sockets: in /tmp,
    or in ``$MEMQUAL_SOCKET_DIR`` (keep it short: a socket path must stay
    under 108 bytes).  Not $TMPDIR, which runners set to long paths.

    It is held live (host/core/leftovers.py) until ``release_tempdir``; those
    of killed runs are removed here first.  The folder is checked first
    (``trust.work_dir``): root writes sockets, logs and QEMU's output in
    what it makes there."""
    parent = trust.work_dir(settings.socket_dir(), f"socket folder (${settings.SOCKET_DIR})")
    leftovers.sweep_tempdirs(parent)
    return leftovers.live_tempdir(prefix, parent)


def release_tempdir(directory: Path) -> None:
    """Remove a ``short_tempdir`` when done with it."""
    leftovers.release_tempdir(directory)


def open_nofollow(path: Path, *, append: bool = False, mode: int = 0o644) -> int:
    """A file descriptor for writing ``path``, for a writer that streams (a
    log another process writes, a log appended line by line): created, and
    emptied unless ``append``; never through a link (O_NOFOLLOW), a regular
    file only (a FIFO would block, a device is no log).  The folder must
    have passed ``check_output_dir`` (or be memqual's own), so nobody else
    can put a link there after the check either."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_APPEND if append else 0)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadInput(f"{path} is a link: memqual writes no file through one; remove it") from exc
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads, a device without its driver
            raise BadInput(f"{path} is not a regular file: remove it or write elsewhere") from exc
        raise BadInput(f"{path}: cannot write it ({exc.strerror or exc})") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadInput(f"{path} is not a regular file: remove it or write elsewhere")
        if not append:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private_atomic(target: Path, data: bytes, mode: int = 0o600) -> None:
    """The one way memqual writes a file whole: ``data`` goes to an
    unpredictable temporary name in ``target``'s own folder, created with
    O_EXCL and O_NOFOLLOW (so never through a link someone planted, and
    never into a file someone else opened first), is given ``mode`` and
    flushed to disk, then renamed over ``target``.  A reader sees the old
    file or the new one, never half of one, even after a crash; a link at
    ``target`` itself is replaced, not followed."""
    target = Path(target)
    # mkstemp opens O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename itself survives a crash once the folder is on disk too.
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)

"""Where memqual keeps things: the cache (images, snapshots) and short
temporary directories for UNIX sockets (Avocado's work dirs exceed the
108-byte AF_UNIX limit).

memqual runs as root on lab hosts, and what it finds in the cache (a saved
guest state, SSH keys, a built image) or in the state directory (knobs to
write back) is trusted.  So a directory that someone else could have put
there, or could change, is refused: it must belong to the running user and
be writable by nobody else, and so must every directory above it up to /,
as OpenSSH's ``safe_path`` checks (``trusted_dir``): whoever can rename an
entry of a parent can swap the whole tree below it after the check.

One exception, for the parents only: a root-owned directory with the
sticky bit (/tmp) is accepted although everyone may write it.  There only
an entry's owner (or root) may rename or remove it, so nobody else can swap
our entry, and an entry someone else made first fails the owner check.
pytest's tmp_path and short_tempdir's sockets live there."""

from __future__ import annotations

import importlib.resources
import os
import stat
import tempfile
from pathlib import Path

from memqual.host.core import leftovers, settings
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


class UntrustedDirectory(BadInput):
    """A cache or state directory another user owns or may write."""


def trusted_dir(path: Path, what: str, create: bool = True, mode: int = 0o700) -> Path:
    """``path`` as a directory only the running user controls.

    Created with ``mode`` when missing (and ``create``).  Refused with one
    line when it is not a directory, belongs to another user, or is
    writable by its group or others.  A symlink is followed (a cache on
    another disk is common) but its target must pass the same check."""
    path = Path(path)
    if create:
        try:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"{what} {path}: cannot create it ({exc.strerror or exc}); point it elsewhere") from exc
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadInput(f"{what} {path}: {exc.strerror or exc}") from exc
    check_trusted_stat(st, path, what)
    check_ancestors(path, what)
    return path


def trusted_owners() -> frozenset[int]:
    """Who may own a directory above a trusted one: root and the running user."""
    return frozenset({0, os.geteuid()})


def weak_spot(path: Path, owners: frozenset[int], *, itself: bool = True) -> str | None:
    """Why ``path`` could be changed by someone outside ``owners``, or None.

    Checked: ``path`` and every directory above it up to /, both along the
    path as given and along each of its prefixes resolved (a symlink on
    the way leads the check through its target's parents too).  Each must
    belong to one of ``owners`` and be writable by neither group nor
    others; a root-owned sticky directory (/tmp) passes as a parent (see
    the module's docstring), and as ``path`` itself when not ``itself``."""
    absolute = Path(os.path.abspath(path))
    own = {absolute, Path(os.path.realpath(absolute))} if itself else set()
    seen: set[Path] = set()
    for prefix in (absolute, *absolute.parents):
        real = Path(os.path.realpath(prefix))
        for place in (prefix, real, *real.parents):
            if place in seen:
                continue
            seen.add(place)
            try:
                st = os.stat(place)
            except OSError as exc:
                return f"{place} cannot be checked ({exc.strerror or exc})"
            if st.st_uid not in owners:
                return f"{place} belongs to uid {st.st_uid}"
            shared_sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (shared_sticky and place not in own):
                return f"{place} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_ancestors(path: Path, what: str) -> None:
    """Refuse ``path`` (one line) when a directory above it could be
    renamed or replaced by a user other than root or the running user."""
    absolute = Path(os.path.abspath(path))
    problem = None
    for place in (absolute, Path(os.path.realpath(absolute))):  # a symlinked cache: its target's parents too
        problem = problem or weak_spot(place.parent, trusted_owners(), itself=False)
    if problem is not None:
        raise UntrustedDirectory(
            f"{what} {path} lies under {problem}, where another user could swap it: "
            "use a directory whose every parent is root's or yours and writable by nobody else"
        )


def check_trusted_stat(st: os.stat_result, path: Path, what: str) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedDirectory(f"{what} {path} is not a directory: point it at a directory of your own")
    euid = os.geteuid()
    if st.st_uid != euid:
        raise UntrustedDirectory(
            f"{what} {path} belongs to uid {st.st_uid}, not to you (uid {euid}): "
            f"use a directory of your own (chown it, or choose another)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedDirectory(
            f"{what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            f"run 'chmod go-w {path}' or choose another directory"
        )


def cache_dir() -> Path:
    """The user's cache directory for memqual (``$MEMQUAL_CACHE`` overrides),
    created private (0700) and checked with ``trusted_dir``."""
    override = settings.cache()
    if override:
        base = override
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memqual"
    return trusted_dir(base, "cache directory")


def short_tempdir(prefix: str = "mq") -> Path:
    """A fresh private directory with a short path, for sockets: in /tmp,
    or in ``$MEMQUAL_SOCKET_DIR`` (keep it short: a socket path must stay
    under 108 bytes).  Not $TMPDIR, which runners set to long paths.

    It is held live (host/core/leftovers.py) until ``release_tempdir``; those
    of killed runs are removed here first."""
    parent = settings.socket_dir()
    leftovers.sweep_tempdirs(parent)
    return leftovers.live_tempdir(prefix, parent)


def release_tempdir(directory: Path) -> None:
    """Remove a ``short_tempdir`` when done with it."""
    leftovers.release_tempdir(directory)


def check_output_dir(path: Path, what: str) -> None:
    """Refuse to write below ``path`` (an output folder, or the folder of
    an output file) when someone else could change what is there: memqual
    runs as root, and a folder another user may write lets them plant a
    link where root's next file goes.  When ``path`` does not exist yet,
    the folder it will be made in is checked instead (memqual makes the
    rest).  The folder must belong to the running user (or root) and be
    writable by nobody else; a symlink is followed and its target checked.
    Raises UntrustedDirectory (one line) otherwise."""
    path = Path(path)
    nearest = path
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    try:
        st = os.stat(nearest)
    except OSError as exc:
        raise BadInput(f"{what} {path}: {exc.strerror or exc}") from exc
    where = f"{what} {path}" if nearest == path else f"{what} {path}: {nearest}, where it is made,"
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedDirectory(f"{where} is not a directory")
    euid = os.geteuid()
    if st.st_uid not in (euid, 0):
        raise UntrustedDirectory(
            f"{where} belongs to uid {st.st_uid}, not to you (uid {euid}): write into a folder of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedDirectory(
            f"{where} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            f"write into a folder of your own, or run 'chmod go-w {nearest}'"
        )


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

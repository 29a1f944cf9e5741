"""Where memqual keeps things: the cache (images, snapshots) and short
temporary directories for UNIX sockets (Avocado's work dirs exceed the
108-byte AF_UNIX limit).

A directory memqual trusts (``trusted_dir``) must be the running user's and
writable by nobody else, and so must every directory above it up to / (a
root-owned sticky /tmp excepted), each entry looked at itself (lstat).  Why
and how: docs/architecture.md, "Trusted directories".
"""

from __future__ import annotations

import errno
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

    Created with ``mode`` when missing (and ``create``), but only once the
    folder it is made in, and every one above, has passed: root makes
    nothing inside another user's folder.  Refused with one line when it is
    not a directory, belongs to another user, or is writable by its group or
    others.  A symlink is followed (a cache on another disk is common) when
    the link itself is root's or ours, and its target must pass the same
    check."""
    path = Path(path)
    if create and not os.path.lexists(path):
        existing = nearest_existing(path)
        problem = weak_spot(existing, trusted_owners(), itself=False)
        if problem is not None:
            raise UntrustedDirectory(
                f"{what} {path} would be made under {problem}, where another user could swap it: "
                "use a directory whose every parent is root's or yours and writable by nobody else"
            )
        try:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"{what} {path}: cannot create it ({exc.strerror or exc}); point it elsewhere") from exc
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError as exc:
        raise BadInput(f"{what} {path}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in trusted_owners():
        raise UntrustedDirectory(
            f"{what} {path} is a link of uid {link.st_uid}, who could point it elsewhere: use a directory of your own"
        )
    check_trusted_stat(st, path, what)
    check_ancestors(path, what)
    return path


def nearest_existing(path: Path) -> Path:
    """``path`` or the nearest folder above it that exists (as a name:
    a dangling link counts as existing)."""
    absolute = Path(os.path.abspath(path))
    while not os.path.lexists(absolute) and absolute != absolute.parent:
        absolute = absolute.parent
    return absolute


def trusted_owners() -> frozenset[int]:
    """Who may own a directory above a trusted one: root and the running user."""
    return frozenset({0, os.geteuid()})


def weak_spot(path: Path, owners: frozenset[int], *, itself: bool = True) -> str | None:
    """Why ``path`` could be changed by someone outside ``owners``, or None.

    Checked: ``path`` and every directory above it up to /, both along the
    path as given and along each of its prefixes resolved (a symlink on
    the way leads the check through its target's parents too).  Each must
    belong to one of ``owners`` and be writable by neither group nor
    others, and a symlink on the way must itself belong to one of
    ``owners`` (its maker could remove it and point a new one elsewhere);
    a root-owned sticky directory (/tmp) passes as a parent (see the
    module's docstring), and as ``path`` itself when not ``itself``, unless
    a group other than root's may write it."""
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
                link = os.lstat(place)
                st = os.stat(place)
            except OSError as exc:
                return f"{place} cannot be checked ({exc.strerror or exc})"
            if stat.S_ISLNK(link.st_mode) and link.st_uid not in owners:
                return f"{place} is a link of uid {link.st_uid}"
            if st.st_uid not in owners:
                return f"{place} belongs to uid {st.st_uid}"
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (place not in own and shared_sticky(st)):
                return f"{place} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def shared_sticky(st: os.stat_result) -> bool:
    """A folder like /tmp: root's, sticky (only an entry's owner may rename
    or remove it), and writable by no group but root's.  The kernel's
    fs.protected_symlinks covers only world-writable sticky folders, so a
    group-writable one is no safer than any other folder its group may
    write."""
    return (
        stat.S_ISDIR(st.st_mode)
        and bool(st.st_mode & stat.S_ISVTX)
        and st.st_uid == 0
        and (not st.st_mode & stat.S_IWGRP or st.st_gid == 0)
    )


def user_owners() -> frozenset[int]:
    """Who may own a program, a test or a kernel tree root runs or loads:
    root, the running user and the user who ran memqual through sudo
    (whoever sets SUDO_UID for a root process could run anything as root
    already)."""
    owners = {0, os.geteuid(), os.getuid()}
    sudo_uid = os.environ.get("SUDO_UID", "")
    if sudo_uid.isdigit():
        owners.add(int(sudo_uid))
    return frozenset(owners)


def tree_weak_spot(tree: Path, owners: frozenset[int]) -> str | None:
    """Why some entry below ``tree`` could be changed by a user outside
    ``owners``, or None.  Walked without following links (lstat); a link
    that leads out of the trees walked so far has its target checked with
    ``weak_spot`` (its parents up to /), and a folder it names is walked
    too; a dangling one counts by the folder its target would be made in.
    About 0.1 s per 20,000 entries here."""
    roots: list[Path] = [Path(os.path.realpath(tree))]
    pending: list[Path] = [roots[0]]

    def inside(target: str) -> bool:
        return any(target == str(r) or target.startswith(f"{r}/") for r in roots)

    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            return f"{folder} cannot be read ({exc.strerror or exc})"
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                return f"{entry.path} cannot be checked ({exc.strerror or exc})"
            if st.st_uid not in owners:
                return f"{entry.path} belongs to uid {st.st_uid}"
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(entry.path)
                if inside(target):
                    continue
                exists = os.path.exists(target)
                spot = weak_spot(Path(target) if exists else nearest_existing(Path(target)), owners)
                if spot is not None:
                    return f"{entry.path} leads to {target}, and {spot}"
                if exists and os.path.isdir(target):
                    roots.append(Path(target))
                    pending.append(Path(target))
                continue
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return f"{entry.path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
            if stat.S_ISDIR(st.st_mode):
                pending.append(Path(entry.path))
    return None


def check_loaded(path: Path, what: str) -> None:
    """Refuse (one line) a program memqual runs or a test file it loads,
    when a user other than ``user_owners`` could change it: the file (or
    folder), every folder above it up to /, and everything in its folder
    (a test imports its neighbours; a build runs with the files beside
    it), walked as ``tree_weak_spot`` does."""
    owners = user_owners()
    path = Path(os.path.abspath(path))
    folder = path if path.is_dir() else path.parent
    problem = weak_spot(path, owners) or tree_weak_spot(folder, owners)
    if problem is not None:
        raise UntrustedDirectory(
            f"{what} {path}: {problem}, so another user could change what memqual runs as uid {os.geteuid()} "
            f"(uids trusted: {', '.join(map(str, sorted(owners)))}): use files only you or root can write"
        )


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
    runs as root, and a folder another user may write, or may rename or
    replace (any folder above it, or a link on the way), lets them plant a
    link where root's next file goes.  When ``path`` does not exist yet,
    the folder it will be made in is checked instead (memqual makes the
    rest).  That folder and every folder above it up to / (as given and
    resolved, links on the way included) must belong to the running user
    or root and be writable by nobody else, as ``weak_spot`` checks; a
    root-owned sticky folder (/tmp) passes as a parent only.  Raises
    UntrustedDirectory (one line) otherwise."""
    path = Path(path)
    nearest = nearest_existing(path)
    where = (
        f"{what} {path}" if nearest == Path(os.path.abspath(path)) else f"{what} {path}: {nearest}, where it is made,"
    )
    try:
        st = os.stat(nearest)
    except OSError as exc:
        raise BadInput(f"{what} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedDirectory(f"{where} is not a directory")
    euid = os.geteuid()
    problem = weak_spot(nearest, trusted_owners())
    if problem is not None:
        raise UntrustedDirectory(
            f"{where} is not safe from other users: {problem} (uid {euid} and root are trusted): "
            "write into a folder of your own, whose every parent is root's or yours and writable by nobody else"
        )


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

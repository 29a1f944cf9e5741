"""The one check of what memqual trusts: every program it runs, every
folder it keeps things in or writes into, every key it reads.  memqual runs
as root: whoever could change one of these would run code as root.

The rule (``weak_spot``): the path and every folder above it up to /, as
given and resolved, are root's or yours, writable by nobody else, each
link on the way looked at itself (lstat); a root-owned sticky folder
(/tmp) passes as a parent.  Each accessor returns through one of the
checks here, so no caller can skip it.  docs/architecture.md, "Nothing
another user can write is trusted"."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from memqual.host.core.errors import BadInput


class Untrusted(BadInput):
    """A program, folder or key another user owns or may change."""


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
        check_before_making(path, what)
        try:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"{what} {path}: cannot create it ({exc.strerror or exc}); point it elsewhere") from exc
    link = stat_of(path, f"{what} {path}", follow=False)
    st = stat_of(path, f"{what} {path}")
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in trusted_owners():
        raise Untrusted(
            f"{what} {path} is a link of uid {link.st_uid}, who could point it elsewhere: use a directory of your own"
        )
    check_trusted_stat(st, path, what)
    check_ancestors(path, what)
    return path


def stat_of(path: Path, named: str, advice: str = "", *, follow: bool = True) -> os.stat_result:
    """``path``'s stat (its link's own without ``follow``), or one line
    (BadInput): ``named``, why it cannot be read, then ``advice``."""
    try:
        return os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise BadInput(f"{named}: {exc.strerror or exc}{advice}") from exc


def check_before_making(path: Path, what: str) -> None:
    """Refuse (one line) to make ``path`` when the folder it would be made
    in, or any above it, could be renamed or replaced by another user: root
    makes nothing inside another user's folder."""
    problem = weak_spot(nearest_existing(path), trusted_owners(), itself=False)
    if problem is not None:
        raise Untrusted(
            f"{what} {path} would be made under {problem}, where another user could swap it: "
            "use a directory whose every parent is root's or yours and writable by nobody else"
        )


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


def check_loaded(path: Path, what: str, *, beside: bool = True) -> None:
    """Refuse (one line) a program memqual runs or a test file it loads,
    when a user other than ``user_owners`` could change it: the file (or
    folder), every folder above it up to /, and with ``beside`` everything
    in its folder (a test imports its neighbours; a build runs with the
    files beside it), walked as ``tree_weak_spot`` does."""
    owners = user_owners()
    path = Path(os.path.abspath(path))
    folder = path if path.is_dir() else path.parent
    problem = weak_spot(path, owners) or (tree_weak_spot(folder, owners) if beside else None)
    if problem is not None:
        raise Untrusted(
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
        raise Untrusted(
            f"{what} {path} lies under {problem}, where another user could swap it: "
            "use a directory whose every parent is root's or yours and writable by nobody else"
        )


def check_trusted_stat(st: os.stat_result, path: Path, what: str) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{what} {path} is not a directory: point it at a directory of your own")
    euid = os.geteuid()
    if st.st_uid != euid:
        raise Untrusted(
            f"{what} {path} belongs to uid {st.st_uid}, not to you (uid {euid}): "
            f"use a directory of your own (chown it, or choose another)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Untrusted(
            f"{what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            f"run 'chmod go-w {path}' or choose another directory"
        )


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
    Untrusted (one line) otherwise."""
    path = Path(path)
    nearest = nearest_existing(path)
    where = (
        f"{what} {path}" if nearest == Path(os.path.abspath(path)) else f"{what} {path}: {nearest}, where it is made,"
    )
    st = stat_of(nearest, f"{what} {path}")
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{where} is not a directory")
    euid = os.geteuid()
    problem = weak_spot(nearest, trusted_owners())
    if problem is not None:
        raise Untrusted(
            f"{where} is not safe from other users: {problem} (uid {euid} and root are trusted): "
            "write into a folder of your own, whose every parent is root's or yours and writable by nobody else"
        )


def program(path: str | os.PathLike[str], what: str, missing: str, *, beside: bool = True) -> Path:
    """``path`` as a program memqual may run: an executable regular file
    (else BadInput ``missing``, one line) that nobody but root, you or your
    sudo user can change, nor any folder above it up to /.  With
    ``beside``, everything in its folder too (``check_loaded``): a build of
    QEMU loads what lies beside it.  A program installed by the system
    (found on PATH) loads from its package's own folders instead, and
    walking /usr/bin's thousand entries costs 80 ms a call here, so it
    goes without."""
    path = Path(path)
    try:
        usable = path.is_file() and os.access(path, os.X_OK)
    except OSError:  # a name too long, a loop of links
        usable = False
    if not usable:
        raise BadInput(missing)
    check_loaded(path, what, beside=beside)
    return path


def work_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a folder memqual makes its own private folders in (the
    sockets' folder): an existing directory whose every folder up to / is
    root's or ours and writable by nobody else; the folder itself may also
    be a root-owned sticky one like /tmp, where nobody else can rename
    what we make.  Refused in one line otherwise: in a folder another user
    may write, they could swap our folder for theirs and have root write
    through their links."""
    path = Path(path)
    st = stat_of(path, f"{what} {path}", ": point it at a directory of your own")
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{what} {path} is not a directory: point it at a directory of your own")
    problem = weak_spot(path, trusted_owners(), itself=False)
    if problem is not None:
        raise Untrusted(
            f"{what} {path} is not safe from other users: {problem} (uid {os.geteuid()} and root are trusted): "
            "use a folder whose every parent is root's or yours and writable by nobody else"
        )
    return path


def private_file(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a file memqual reads as the proof of who is who (an SSH
    key, a known_hosts file): a regular file that the running user, root or
    the user who ran memqual through sudo owns, writable by nobody else, as
    is every folder above it up to / (links on the way included).  Whoever
    could change a known_hosts file could put their own host in a lab
    host's place; a key another user may write is theirs.  Returned
    resolved, so what ssh opens is what was checked."""
    path = Path(path)
    st = stat_of(path, f"{what} {path}")
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(f"{what} {path} is not a regular file: give a file of your own")
    owners = user_owners()
    problem = weak_spot(path, owners)
    if problem is not None:
        raise Untrusted(
            f"{what} {path}: {problem}, so another user could change whom memqual trusts "
            f"(uids trusted: {', '.join(map(str, sorted(owners)))}): use a file only you or root can write"
        )
    return Path(os.path.realpath(path))

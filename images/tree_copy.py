"""A kept base tree, sealed as root's, and the copy a patched build starts from.

``seal`` makes the build user's finished unpatched tree root's (files 0444 or
0555, never set-id; folders 0755) and ``digest`` records its entries.  The
build user then owns no inode of it: it can neither chmod nor write one, even
through a hard link in its own copy, and cannot set back the mtime a write
through a descriptor kept from before the seal moves, which ``verify`` finds
before each copy.  ``copy_tree`` runs as root in a root-owned 0700 folder:
sources linked, outputs copied with their times, then folders and copies
given to the build user.  docs/patch-qualification.md, "Built without root".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from memqual.host.core.errors import BadInput
from memqual.images import unprivileged

SEALED_FILE = 0o444
SEALED_EXEC = 0o555
SEALED_DIR = 0o755
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class TreeRefused(Exception):
    """A tree that cannot be kept as a base (a link where a folder was, a
    file linked from elsewhere)."""


@dataclasses.dataclass(frozen=True)
class Copied:
    linked: int
    copied: int
    copied_bytes: int

    def __str__(self) -> str:
        return f"{self.linked} linked, {self.copied} copied ({self.copied_bytes >> 20} MiB)"


def seal(tree: Path) -> None:
    """``tree`` (a folder root holds in its own 0700 folder, its content made
    by the build user) made root's and read-only, top down: each folder is
    root's before it is listed, so what is listed stays; every descriptor is
    opened without following links.  A regular file with another link
    (made elsewhere by the build user) is refused: root would own, and vouch
    for, an inode outside the tree."""
    fd = os.open(tree, _OPEN_DIR)
    try:
        _seal_dir(fd, str(tree))
    finally:
        os.close(fd)


def _seal_dir(fd: int, where: str) -> None:
    os.fchown(fd, 0, 0)
    os.fchmod(fd, SEALED_DIR)
    with os.scandir(fd) as listing:
        names = [entry.name for entry in listing]
    for name in names:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            os.chown(name, 0, 0, dir_fd=fd, follow_symlinks=False)
        elif stat.S_ISDIR(st.st_mode):
            child = os.open(name, _OPEN_DIR, dir_fd=fd)
            try:
                _seal_dir(child, f"{where}/{name}")
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode):
            child = os.open(name, _OPEN_FILE, dir_fd=fd)
            try:
                st = os.fstat(child)
                if not stat.S_ISREG(st.st_mode):
                    raise TreeRefused(f"{where}/{name} changed while it was sealed")
                mode = SEALED_EXEC if st.st_mode & 0o111 else SEALED_FILE
                if st.st_nlink != 1:
                    _replace_by_copy(fd, name, child, st, mode)
                else:
                    os.fchown(child, 0, 0)
                    os.fchmod(child, mode)
            finally:
                os.close(child)
        else:  # a fifo or a socket: no build output a later build needs
            os.unlink(name, dir_fd=fd)


def _replace_by_copy(dir_fd: int, name: str, source: int, st: os.stat_result, mode: int) -> None:
    """A file with other links (the build user may have made one elsewhere)
    replaced by a copy of root's: root never takes over, nor vouches for, an
    inode outside the tree."""
    temporary = f".{name}.sealing"
    out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    with os.fdopen(out, "wb") as sink, os.fdopen(os.dup(source), "rb") as data:
        shutil.copyfileobj(data, sink, 1 << 20)
        sink.flush()
        os.fchmod(sink.fileno(), mode)
        os.utime(sink.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def digest(tree: Path) -> str:
    """Every entry of a sealed tree (only root can change it, so walking it
    by name is safe): name, type, inode, size, mtime, mode, owner and a
    link's target, in a fixed order, hashed.  Not the ctime: linking a
    source into a copy, and a patch replacing that link, change it."""
    hasher = hashlib.sha256()
    for root, dirs, files in os.walk(tree):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = os.path.join(root, name)
            st = os.lstat(path)
            target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
            rel = os.path.relpath(path, tree)
            hasher.update(
                f"{rel}\0{st.st_mode:o}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_uid}\0{target}\n".encode(
                    errors="surrogateescape"
                )
            )
    return hasher.hexdigest()


def verify(tree: Path, recorded: str) -> str | None:
    """None when ``tree`` is as sealed, else what is wrong, in a few words."""
    try:
        st = os.lstat(tree)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        return "not a sealed folder of root's"
    return None if digest(tree) == recorded else "changed since it was sealed"


def copy_tree(base: Path, dest: Path, stamp_ns: int, uid: int, gid: int) -> Copied:
    """BASE (sealed) as DEST (a new folder below a root-owned 0700 one that
    the build user cannot reach yet): files no newer than ``stamp_ns``
    (the sources, as unpacked) hard-linked, root's and read-only; the rest
    (objects, generated headers, .config, the host tools) copied with their
    times, the build user's and writable; symlinks as links; every folder
    the build user's, so it may add, rename and remove entries but change
    no linked inode."""
    linked = copied = copied_bytes = 0
    folders = [dest]
    os.mkdir(dest, 0o755)
    for root, dirs, files in os.walk(base):
        rel = os.path.relpath(root, base)
        target = dest if rel == "." else dest / rel
        for name in list(dirs):
            path, out = os.path.join(root, name), target / name
            if os.path.islink(path):
                os.symlink(os.readlink(path), out)
                os.chown(out, uid, gid, follow_symlinks=False)
                dirs.remove(name)
            else:
                os.mkdir(out, 0o755)
                folders.append(out)
        for name in files:
            path, out = os.path.join(root, name), target / name
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(path), out)
                os.chown(out, uid, gid, follow_symlinks=False)
            elif not stat.S_ISREG(st.st_mode):
                continue
            elif st.st_mtime_ns <= stamp_ns:
                os.link(path, out, follow_symlinks=False)
                linked += 1
            else:
                shutil.copyfile(path, out, follow_symlinks=False)
                os.chmod(out, stat.S_IMODE(st.st_mode) | 0o200)
                os.chown(out, uid, gid)
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
                copied += 1
                copied_bytes += st.st_size
    for folder in folders:
        os.chown(folder, uid, gid)
    return Copied(linked, copied, copied_bytes)


# ------------------------------------------------------------ the kept base tree

# A kept base tree's record, root's, beside its sealed tree: the digest
# of its entries and when its source was unpacked (what is no newer is
# source, linked into a patched build's copy; the rest output, copied).
BASE_RECORD = "base.json"


@dataclasses.dataclass(frozen=True)
class BaseRecord:
    digest: str  # digest of the sealed tree
    sources_end_ns: int  # what kernel_sources.unpack returned


def keep_base(folder: Path, base: Path, sources_end_ns: int) -> None:
    """The unpatched build's tree (``folder``/linux, the build user's) made
    the base of later patched builds of its key: moved into a root-owned
    0700 folder, sealed (images/py), its record written, then put
    in place of ``base``.  Nothing of the build user's is left in it."""
    sealing = Path(tempfile.mkdtemp(prefix=".base-", dir=base.parent))
    try:
        os.rename(folder / "linux", sealing / "linux")
        seal(sealing / "linux")
        record = BaseRecord(digest(sealing / "linux"), sources_end_ns)
        (sealing / BASE_RECORD).write_text(json.dumps(dataclasses.asdict(record)) + "\n")
        remove_base(base)
        os.rename(sealing, base)
    except (OSError, TreeRefused):
        shutil.rmtree(sealing, ignore_errors=True)
        raise


def remove_base(base: Path) -> None:
    """A kept base removed: a sealed one by root (only root can change it);
    one of an older recipe, the build user's, as a build folder is."""
    try:
        st = os.lstat(base)
    except FileNotFoundError:
        return
    if st.st_uid == 0:
        shutil.rmtree(base, ignore_errors=True)
    else:
        unprivileged.remove_folder(unprivileged.build_user(), base)


def base_problem(base: Path) -> str | None:
    """None when ``base`` is a sealed base tree as it was recorded (a built
    vmlinux in it), else why it cannot be used."""
    record = base / BASE_RECORD
    try:
        st = os.lstat(record)
    except FileNotFoundError:
        return "absent" if not os.path.lexists(base) else "not sealed (kept by an older memqual)"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or os.lstat(base).st_uid != 0:
        return "not sealed (not root's)"
    try:
        known = BaseRecord(**json.loads(record.read_text()))
    except (OSError, ValueError, TypeError):
        return "not sealed (its record is unreadable)"
    if not os.path.isfile(base / "linux" / "vmlinux"):
        return "incomplete (no vmlinux)"
    return verify(base / "linux", known.digest)


def copy_base(user: unprivileged.BuildUser, base: Path, folder: Path) -> str:
    """The sealed base tree as ``folder``/linux, made by root
    (images/py) in a root-owned 0700 staging folder and renamed
    into place once whole; what it linked and copied."""
    known = BaseRecord(**json.loads((base / BASE_RECORD).read_text()))
    staging = Path(tempfile.mkdtemp(prefix=".copy-", dir=base.parent))
    try:
        copied = copy_tree(base / "linux", staging / "linux", known.sources_end_ns, user.uid, user.gid)
        os.rename(staging / "linux", folder / "linux")
    except OSError as exc:
        raise BadInput(f"copying the base tree failed: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(copied)

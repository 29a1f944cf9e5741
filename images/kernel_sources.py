"""A kernel build's source: ``resolve_source`` (``debian:X.Y``, a folder,
``DIR@REV``, each read by its owner and checked whole), the revisions a
bisect probes, the files two revisions differ in, and ``unpack``, the tree
streamed as a tar into the build user's folder (a folder's from the copy
its hash was taken of: read once).  docs/patch-qualification.md."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from memqual.host.core.errors import BadInput
from memqual.host.core.paths import cache_dir
from memqual.host.core.trust import weak_spot
from memqual.images import packages, unprivileged
from memqual.images.kernel_env import STEP_TIMEOUT_S

DEBIAN_SOURCE = re.compile(r"debian:([0-9]+\.[0-9]+)")
GIT_REV = re.compile(r"[0-9A-Za-z._/~^-]{1,200}")
# The host kernels' default source (memqual run --host-patch): the one the
# memslot search kernels were built from (images/kvm-memslots/), so an
# unpatched A with images/host.config is the cached base they share.
HOST_SOURCE = "debian:6.1"


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # "debian", "folder" or "git"
    spec: str  # as given
    label: str  # what a record says: linux-source-6.1 6.1.192-3, /src/linux, /src/linux@abc123
    sha256: str  # the content's id: the .deb's sha256, the tree's tar stream's, git:<commit>
    path: Path  # the .deb, the folder, the repository
    rev: str = ""  # the commit, for git
    # a folder's tar stream as it was hashed, in an unnamed file of root's
    # (gone with the process): unpacked from there, so what is built is
    # what the key names even if the folder changes after it was read
    spool: IO[bytes] | None = dataclasses.field(default=None, compare=False, repr=False)


# The folders tar's --exclude-vcs leaves out of a folder's stream: never
# read, so not checked either.
VCS_FOLDERS = frozenset({".git", ".hg", ".bzr", ".svn", "CVS", "RCS", "SCCS", "_darcs", ".arch-ids", "{arch}"})


def owner_of(path: Path, whole: Path | None = None, skip: frozenset[str] = frozenset()) -> unprivileged.BuildUser:
    """Who reads a user's tree: its owner, which must be root or the user
    memqual runs for.  A tree another user can change is refused: ``path``
    and every folder above it, and every entry of ``whole`` (``path``
    unless given; its folders named in ``skip`` left out), ``tree_problem``."""
    from memqual.images.balloon_driver import tree_owners

    st = path.stat()
    owners = tree_owners()
    problem = weak_spot(path, owners) or tree_problem(path if whole is None else whole, owners, skip)
    if problem is not None:
        raise BadInput(f"kernel source {path}: {problem}: build from a tree of your own")
    return unprivileged.BuildUser(str(st.st_uid), st.st_uid, st.st_gid)


def tree_problem(tree: Path, owners: frozenset[int], skip: frozenset[str] = frozenset()) -> str | None:
    """Why some entry below ``tree`` is not its owners' alone, or None: each
    must belong to one of ``owners`` and be writable by neither group nor
    others, and a link must lead to an entry inside the tree (what it
    points at is built, but is in neither the tree's hash nor this
    check).  Walked without following links: about 0.3 s for a kernel
    source tree's 80,000 entries."""
    if not os.path.isdir(tree):
        return None  # a .git file (a worktree's): its owner and mode are checked as the top's
    top = os.path.realpath(tree)
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
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
                if target != top and not target.startswith(top + "/"):
                    return f"{entry.path} is a link out of the tree (to {target})"
                continue
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return f"{entry.path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
            if stat.S_ISDIR(st.st_mode) and entry.name not in skip:
                pending.append(entry.path)
    return None


def _as_owner(owner: unprivileged.BuildUser, argv: list[str]) -> list[str]:
    if owner.uid == 0 or os.geteuid() != 0:
        return argv
    return unprivileged.as_user(owner.uid, owner.gid, argv)


def _owner_env() -> dict[str, str]:
    return {"PATH": unprivileged.BUILD_PATH, "HOME": "/nonexistent", "LC_ALL": "C.UTF-8", "GIT_CONFIG_NOSYSTEM": "1"}


def resolve_source(spec: str, cache: Path | None = None) -> Source:
    """SOURCE as the command line gives it, checked; the .deb is fetched."""
    match = DEBIAN_SOURCE.fullmatch(spec)
    if match:
        cache = cache or cache_dir()
        package = f"linux-source-{match.group(1)}"
        deb = packages.download(package, cache)
        version = deb.name.split("_")[1].replace("%3a", ":")
        return Source("debian", spec, f"{package} {version}", packages.sha256_file(deb), deb)
    if spec.startswith("debian:"):
        raise BadInput(f"kernel source {spec!r}: give debian:X.Y (e.g. debian:6.1), a folder or DIR@REV")
    if "@" in spec and not Path(spec).exists():
        directory, rev = spec.rsplit("@", 1)
        repo = Path(directory)
        if not GIT_REV.fullmatch(rev) or rev.startswith("-"):
            raise BadInput(f"kernel source {spec!r}: {rev!r} is not a git revision")
        if not (repo / ".git").exists():
            raise BadInput(f"kernel source {spec!r}: {repo} is not a git repository")
        owner = repo_owner(repo)
        proc = subprocess.run(
            _as_owner(owner, ["git", "-C", str(repo.resolve()), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"]),
            capture_output=True,
            text=True,
            env=_owner_env(),
            timeout=120,
            check=False,
        )
        commit = proc.stdout.strip()
        if proc.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", commit):
            raise BadInput(f"kernel source {spec!r}: no commit {rev!r} in {repo}")
        return Source("git", spec, f"{repo.resolve()}@{commit[:12]}", f"git:{commit}", repo.resolve(), commit)
    folder = Path(spec)
    if not folder.is_dir():
        raise BadInput(f"kernel source {spec!r}: give debian:X.Y, a kernel source folder or DIR@REV")
    if not (folder / "Makefile").is_file() or not (folder / "Kconfig").is_file():
        raise BadInput(f"kernel source {folder}: no Makefile and Kconfig: give the top of a kernel tree")
    owner = owner_of(folder, skip=VCS_FOLDERS)
    digest = hashlib.sha256()
    # the files' times stay in the stream, so in the hash: the build is
    # unpacked from this stream, and make reads them (a touched file is
    # built again, rightly: an object no older than its source is not)
    tar = subprocess.Popen(
        _as_owner(owner, [*_tar_create(folder.resolve()), "--sort=name", "--owner=0", "--group=0", "--numeric-owner"]),
        stdout=subprocess.PIPE,
        env=_owner_env(),
        cwd="/",
    )
    stream = tar.stdout
    assert stream is not None
    # read once: hashed and kept in the same pass (a kernel source tree:
    # about 1.3 GB of the cache's disk while the build runs)
    keep_in = cache or cache_dir()
    keep_in.mkdir(parents=True, exist_ok=True)
    spool = tempfile.TemporaryFile(dir=keep_in)
    try:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
            spool.write(block)
        spool.flush()
    except OSError as exc:
        spool.close()
        tar.kill()
        tar.wait()
        raise BadInput(
            f"kernel source {folder}: keeping its copy failed ({exc.strerror or exc}): free some space"
        ) from None
    if tar.wait(timeout=STEP_TIMEOUT_S) != 0:
        spool.close()
        raise BadInput(f"kernel source {folder}: its owner cannot read all of it (tar failed)")
    return Source("folder", spec, str(folder.resolve()), digest.hexdigest(), folder.resolve(), spool=spool)


def revisions(directory: str, good: str, bad: str) -> list[str]:
    """``DIR@commit`` for GOOD, then every commit on BAD's first-parent
    line after GOOD up to BAD, oldest first (read by the repository's
    owner): the series a bisect over revisions probes, each built when
    probed (``build``, cached)."""
    repo = Path(directory)
    if ":" in str(repo.resolve()):
        raise BadInput(f"--kernel-source {directory}: a folder with ':' in its path cannot name a kernel: move it")
    ids = [resolve_source(f"{directory}@{rev}").rev for rev in (good, bad)]
    owner = repo_owner(repo)
    proc = subprocess.run(
        _as_owner(
            owner, ["git", "-C", str(repo.resolve()), "rev-list", "--reverse", "--first-parent", f"{ids[0]}..{ids[1]}"]
        ),
        capture_output=True,
        text=True,
        env=_owner_env(),
        timeout=120,
        check=False,
    )
    between = proc.stdout.split()
    if proc.returncode != 0 or not between or between[-1] != ids[1]:
        raise BadInput(
            f"--good {good} is not an ancestor of --bad {bad} on its first-parent line in {directory}: "
            "give a good revision older than the bad one"
        )
    return [f"{repo.resolve()}@{commit}" for commit in [ids[0], *between]]


def source_diff_files(a_spec: str, b_spec: str) -> tuple[str, ...] | None:
    """The files that differ between two sources, when both are revisions
    of one repository (``git diff --name-only``, run by its owner); None
    otherwise (two folders or two .debs would have to be read whole)."""
    a_dir, a_at, _ = a_spec.rpartition("@")
    b_dir, b_at, _ = b_spec.rpartition("@")
    if not (a_at and b_at) or Path(a_dir).resolve() != Path(b_dir).resolve() or Path(a_spec).exists():
        return None
    a, b = resolve_source(a_spec), resolve_source(b_spec)
    proc = subprocess.run(
        _as_owner(repo_owner(a.path), ["git", "-C", str(a.path), "diff", "--no-renames", "--name-only", a.rev, b.rev]),
        capture_output=True,
        text=True,
        env=_owner_env(),
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return tuple(line for line in proc.stdout.splitlines() if line)


def is_source_revision(name: str) -> bool:
    """A kernel named ``DIR@commit`` (a bisect over revisions), not a Debian one."""
    directory, at, rev = name.partition("@")
    return bool(at) and directory.startswith("/") and re.fullmatch(r"[0-9a-f]{40,64}", rev) is not None


def _tar_create(folder: Path) -> list[str]:
    return ["tar", "-C", str(folder), "--exclude-vcs", "-c", "-f", "-", "."]


def repo_owner(repo: Path) -> unprivileged.BuildUser:
    """Who reads a repository (``owner_of``): its .git checked whole, where
    ``git archive`` reads a revision's objects from."""
    return owner_of(repo, repo / ".git")


def _source_stream(source: Source) -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    """A process writing a Debian or git source tree as a tar (the .deb's
    data for Debian) on its stdout, and how to end it."""
    if source.kind == "debian":
        # root reads its own checked .deb; the inner linux-source-X.Y.tar.xz
        # is handed on undecompressed (the build user's tar unpacks it)
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(source.path)], stdout=subprocess.PIPE)
    else:
        owner = repo_owner(source.path)
        proc = subprocess.Popen(
            _as_owner(owner, ["git", "-C", str(source.path), "archive", "--format=tar", source.rev]),
            stdout=subprocess.PIPE,
            env=_owner_env(),
            cwd="/",
        )

    def end() -> None:
        proc.kill()
        proc.wait()

    return proc, end


def unpack(source: Source, user: unprivileged.BuildUser, folder: Path) -> int:
    """The source tree into ``folder``/linux, unpacked by the build user;
    the time (ns) no output of the build will be older than."""
    home = folder / "home"
    unprivileged.run(user, ["mkdir", "linux"], folder, home)
    strip = ["--strip-components=1"] if source.kind == "debian" else []
    untar = unprivileged.popen(
        user,
        ["tar", "-x", "--no-same-owner", "--no-same-permissions", *strip, "-f", "-"],
        folder / "linux",
        home,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert untar.stdin is not None
    end: Callable[[], None] | None = None  # a folder's spool has no process to end
    try:
        if source.kind == "folder":
            if source.spool is None:
                raise BadInput(f"kernel source {source.label}: its copy is gone: build it again")
            source.spool.seek(0)  # from the start each time: a base and its patched build unpack it both
            shutil.copyfileobj(source.spool, untar.stdin, 1 << 20)
        else:
            producer, end = _source_stream(source)
            assert producer.stdout is not None
            if source.kind == "debian":
                _inner_source_tarball(producer.stdout, untar.stdin, source)
            else:
                shutil.copyfileobj(producer.stdout, untar.stdin, 1 << 20)
        untar.stdin.close()
        err = untar.stderr.read().decode(errors="replace") if untar.stderr else ""
        if untar.wait(timeout=STEP_TIMEOUT_S) != 0:
            raise BadInput(f"unpacking {source.label} failed: {err.strip().splitlines()[-1:] or ['?']}")
    finally:
        if end is not None:
            end()
        if untar.poll() is None:
            unprivileged.end_group(untar)
    # a second before now, kept by root: every output the build makes is
    # newer, and a source file changed within that second is taken as
    # output (copied)
    return (int(time.time()) - 1) * 1_000_000_000


def _inner_source_tarball(outer_stream: IO[bytes], sink: IO[bytes], source: Source) -> None:
    """Copy /usr/src/linux-source-X.Y.tar.xz out of the .deb's data to the
    build user's ``tar -x`` (which decompresses it), as a stream."""
    with tarfile.open(fileobj=outer_stream, mode="r|") as outer:
        for member in outer:
            name = "/" + member.name.lstrip("./")
            if member.isfile() and name.startswith("/usr/src/linux-source-") and name.endswith(".tar.xz"):
                inner = outer.extractfile(member)
                assert inner is not None
                xz = subprocess.Popen(["xz", "-dc"], stdin=subprocess.PIPE, stdout=sink)
                assert xz.stdin is not None
                shutil.copyfileobj(inner, xz.stdin, 1 << 20)
                xz.stdin.close()
                if xz.wait(timeout=STEP_TIMEOUT_S) != 0:
                    raise BadInput(f"{source.path.name}: its source tarball does not decompress: fetch it again")
                return
    raise BadInput(f"{source.path.name} holds no /usr/src/linux-source-*.tar.xz")


def default_source(cache: Path | None = None) -> str:
    """debian:X.Y of the default Debian kernel (the image's): its release
    6.1.0-57-amd64 gives debian:6.1."""
    package = packages.resolve_kernel_package(cache or cache_dir())
    match = re.match(r"linux-image-([0-9]+\.[0-9]+)", package)
    if match is None:
        raise BadInput(f"the default kernel {package} names no X.Y: give --kernel-source")
    return f"debian:{match.group(1)}"

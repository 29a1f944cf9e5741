"""Running a build as an unprivileged user: what ``memqual kernel build``
does with a kernel tree and a patch that root must not trust.

Everything that reads or runs the input goes through ``setpriv`` as the
build user (no groups, no capabilities, no_new_privs, a cleared
environment) in its own 0700 folder and a PID namespace of its own; a
patch's build also in a mount namespace where only its folder is writable,
with a procfs and System V IPC of its own (``confined``); results come back
as a tar stream root keeps as ``Outputs`` allows (``receive``); a user's
tree is read by its owner.  docs/patch-qualification.md."""

from __future__ import annotations

import dataclasses
import functools
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from memqual.host.core import bounded, settings, trust
from memqual.host.core.errors import BadInput, CapabilityMissing

BUILD_USER_ENV = settings.BUILD_USER
DEFAULT_BUILD_USER = "nobody"
# The build's PATH: the system's tools only, never a directory from the
# caller's PATH (a kernel build puts ccache's root-owned masquerade folder
# in front: images/kernel_env.py).
BUILD_PATH = "/usr/local/bin:/usr/bin:/bin"
RECEIVE_LIMIT = 4 << 30  # bytes root accepts back from a build (a kernel and its modules: ~100 MB)


@dataclasses.dataclass(frozen=True)
class BuildUser:
    name: str
    uid: int
    gid: int
    # (build parent, build folder) for the steps of a build whose input
    # root must not trust (a patch): the parent (every other build's folder,
    # ccache's) read-only, only the folder writable (``confined``).
    confined_to: tuple[Path, Path] | None = None


def build_user() -> BuildUser:
    """The unprivileged user builds run as; never root."""
    name = settings.build_user() or DEFAULT_BUILD_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise BadInput(f"build user {name!r} does not exist: set {BUILD_USER_ENV} to an unprivileged user") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise BadInput(f"build user {name!r} has uid or gid 0: set {BUILD_USER_ENV} to an unprivileged user")
    return BuildUser(name, entry.pw_uid, entry.pw_gid)


def require_setpriv() -> str:
    exe = shutil.which("setpriv")
    if exe is None:
        raise CapabilityMissing("setpriv not found (util-linux): run apt-get install util-linux")
    return exe


@functools.cache
def pid_namespace() -> tuple[str, ...]:
    """The prefix that runs a step in a PID namespace of its own (util-linux
    unshare, as root), or () where the kernel or a container refuses one.
    When the step's first process ends, the kernel kills every process left
    in it: nothing a build starts (a daemon a hostile Makefile leaves,
    holding a descriptor into a tree) outlives its step."""
    exe = shutil.which("unshare")
    if exe is None or os.geteuid() != 0:
        return ()
    prefix = (exe, "--pid", "--fork", "--kill-child=SIGKILL", "--")
    try:
        works = subprocess.run([*prefix, "true"], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        works = False
    return prefix if works else ()


# Run by root's /bin/sh inside the step's mount namespace, before the
# privileges are dropped: the build parent bound read-only over itself, the
# build's own folder bound writable over that.  Constant; the paths are
# its arguments, never part of it.
CONFINE_SCRIPT = (
    'set -e; "$1" --bind -o ro "$2" "$2"; "$1" --bind "$3" "$3"; "$1" -o remount,bind,rw "$3"; shift 3; exec "$@"'
)


def _confine_prefix(parent: Path, folder: Path) -> list[str]:
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if unshare is None or mount is None:
        raise CapabilityMissing("confining a build needs util-linux's unshare and mount")
    return [
        unshare,
        "--pid",
        "--fork",
        "--kill-child=SIGKILL",
        "--mount",
        # a procfs of its own: the host's would show every other process of
        # the build user, and its /proc/<pid>/root and cwd lead into the
        # host's mount tree, past the read-only bind below
        "--mount-proc",
        # and System V IPC of its own: another build user's process's
        # shared memory is out of reach too
        "--ipc",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        CONFINE_SCRIPT,
        "sh",
        mount,
        str(parent),
        str(folder),
    ]


@functools.cache
def can_confine() -> bool:
    """Whether this host gives a step a mount namespace of its own (root,
    util-linux, a kernel or container that allows it): tried once, on a
    root-owned folder of its own."""
    if os.geteuid() != 0 or not pid_namespace() or shutil.which("mount") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="memqual-confine-") as tmp:
        own = Path(tmp) / "own"
        own.mkdir()
        try:
            argv = [*_confine_prefix(Path(tmp), own), "true"]
            return subprocess.run(argv, capture_output=True, timeout=60, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired, CapabilityMissing):
            return False


def confined(user: BuildUser, parent: Path, folder: Path, uid: int) -> BuildUser:
    """``user`` as ``uid`` (its gid the same number: images/build_uids.py
    ``own_uid``), whose every step sees ``parent`` read-only but for
    ``folder``: a hostile patch's build can write into no other build's
    folder and no shared cache (ccache's), and, a uid no other process
    has, can neither signal nor trace another process nor own a file a
    later build of the build user would take for its own."""
    return dataclasses.replace(user, name=str(uid), uid=uid, gid=uid, confined_to=(parent, folder))


def as_user(uid: int, gid: int, argv: Sequence[str], confined_to: tuple[Path, Path] | None = None) -> list[str]:
    """``argv`` run as uid:gid with nothing of root's left: no groups, no
    capabilities (also none to regain: bounding set emptied), no_new_privs,
    in a PID namespace of its own where there is one (``pid_namespace``),
    and, ``confined_to`` (parent, folder), in a mount namespace where
    only ``folder`` of ``parent`` is writable."""
    if os.geteuid() != 0:
        return list(argv)  # already unprivileged: nothing to drop
    if uid == 0:
        raise BadInput("refusing to run a build step as root")
    prefix = _confine_prefix(*confined_to) if confined_to is not None else list(pid_namespace())
    return [
        *prefix,
        require_setpriv(),
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *argv,
    ]


def environment(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A cleared environment: nothing of the caller's reaches a build.
    ccache stays off unless ``extra`` names its folder (CCACHE_DIR)."""
    env = {
        "PATH": BUILD_PATH,
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    extra = extra or {}
    if "CCACHE_DIR" not in extra:
        env["CCACHE_DISABLE"] = "1"
    env.update(extra)
    return env


def build_parent(path: Path) -> Path:
    """``path`` as root's folder for build folders: made 0711 when missing
    (the build user enters it to reach its own folders, and lists none).
    One that is already there is checked (``trust.trusted_dir``: root's or
    yours, writable by nobody else, and so is every folder above it), never
    chmod'ed: it is someone's folder, maybe a shared one, and its mode is
    theirs."""
    root = os.geteuid() == 0
    made = not os.path.lexists(path)
    folder = trust.trusted_dir(path, "kernel build folder", mode=0o711 if root else 0o700)
    if root and made:
        os.chmod(folder, 0o711)  # just made by us: whatever the umask took off
    elif root and not os.stat(folder).st_mode & stat.S_IXOTH:
        raise BadInput(
            f"kernel build folder {folder}: the build user cannot enter it "
            f"(mode {stat.S_IMODE(os.stat(folder).st_mode):o}): run 'chmod o+x {folder}' or choose another folder"
        )
    return folder


def user_folder(parent: Path, user: BuildUser, name: str) -> Path | None:
    """``parent/name``, a folder the build user owns (0700) that outlives
    its build folders, made by root if missing; None when something else
    is there (then the build goes without it).  Root never reads from it."""
    folder = parent / name
    if os.geteuid() == 0:
        try:
            folder.mkdir(mode=0o700)
            os.chown(folder, user.uid, user.gid, follow_symlinks=False)
        except FileExistsError:
            pass
    else:
        folder.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != user.uid or st.st_mode & 0o077:
        return None
    return folder


def private_folder(parent: Path, user: BuildUser, prefix: str) -> Path:
    """A fresh folder in ``parent`` owned by the build user, 0700, with its
    private home (``home``, ``home/tmp``) made by the build user itself."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    if os.geteuid() == 0:
        os.chown(folder, user.uid, user.gid)
    os.chmod(folder, 0o700)
    run(user, ["mkdir", "-p", "home/tmp"], folder, folder / "home")
    return folder


def fresh_folder(parent: Path, user: BuildUser, name: str) -> Path:
    """``parent/name`` made afresh for the build user as ``private_folder``
    makes one (what a killed build left there removed first): for a build
    that must run at the same path each time.  ``parent`` is root's 0711
    folder, so nobody else can make ``name`` in it meanwhile."""
    folder = parent / name
    remove_folder(user, folder)
    folder.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(folder, user.uid, user.gid, follow_symlinks=False)
    os.chmod(folder, 0o700)
    run(user, ["mkdir", "-p", "home/tmp"], folder, folder / "home")
    return folder


def remove_folder(user: BuildUser, folder: Path) -> None:
    """A build folder removed: its files by the build user (whatever it
    made), then the folder by root.  shutil.rmtree never follows a link
    (fd-based where the platform has it), so a link planted in the folder
    cannot turn root's removal elsewhere."""
    if not os.path.lexists(folder):
        return
    subprocess.run(
        as_user(user.uid, user.gid, ["rm", "-rf", "--one-file-system", str(folder)], user.confined_to),
        env=environment(folder / "home"),
        capture_output=True,
        timeout=900,
        cwd="/",
    )
    shutil.rmtree(folder, ignore_errors=True)


def run(
    user: BuildUser,
    argv: Sequence[str],
    cwd: Path,
    home: Path,
    *,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``argv`` as the build user in ``cwd`` (its own session: a deadline
    ends the whole process group).  Its output is read within bounds
    (host/core/bounded.py): the last bounded.TAIL_MAX bytes of each stream
    are kept, whatever it prints in the time it has."""
    proc = subprocess.Popen(
        as_user(user.uid, user.gid, argv, user.confined_to),
        cwd=cwd,
        env=environment(home, env),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        done = bounded.collect(proc, time.monotonic() + timeout, input=stdin)
    except bounded.Overdue:
        raise BadInput(f"{' '.join(argv[:2])} did not finish in {timeout:g} s") from None
    finally:
        if proc.poll() is None:
            end_group(proc)
    return subprocess.CompletedProcess(list(argv), done.returncode, done.stdout, done.stderr)


def end_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def popen(
    user: BuildUser,
    argv: Sequence[str],
    cwd: Path,
    home: Path,
    *,
    env: dict[str, str] | None = None,
    stdin: int | IO[bytes] | None = subprocess.DEVNULL,
    stdout: int | IO[bytes] | None = subprocess.PIPE,
    stderr: int | IO[bytes] | None = subprocess.STDOUT,
) -> subprocess.Popen[bytes]:
    """A long step (make, tar) as the build user, streaming."""
    return subprocess.Popen(
        as_user(user.uid, user.gid, argv, user.confined_to),
        cwd=cwd,
        env=environment(home, env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )


def plain_name(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\0" not in name and all(p not in ("", ".", "..") for p in parts)


@dataclasses.dataclass(frozen=True)
class Outputs:
    """What root takes back from a build (``receive``): the regular files
    and the folders whose names a pattern of theirs matches whole, at most
    ``max_entries`` entries of the stream (what is left out counts too: a
    stream of links is no cheaper to read) and ``max_bytes`` bytes."""

    files: tuple[re.Pattern[str], ...]
    folders: tuple[re.Pattern[str], ...]
    max_entries: int
    max_bytes: int = RECEIVE_LIMIT

    def allows(self, name: str, *, folder: bool) -> bool:
        return any(pattern.fullmatch(name) for pattern in (self.folders if folder else self.files))


def receive(stream: IO[bytes], dest: Path, outputs: Outputs) -> list[str]:
    """Unpack a tar stream the build user wrote into root's ``dest``:
    regular files (mode 0644, 0755 if executable) and directories only,
    each by a plain relative name (no '/', '..', '.') that ``outputs``
    allows; links, devices and anything else are left out and returned by
    name.  Files are opened O_EXCL|O_NOFOLLOW, so nothing in the stream can
    write outside ``dest`` or through a link; a name ``outputs`` does not
    allow, or more entries or bytes than it allows, is refused."""
    skipped: list[str] = []
    total = entries = 0
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            name = member.name.removeprefix("./").rstrip("/")
            if name in ("", "."):
                continue
            entries += 1
            if entries > outputs.max_entries:
                raise BadInput(f"a build gave back more than {outputs.max_entries} files and folders: refused")
            if not plain_name(name):
                raise BadInput(f"a build gave back {member.name!r}, not a plain relative name: refused")
            if not member.isdir() and not member.isreg():
                skipped.append(name)
                continue
            if not outputs.allows(name, folder=member.isdir()):
                kind = "a folder" if member.isdir() else "a file"
                raise BadInput(f"a build gave back {kind} {name!r}, which a build does not make: refused")
            target = dest / name
            # folders the stream implies count as entries: each name could
            # otherwise make a path's depth of them
            entries += _make_parents(dest, name)
            if entries > outputs.max_entries:
                raise BadInput(f"a build gave back more than {outputs.max_entries} files and folders: refused")
            total += member.size
            if total > outputs.max_bytes:
                raise BadInput(f"a build gave back more than {outputs.max_bytes >> 20} MiB: refused")
            try:
                if member.isdir():
                    target.mkdir(mode=0o755, exist_ok=True)
                    continue
                mode = 0o755 if member.mode & 0o111 else 0o644
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            except FileExistsError:
                raise BadInput(f"a build gave back {name!r} twice: refused") from None
            source = archive.extractfile(member)
            assert source is not None
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
    return skipped


def _make_parents(dest: Path, name: str) -> int:
    """The folders above ``name`` below ``dest`` made where missing; how
    many were made.  Something there that is not a folder is refused."""
    here, made = dest, 0
    for part in name.split("/")[:-1]:
        here = here / part
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                raise BadInput(f"a build gave back {name!r} below something that is not a directory: refused")
        except FileNotFoundError:
            here.mkdir(mode=0o755)
            made += 1
    return made


def walk_files(root: Path) -> Iterator[Path]:
    for base, _dirs, files in os.walk(root):
        for name in files:
            yield Path(base) / name

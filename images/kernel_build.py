"""A guest kernel built from source: ``memqual kernel build``.

The source (``resolve_source``: ``debian:X.Y``, a folder, ``DIR@REV``),
the config (defconfig, kvm_guest, memqual's and the user's fragments,
after the patches), the build run as the build user (images/unprivileged.py)
and the result's cache entry ``<cache>/kernels/<release>-<key>/``, whole
or absent.  A patched build starts from a copy of the unpatched base tree
(sealed as root's: images/tree_copy.py) at the base's own path, so make
compiles only what the patch changed.  docs/patch-qualification.md, "images/kernel_build.py",
has the details."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from memqual.host.core import settings
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import cache_dir, weak_spot
from memqual.images import packages, tree_copy, unprivileged
from memqual.images.built_kernels import BuiltKernel, PatchRecord, cached, kernels_dir
from memqual.images.kernel import check_release, read_release

T = TypeVar("T")
GUEST_CONFIG = Path(__file__).resolve().with_name("guest.config")
RECIPE_VERSION = "2"  # bump when the build steps change what comes out
BUILD_PARENT = Path("/var/tmp/memqual-kbuild")
BUILD_PARENT_ENV = settings.KBUILD_DIR
# Debian packages the build needs beyond ./setup's gcc and make.
TOOLCHAIN = ("bc", "flex", "bison", "libelf-dev", "libssl-dev", "ccache")
DEBIAN_SOURCE = re.compile(r"debian:([0-9]+\.[0-9]+)")
GIT_REV = re.compile(r"[0-9A-Za-z._/~^-]{1,200}")
PATCH_LIMIT = 64 << 20
COMPILE_TIMEOUT_S = 4 * 3600.0
STEP_TIMEOUT_S = 1800.0
# kbuild's short lines: what make is doing, one a file.
KBUILD_STEP = re.compile(r"^\s{2}([A-Z0-9_]+(?: \[M\])?)\s+(\S+)")
FIRST_BUILD_STEPS = 3600  # kbuild lines of a first x86_64_defconfig+guest build, when none was timed here
STAMP_ENV = {
    "KBUILD_BUILD_USER": "memqual",
    "KBUILD_BUILD_HOST": "memqual",
    "KBUILD_BUILD_VERSION": "1",
    "KBUILD_BUILD_TIMESTAMP": "1970-01-01",
}
# ccache's masquerade folder (gcc -> ccache links, root's) goes first in
# the build's PATH when ccache is installed: the compiler's command lines
# stay the same with and without it, so a tree built with ccache is
# incremental for a build without it and the other way round.
CCACHE_LINKS = Path("/usr/lib/ccache")
CCACHE_SIZE = "4G"
# A kept base tree's record, root's, beside its sealed tree: the digest
# of its entries and when its source was unpacked (what is no newer is
# source, linked into a patched build's copy; the rest output, copied).
BASE_RECORD = "base.json"
# What a patch may touch that changes the config the fragments give:
# Kconfig files, what they run (scripts/) and the defconfigs.
CONFIG_INPUTS = re.compile(r"(^|/)Kconfig[^/]*$|^scripts/|/configs/")


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # "debian", "folder" or "git"
    spec: str  # as given
    label: str  # what a record says: linux-source-6.1 6.1.192-3, /src/linux, /src/linux@abc123
    sha256: str  # the content's id: the .deb's sha256, the tree's tar stream's, git:<commit>
    path: Path  # the .deb, the folder, the repository
    rev: str = ""  # the commit, for git


@dataclasses.dataclass(frozen=True)
class Patch:
    path: Path
    data: bytes = dataclasses.field(repr=False)
    sha256: str
    subject: str
    files: tuple[str, ...]

    def record(self) -> PatchRecord:
        return PatchRecord(str(self.path), self.sha256, self.subject, self.files)


# ------------------------------------------------------------ inputs


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_patch(path: str | os.PathLike[str]) -> Patch:
    """A patch file, with its subject line, the files it touches and its hash."""
    file = Path(path)
    if not file.is_file():
        raise BadInput(f"--patch {file}: no such file: give a patch (git format-patch or diff -u output)")
    data = file.read_bytes()
    if len(data) > PATCH_LIMIT:
        raise BadInput(f"--patch {file}: larger than {PATCH_LIMIT >> 20} MiB: give one patch")
    text = data.decode(errors="replace")
    files = patch_files(text)
    if not files:
        raise BadInput(
            f"--patch {file}: no unified diff in it (no ---/+++ lines): give git format-patch or diff -u output"
        )
    return Patch(file.resolve(), data, _sha256(data), patch_subject(text, file.name), files)


def patch_subject(text: str, fallback: str) -> str:
    """The Subject of a ``git format-patch`` mail (continuation lines
    joined), else the first non-diff line, else the file's name."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Subject:"):
            subject = line.removeprefix("Subject:").strip()
            for more in lines[index + 1 :]:
                if not more.startswith((" ", "\t")):
                    break
                subject += " " + more.strip()
            return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
        if line.startswith(("diff ", "--- ", "Index: ")):
            break
    first = next((line.strip() for line in lines if line.strip()), "")
    return first if first and not first.startswith(("diff ", "--- ")) else fallback


def patch_files(text: str) -> tuple[str, ...]:
    """The files a unified diff touches (its b/ side; a deleted file by its a/ side)."""
    files: list[str] = []
    old = ""
    for line in text.splitlines():
        if line.startswith("--- "):
            old = line[4:].split("\t")[0].strip()
        elif line.startswith("+++ "):
            new = line[4:].split("\t")[0].strip()
            name = old if new == "/dev/null" else new
            name = name.split("/", 1)[1] if "/" in name else name
            if name not in files:
                files.append(name)
    return tuple(files)


def read_fragment(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    file = Path(path)
    if not file.is_file():
        raise BadInput(f"--config {file}: no such file: give a Kconfig fragment (CONFIG_X=y lines)")
    data = file.read_bytes()
    for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and not re.fullmatch(r"CONFIG_[A-Za-z0-9_]+=.*", stripped):
            raise BadInput(f"--config {file}:{number}: {stripped[:60]!r} is not CONFIG_NAME=value or a comment")
    return str(file.resolve()), data


def fragment_wants(text: str) -> dict[str, str]:
    """CONFIG_X -> value a fragment asks for ('n' for "# CONFIG_X is not set")."""
    wants: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        unset = re.fullmatch(r"# (CONFIG_[A-Za-z0-9_]+) is not set", line)
        if unset:
            wants[unset.group(1)] = "n"
        elif line.startswith("CONFIG_") and "=" in line:
            name, value = line.split("=", 1)
            wants[name] = value
    return wants


def config_values(text: str) -> dict[str, str]:
    """A .config's CONFIG_X -> value; unset symbols are absent."""
    return {k: v for k, v in fragment_wants(text).items() if v != "n"}


def unmet(wants: dict[str, str], final: dict[str, str]) -> list[str]:
    """What a fragment asked for that olddefconfig did not keep."""
    missing = []
    for name, value in sorted(wants.items()):
        got = final.get(name, "n")
        if got != value:
            missing.append(f"{name}={value} (got {got})")
    return missing


def config_diff(a: str, b: str) -> list[str]:
    """The symbols whose values differ between two .configs, one line each."""
    va, vb = config_values(a), config_values(b)
    return [f"{n}: {va.get(n, 'n')} -> {vb.get(n, 'n')}" for n in sorted(set(va) | set(vb)) if va.get(n) != vb.get(n)]


def missing_toolchain() -> list[str]:
    """Toolchain packages not installed (dpkg's view)."""
    missing = []
    for package in TOOLCHAIN:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
        )
        if "install ok installed" not in proc.stdout:
            missing.append(package)
    return missing


def check_toolchain() -> None:
    missing = missing_toolchain()
    if not shutil.which("gcc") or not shutil.which("make"):
        missing = ["gcc", "make", *missing]
    if missing:
        raise CapabilityMissing(f"building a kernel needs {' '.join(missing)}: run apt-get install {' '.join(missing)}")


def compiler_version() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise CapabilityMissing("gcc not found: run ./setup (installs gcc)")
    return subprocess.run([gcc, "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[0]


# ------------------------------------------------------------ sources


def owner_of(path: Path) -> unprivileged.BuildUser:
    """Who reads a user's tree: its owner, which must be root or the user
    memqual runs for (a tree another user can change is refused)."""
    from memqual.images.balloon_driver import tree_owners

    st = path.stat()
    problem = weak_spot(path, tree_owners())
    if problem is not None:
        raise BadInput(f"kernel source {path}: {problem}: build from a tree of your own")
    return unprivileged.BuildUser(str(st.st_uid), st.st_uid, st.st_gid)


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
        owner = owner_of(repo)
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
    owner = owner_of(folder)
    digest = hashlib.sha256()
    tar = subprocess.Popen(
        _as_owner(
            owner,
            [*_tar_create(folder.resolve()), "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner"],
        ),
        stdout=subprocess.PIPE,
        env=_owner_env(),
        cwd="/",
    )
    stream = tar.stdout
    assert stream is not None
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    if tar.wait(timeout=STEP_TIMEOUT_S) != 0:
        raise BadInput(f"kernel source {folder}: its owner cannot read all of it (tar failed)")
    return Source("folder", spec, str(folder.resolve()), digest.hexdigest(), folder.resolve())


def revisions(directory: str, good: str, bad: str) -> list[str]:
    """``DIR@commit`` for GOOD, then every commit on BAD's first-parent
    line after GOOD up to BAD, oldest first (read by the repository's
    owner): the series a bisect over revisions probes, each built when
    probed (``build``, cached)."""
    repo = Path(directory)
    if ":" in str(repo.resolve()):
        raise BadInput(f"--kernel-source {directory}: a folder with ':' in its path cannot name a kernel: move it")
    ids = [resolve_source(f"{directory}@{rev}").rev for rev in (good, bad)]
    owner = owner_of(repo)
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
        _as_owner(owner_of(a.path), ["git", "-C", str(a.path), "diff", "--no-renames", "--name-only", a.rev, b.rev]),
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


def _source_stream(source: Source) -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    """A process writing the source tree as a tar (xz for Debian) on its
    stdout, and how to end it."""
    if source.kind == "debian":
        # root reads its own checked .deb; the inner linux-source-X.Y.tar.xz
        # is handed on undecompressed (the build user's tar unpacks it)
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(source.path)], stdout=subprocess.PIPE)
    elif source.kind == "git":
        owner = owner_of(source.path)
        proc = subprocess.Popen(
            _as_owner(owner, ["git", "-C", str(source.path), "archive", "--format=tar", source.rev]),
            stdout=subprocess.PIPE,
            env=_owner_env(),
            cwd="/",
        )
    else:
        owner = owner_of(source.path)
        proc = subprocess.Popen(
            _as_owner(owner, _tar_create(source.path)), stdout=subprocess.PIPE, env=_owner_env(), cwd="/"
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
    producer, end = _source_stream(source)
    assert untar.stdin is not None and producer.stdout is not None
    try:
        if source.kind == "debian":
            _inner_source_tarball(producer.stdout, untar.stdin, source)
        else:
            shutil.copyfileobj(producer.stdout, untar.stdin, 1 << 20)
        untar.stdin.close()
        err = untar.stderr.read().decode(errors="replace") if untar.stderr else ""
        if untar.wait(timeout=STEP_TIMEOUT_S) != 0:
            raise BadInput(f"unpacking {source.label} failed: {err.strip().splitlines()[-1:] or ['?']}")
    finally:
        end()
        if untar.poll() is None:
            unprivileged.end_group(untar)
    # a second before now, kept by root: every output the build makes is
    # newer, and a source file changed within that second is taken as
    # output (copied)
    return (int(time.time()) - 1) * 1_000_000_000


@dataclasses.dataclass(frozen=True)
class BaseRecord:
    digest: str  # tree_copy.digest of the sealed tree
    sources_end_ns: int  # what unpack returned


def keep_base(folder: Path, base: Path, sources_end_ns: int) -> None:
    """The unpatched build's tree (``folder``/linux, the build user's) made
    the base of later patched builds of its key: moved into a root-owned
    0700 folder, sealed (images/tree_copy.py), its record written, then put
    in place of ``base``.  Nothing of the build user's is left in it."""
    sealing = Path(tempfile.mkdtemp(prefix=".base-", dir=base.parent))
    try:
        os.rename(folder / "linux", sealing / "linux")
        tree_copy.seal(sealing / "linux")
        record = BaseRecord(tree_copy.digest(sealing / "linux"), sources_end_ns)
        (sealing / BASE_RECORD).write_text(json.dumps(dataclasses.asdict(record)) + "\n")
        remove_base(base)
        os.rename(sealing, base)
    except (OSError, tree_copy.TreeRefused):
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
    return tree_copy.verify(base / "linux", known.digest)


def copy_base(user: unprivileged.BuildUser, base: Path, folder: Path) -> str:
    """The sealed base tree as ``folder``/linux, made by root
    (images/tree_copy.py) in a root-owned 0700 staging folder and renamed
    into place once whole; what it linked and copied."""
    known = BaseRecord(**json.loads((base / BASE_RECORD).read_text()))
    staging = Path(tempfile.mkdtemp(prefix=".copy-", dir=base.parent))
    try:
        copied = tree_copy.copy_tree(base / "linux", staging / "linux", known.sources_end_ns, user.uid, user.gid)
        os.rename(staging / "linux", folder / "linux")
    except OSError as exc:
        raise BadInput(f"copying the base tree failed: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(copied)


def config_touched(patches: Sequence[Patch]) -> list[str]:
    """The files of ``patches`` that can change what the config step
    gives (CONFIG_INPUTS); none, and a patched build keeps its base's
    .config instead of assembling it again."""
    return [f for p in patches for f in p.files if CONFIG_INPUTS.search(f)]


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


# ------------------------------------------------------------ steps


def apply_patch(user: unprivileged.BuildUser, folder: Path, patch: Patch) -> None:
    """``patch -p1`` as the build user; a patch that does not apply is one
    line naming the file and the hunk."""
    proc = unprivileged.run(
        user,
        # --read-only=ignore: a copy of a base tree has its sources read-only
        # (linked); patch writes a new file and renames it, the base's stays
        ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "--reject-file=-", "--read-only=ignore"],
        folder / "linux",
        folder / "home",
        stdin=patch.data,
        timeout=STEP_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise BadInput(f"--patch {patch.path.name} does not apply: {patch_failure(proc.stdout + proc.stderr)}")


def patch_failure(output: str) -> str:
    """The first failure in GNU patch's output: the file and the hunk."""
    current = "?"
    for line in output.splitlines():
        file = re.match(r"(?:patching|checking) file (.+)", line)
        if file:
            current = file.group(1).strip("'\"")
            continue
        hunk = re.match(r"Hunk #(\d+) FAILED at (\d+)", line)
        if hunk:
            return f"{current} hunk #{hunk.group(1)} (at line {hunk.group(2)}) fails"
        if "can't find file to patch" in line or "No file to patch" in line:
            return f"{current}: the file to patch is not in the tree"
        if "Reversed (or previously applied) patch detected" in line:
            return f"{current}: already applied (reversed patch detected)"
        if "Only garbage was found" in line or "malformed patch" in line:
            return f"not a patch ({line.strip()})"
        if "Invalid file name" in line or "is not a directory" in line or "symbolic link" in line:
            return f"{current}: {line.strip()}"
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "patch failed"


def _make(jobs: int | None = None) -> list[str]:
    argv = ["make", "-s" if jobs is None else f"-j{jobs}"]
    return argv


def assemble_config(
    user: unprivileged.BuildUser, folder: Path, fragments: Sequence[tuple[str, bytes]]
) -> tuple[str, list[str]]:
    """defconfig + kvm_guest.config + the fragments, then olddefconfig; the
    final .config's text and what it did not keep of the fragments."""
    tree, home = folder / "linux", folder / "home"
    wants: dict[str, str] = {}
    for index, (_, data) in enumerate(fragments):
        wants.update(fragment_wants(data.decode(errors="replace")))
        _run_ok(user, ["tee", f"../home/fragment-{index}.config"], tree, home, "writing a config fragment", data)
    names = [f"../home/fragment-{index}.config" for index in range(len(fragments))]
    _run_ok(user, ["make", "-s", "x86_64_defconfig"], tree, home, "make x86_64_defconfig")
    _run_ok(user, ["make", "-s", "kvm_guest.config"], tree, home, "make kvm_guest.config")
    _run_ok(
        user,
        ["sh", "scripts/kconfig/merge_config.sh", "-m", "-O", ".", ".config", *names],
        tree,
        home,
        "merging the config fragments",
    )
    _run_ok(user, ["make", "-s", "olddefconfig"], tree, home, "make olddefconfig")
    final = _run_ok(user, ["cat", ".config"], tree, home, "reading .config").stdout
    return final, unmet(wants, config_values(final))


def kept_config(
    user: unprivileged.BuildUser, folder: Path, fragments: Sequence[tuple[str, bytes]]
) -> tuple[str, list[str]]:
    """The .config a copied base tree already has (assembled from the same
    fragments: they are part of the base's key), and what it did not keep
    of them."""
    wants: dict[str, str] = {}
    for _, data in fragments:
        wants.update(fragment_wants(data.decode(errors="replace")))
    final = _run_ok(user, ["cat", ".config"], folder / "linux", folder / "home", "reading .config").stdout
    return final, unmet(wants, config_values(final))


def ccache_folder(user: unprivileged.BuildUser) -> Path | None:
    """The build user's compiler cache, beside the build folders (so it
    outlives them), or None when ccache is not installed or the folder is
    not the build user's alone.  Only the build user's compilers read it:
    root never does, and what comes back from a build is checked as any
    build's output is (unprivileged.receive, check_artefacts)."""
    try:
        st = os.lstat(CCACHE_LINKS / "gcc")
        links = os.stat(CCACHE_LINKS)
    except OSError:
        return None
    if links.st_uid != 0 or links.st_mode & 0o022 or st.st_uid != 0:
        return None
    return unprivileged.user_folder(_build_parent(), user, f"ccache-{user.uid}")


def build_env(user: unprivileged.BuildUser) -> dict[str, str]:
    """The environment of every step of a build: kbuild's fixed stamps
    (a build is the same whoever runs it, whenever), and ccache's folder
    when there is one.  CCACHE_BASEDIR makes paths below the build parent
    relative, so build folders of different names share hits; depend
    mode (kbuild passes -Wp,-MMD) spares a miss the preprocessor run
    ccache would otherwise add to each compile."""
    env = dict(STAMP_ENV)
    cache = ccache_folder(user)
    if cache is not None:
        env |= {
            "PATH": f"{CCACHE_LINKS}:{unprivileged.BUILD_PATH}",
            "CCACHE_DIR": str(cache),
            "CCACHE_BASEDIR": str(cache.parent),
            "CCACHE_NOHASHDIR": "1",
            "CCACHE_DEPEND": "1",
            "CCACHE_SLOPPINESS": "time_macros,locale",
            "CCACHE_MAXSIZE": CCACHE_SIZE,
            "CCACHE_TEMPDIR": str(cache / "tmp"),
        }
        if user.confined_to is not None:
            # a confined build (a patch's) reads the cache and adds nothing
            # to it: its folder is read-only to it
            env |= {"CCACHE_READONLY": "1", "CCACHE_TEMPDIR": str(user.confined_to[1] / "home" / "tmp")}
    return env


CCACHE_HITS = ("direct_cache_hit", "preprocessed_cache_hit")


def ccache_counts(user: unprivileged.BuildUser, folder: Path) -> dict[str, int]:
    """ccache's lifetime counters of the build user's cache (hits, misses),
    read by the build user; empty without ccache.  A step's lookups are the
    difference of two readings (another build at the same time would add
    its own: builds of one source are serialized, of two are not)."""
    env = build_env(user)
    if "CCACHE_DIR" not in env or "CCACHE_READONLY" in env:  # read-only: ccache counts nothing
        return {}
    proc = unprivileged.run(user, ["ccache", "--print-stats"], folder, folder / "home", env=env, timeout=120)
    counters: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        name, _, value = line.partition("\t")
        if value.strip().isdigit():
            counters[name.strip()] = int(value)
    if proc.returncode != 0 or "cache_miss" not in counters:
        return {}
    return {"hits": sum(counters.get(n, 0) for n in CCACHE_HITS), "misses": counters["cache_miss"]}


def _run_ok(
    user: unprivileged.BuildUser, argv: list[str], cwd: Path, home: Path, what: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    proc = unprivileged.run(user, argv, cwd, home, stdin=stdin, env=build_env(user), timeout=STEP_TIMEOUT_S)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()][-3:]
        raise BadInput(f"{what} failed: {' | '.join(lines) or 'no output'}")
    return proc


@dataclasses.dataclass
class Progress:
    """What ``make`` is doing, as one line every ``every_s``: steps done,
    the last file, and the time left estimated from the expected steps."""

    expected: int
    every_s: float = 15.0
    say: Callable[[str], None] = print
    done: int = 0
    last: str = ""
    started: float = dataclasses.field(default_factory=time.monotonic)
    shown: float = 0.0
    # when the first link step came (vmlinux.o, or modpost where no built-in
    # object changed; not a composite module's "LD [M] x.o", which kbuild
    # links while it still compiles): the compile's time before it, the
    # linking's after
    link_at: float | None = None

    def line(self, text: str) -> None:
        step = KBUILD_STEP.match(text)
        if step is None:
            return
        self.done += 1
        self.last = f"{step.group(1)} {step.group(2)}"
        if self.link_at is None and (
            step.group(1) == "MODPOST" or (step.group(1) == "LD" and step.group(2) == "vmlinux.o")
        ):
            self.link_at = time.monotonic()
        now = time.monotonic()
        if now - self.shown >= self.every_s:
            self.shown = now
            self.say(self.status(now))

    def status(self, now: float) -> str:
        elapsed = now - self.started
        share = min(self.done / self.expected, 0.99) if self.expected else 0.0
        left = elapsed * (1 - share) / share if share > 0 else 0.0
        return (
            f"  building: {self.done} of ~{self.expected} steps ({share:.0%}), {elapsed / 60:.1f} min so far, "
            f"~{left / 60:.1f} min left; now {self.last}"
        )


def compile_kernel(user: unprivileged.BuildUser, folder: Path, jobs: int, progress: Progress) -> None:
    """make bzImage modules; a failure is the compiler's last lines (on
    stderr) and one line naming the file."""
    tree, home = folder / "linux", folder / "home"
    proc = unprivileged.popen(user, ["make", f"-j{jobs}", "bzImage", "modules"], tree, home, env=build_env(user))
    tail: collections.deque[str] = collections.deque(maxlen=40)
    errors: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + COMPILE_TIMEOUT_S
    try:
        for raw in proc.stdout:
            text = raw.decode(errors="replace").rstrip()
            tail.append(text)
            progress.line(text)
            if re.search(r"\berror\b", text) and len(errors) < 5:
                errors.append(text)
            if time.monotonic() > deadline:
                raise BadInput(f"the kernel build did not finish in {COMPILE_TIMEOUT_S / 3600:.0f} h")
        status = proc.wait()
    finally:
        if proc.poll() is None:
            unprivileged.end_group(proc)
    if status != 0:
        import sys

        print("\n".join(tail), file=sys.stderr)
        where = next((m.group(1) for e in errors if (m := re.match(r"([^\s:]+):\d+(?::\d+)?: .*error", e))), "")
        first = errors[0].strip() if errors else (tail[-1] if tail else "make failed")
        raise BadInput(f"the kernel build failed{' in ' + where if where else ''}: {first[:200]}")


def build_variant(user: unprivileged.BuildUser, folder: Path) -> str | None:
    """The balloon driver variant (guest/virtio_balloon-mq.patch on this
    tree's own virtio_balloon.c) built against the tree as the build user
    into out/; None when built, else why not (the kernel is usable without
    it: the balloon-driver scenario then skips with this reason)."""
    from memqual.images.balloon_driver import MODULE, PATCH, SOURCE_MEMBER

    tree, home = folder / "linux", folder / "home"
    _run_ok(user, ["mkdir", "-p", "../variant", "../out"], tree, home, "making the variant's folder")
    # a copy patched in place: GNU patch's -o into another folder fails with
    # EXDEV on some filesystems (overlayfs here)
    copied = unprivileged.run(user, ["cp", SOURCE_MEMBER, f"../variant/{MODULE}.c"], tree, home)
    if copied.returncode != 0:
        return f"{PATCH.name} does not apply: this tree has no {SOURCE_MEMBER}"
    proc = unprivileged.run(
        user,
        ["patch", "--batch", "-s", "--no-backup-if-mismatch", "--read-only=ignore", f"../variant/{MODULE}.c"],
        tree,
        home,
        stdin=PATCH.read_bytes(),
        timeout=STEP_TIMEOUT_S,
    )
    if proc.returncode != 0:
        return f"{PATCH.name} does not apply to this tree's {SOURCE_MEMBER}: {patch_failure(proc.stdout + proc.stderr)}"
    _run_ok(
        user,
        ["tee", "../variant/Kbuild"],
        tree,
        home,
        "writing the variant's Kbuild",
        f"obj-m := {MODULE}.o\n".encode(),
    )
    proc = unprivileged.run(
        user, ["make", "-s", "M=../variant", "modules"], tree, home, env=build_env(user), timeout=STEP_TIMEOUT_S
    )
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if "error" in line.lower()][:2]
        return f"building {MODULE}.ko against this tree failed: {' | '.join(lines) or 'make failed'}"
    _run_ok(user, ["cp", f"../variant/{MODULE}.ko", f"../out/{MODULE}.ko"], tree, home, "copying the variant")
    return None


def install_and_send(user: unprivileged.BuildUser, folder: Path, staging: Path) -> list[str]:
    """modules_install into the build folder's out/, the kernel and .config
    beside it, then out/ sent to root's ``staging`` as a tar stream."""
    tree, home = folder / "linux", folder / "home"
    _run_ok(user, ["mkdir", "-p", "../out"], tree, home, "making out/")
    _run_ok(
        user,
        ["make", "-s", "modules_install", "INSTALL_MOD_PATH=../out", "INSTALL_MOD_STRIP=1", "DEPMOD=/bin/true"],
        tree,
        home,
        "make modules_install",
    )
    _run_ok(user, ["cp", "arch/x86/boot/bzImage", "../out/bzImage"], tree, home, "copying bzImage")
    _run_ok(user, ["cp", ".config", "../out/config"], tree, home, "copying .config")
    sender = unprivileged.popen(
        user, ["tar", "-c", "-f", "-", "-C", "../out", "."], tree, home, stderr=subprocess.DEVNULL
    )
    assert sender.stdout is not None
    try:
        skipped = unprivileged.receive(sender.stdout, staging)
    finally:
        sender.stdout.close()
        if sender.wait(timeout=STEP_TIMEOUT_S) != 0:
            raise BadInput("sending the built kernel back failed")
    return skipped


def check_artefacts(staging: Path, release: str) -> None:
    """What root keeps: a bzImage of exactly ``release`` and its modules."""
    if not (staging / "bzImage").is_file():
        raise BadInput("the build left no bzImage")
    built = read_release(staging / "bzImage")
    if built != release:
        raise BadInput(f"the bzImage says release {built}, kbuild said {release}: refused")
    modules = staging / "lib" / "modules" / release
    if not (modules / "modules.order").is_file():
        raise BadInput(f"the build left no modules tree lib/modules/{release}")


# ------------------------------------------------------------ the build


def cache_key(source: Source, patches: Sequence[Patch], fragments: Sequence[tuple[str, bytes]], compiler: str) -> str:
    from memqual.images.balloon_driver import PATCH as VARIANT_PATCH

    parts = [
        RECIPE_VERSION,
        _sha256(VARIANT_PATCH.read_bytes()),  # the balloon driver variant built beside the kernel
        source.sha256,
        *(p.sha256 for p in patches),
        "|",
        *(_sha256(data) for _, data in fragments),
        compiler,
    ]
    return _sha256("\n".join(parts).encode())[:16]


def _children_cpu_s() -> float:
    """User + system CPU seconds of every child process waited for so far
    (make's compilers included: each parent waits for its own)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _build_parent() -> Path:
    return unprivileged.build_parent(settings.kbuild_dir() or BUILD_PARENT)


def _expected_steps(cache: Path, incremental: bool) -> int:
    record = kernels_dir(cache) / ".steps.json"
    try:
        known = json.loads(record.read_text())
        return int(known["incremental" if incremental else "full"])
    except (OSError, ValueError, KeyError, TypeError):
        return 60 if incremental else FIRST_BUILD_STEPS


def _remember_steps(cache: Path, incremental: bool, steps: int) -> None:
    from memqual.host.core.paths import write_private_atomic

    record = kernels_dir(cache) / ".steps.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    known["incremental" if incremental else "full"] = max(steps, 1)
    write_private_atomic(record, json.dumps(known).encode(), 0o644)


def build(
    source_spec: str,
    patch_paths: Sequence[str | os.PathLike[str]] = (),
    config_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    jobs: int | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> BuiltKernel:
    """The kernel of ``source_spec`` with ``patch_paths`` applied in order
    and the config fragments on top of memqual's, built once and cached."""
    started = time.monotonic()
    cache = cache_dir()
    patches = [read_patch(p) for p in patch_paths]
    fragments = [(str(GUEST_CONFIG), GUEST_CONFIG.read_bytes()), *(read_fragment(p) for p in config_paths)]
    source = resolve_source(source_spec, cache)
    compiler = compiler_version()
    key = cache_key(source, patches, fragments, compiler)
    hit = cached(key, cache)
    if hit is not None and not force:
        return hit
    check_toolchain()
    # One build of a key at a time (and of a base tree: A's and B's share
    # it); the second finds the first's kernel in the cache.
    lock = kernels_dir(cache) / f".lock-{cache_key(source, [], fragments, compiler)}"
    with file_lock(lock, exclusive=True, deadline_s=COMPILE_TIMEOUT_S, held="another build of this source runs"):
        hit = cached(key, cache)
        if hit is not None and not force:
            return hit
        base_key = cache_key(source, [], fragments, compiler)
        base = _build_parent() / f"base-{base_key}"
        problem = base_problem(base) if patches and cached(base_key, cache) is not None else None
        if problem is not None:
            # the unpatched kernel is cached but its sealed tree is not there
            # (gone, refused, or of an older memqual): built again and kept,
            # not installed (the cached kernel stays), so that this build
            # and the next patches' are incremental.  Without the unpatched
            # kernel, a patched build is a full one and keeps nothing: a
            # patch that does not apply is then found at once.
            say(f"  the base tree is {problem}: building the unpatched source first, kept as the base")
            remove_base(base)
            _build(source, [], fragments, compiler, base_key, cache, jobs, say, time.monotonic(), install=False)
        return _build(source, patches, fragments, compiler, key, cache, jobs, say, started)


def _build(
    source: Source,
    patches: Sequence[Patch],
    fragments: Sequence[tuple[str, bytes]],
    compiler: str,
    key: str,
    cache: Path,
    jobs: int | None,
    say: Callable[[str], None],
    started: float,
    install: bool = True,
) -> BuiltKernel:
    user = unprivileged.build_user()
    jobs = jobs or os.cpu_count() or 1
    parent = _build_parent()
    base_key = cache_key(source, [], fragments, compiler)
    base = parent / f"base-{base_key}"
    steps: dict[str, float] = {}

    cpu: dict[str, float] = {}

    def timed(name: str, step: Callable[[], T]) -> T:
        """Run a step; its wall time and the CPU time of the processes it
        ran (what a shared machine's load does not change)."""
        begun, begun_cpu = time.monotonic(), _children_cpu_s()
        say(f"  {name} ...")
        result = step()
        steps[name] = round(time.monotonic() - begun, 1)
        cpu[name] = round(_children_cpu_s() - begun_cpu, 1)
        return result

    # One path for every build of this base (they are serialized by the
    # caller's lock): kbuild writes the absolute path into objtool's build,
    # so a copy of the base elsewhere would relink objtool and recompile
    # every object after it.
    folder = unprivileged.fresh_folder(parent, user, f"work-{base_key}")
    if patches:
        # a patch is input root must not trust: its build's steps see the
        # build parent read-only (ccache's folder, every other build's)
        if unprivileged.can_confine():
            user = unprivileged.confined(user, parent, folder)
        else:
            say("  no mount namespace here: this patched build can write into ccache's folder")
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=kernels_dir(cache)))
    incremental = False
    if patches:
        problem = base_problem(base)
        incremental = problem is None
        if problem is not None and problem != "absent":
            # detected, refused, and rebuilt: B from the source (ccache's),
            # the next unpatched build kept as the base again
            say(f"  the kept base tree {base.name} is {problem}: removed; building from the source")
            remove_base(base)
    keep_as_base = not patches
    sources_end_ns = 0
    try:
        say(f"building {source.label}" + "".join(f" + {p.path.name}" for p in patches) + f" with -j{jobs}")
        if incremental:
            try:
                copied = timed("copy A's tree", lambda: copy_base(user, base, folder))
                say(f"  copy A's tree: {copied}")
            except BadInput as exc:  # a full disk, say
                say(f"  {exc}: building from the source instead")
                _run_ok(user, ["rm", "-rf", "linux"], folder, folder / "home", "removing the partial copy")
                incremental = False
        if not incremental:
            sources_end_ns = timed("unpack", lambda: unpack(source, user, folder))
        for patch in patches:
            timed(f"patch {patch.path.name}", functools.partial(apply_patch, user, folder, patch))
        touched = config_touched(patches)
        if incremental and not touched:
            # the patches touch no Kconfig: the base's .config is this build's
            _, missing = timed("config (A's .config kept)", lambda: kept_config(user, folder, fragments))
        else:
            _, missing = timed("config", lambda: assemble_config(user, folder, fragments))
        for line in missing:
            say(f"  config: the fragments ask {line}")
        progress = Progress(_expected_steps(cache, incremental), say=say)
        before = ccache_counts(user, folder)
        timed("compile", lambda: compile_kernel(user, folder, jobs, progress))
        if progress.link_at is not None:
            # the compile's wall time split at make's first link step
            total = steps.pop("compile")
            linking = round(min(time.monotonic() - progress.link_at, total), 1)
            steps["compile"] = round(total - linking, 1)
            steps["link + modules"] = linking
        after = ccache_counts(user, folder)
        lookups = {k: after[k] - before[k] for k in after if k in before}
        if lookups:
            say(f"  ccache: {lookups['hits']} hits, {lookups['misses']} misses")
        _remember_steps(cache, incremental, progress.done)
        # after the compile: before it, kbuild has no include/config/auto.conf
        # yet and kernelrelease leaves CONFIG_LOCALVERSION out
        release = check_release(
            _run_ok(
                user, ["make", "-s", "kernelrelease"], folder / "linux", folder / "home", "make kernelrelease"
            ).stdout.strip(),
            "make kernelrelease",
        )
        _run_ok(user, ["rm", "-rf", "../out", "../variant"], folder / "linux", folder / "home", "clearing out/")
        no_variant = timed("balloon driver variant", lambda: build_variant(user, folder))
        if no_variant:
            say(f"  no balloon driver variant: {no_variant}")
        # the modules tree's build/source links stay behind (install_and_send)
        timed("install + copy out", lambda: install_and_send(user, folder, staging))
        timed("checks", lambda: check_artefacts(staging, release))
        kernel = BuiltKernel(
            name=f"{release}-{key}",
            release=release,
            directory=kernels_dir(cache) / f"{release}-{key}",
            source=source.label,
            source_sha256=source.sha256,
            patches=tuple(p.record() for p in patches),
            config_fragments=tuple(name for name, _ in fragments),
            compiler=compiler,
            key=key,
            config_unmet=tuple(missing),
            balloon_variant_unavailable=no_variant,
            build_s=round(time.monotonic() - started, 1),
            steps_s=steps,
            cpu_s=cpu,
            incremental=incremental,
            jobs=jobs,
            ccache=lookups,
        )
        if install:
            (staging / "manifest.json").write_text(json.dumps(kernel.to_json(), indent=2) + "\n")
            os.chmod(staging, 0o755)
            shutil.rmtree(kernel.directory, ignore_errors=True)
            os.replace(staging, kernel.directory)
        if keep_as_base:
            begun = time.monotonic()
            try:
                keep_base(folder, base, sources_end_ns)
                say(f"  kept as the base of patched builds (sealed): {time.monotonic() - begun:.0f} s")
            except (OSError, tree_copy.TreeRefused) as exc:
                say(f"  not kept as the base of patched builds: {exc}")
        return kernel
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if folder.exists():
            begun = time.monotonic()
            unprivileged.remove_folder(user, folder)
            say(f"  removing the build folder: {time.monotonic() - begun:.0f} s")


# ------------------------------------------------------------ an A/B of a patch


def default_source(cache: Path | None = None) -> str:
    """debian:X.Y of the default Debian kernel (the image's): its release
    6.1.0-57-amd64 gives debian:6.1."""
    package = packages.resolve_kernel_package(cache or cache_dir())
    match = re.match(r"linux-image-([0-9]+\.[0-9]+)", package)
    if match is None:
        raise BadInput(f"the default kernel {package} names no X.Y: give --kernel-source")
    return f"debian:{match.group(1)}"


@dataclasses.dataclass(frozen=True)
class PatchArms:
    """The two kernels of ``memqual run --patch``: A the source as it is,
    B with the patches (or a second source), and what a record says of them."""

    a: BuiltKernel
    b: BuiltKernel
    patches: tuple[Patch, ...]
    config_diff: tuple[str, ...]
    # what differs between the two builds' artefacts (bzImage, each module,
    # by path): a patch to one driver should change its module alone
    built_diff: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "patches": [dataclasses.asdict(p.record()) | {"text": f"patch/{p.path.name}"} for p in self.patches],
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "config_diff": list(self.config_diff),
            "built_diff": list(self.built_diff),
        }


def artefact_hashes(kernel: BuiltKernel) -> dict[str, str]:
    """sha256 of the bzImage and of each module (.ko), by path below the
    release's modules folder; the balloon driver variant beside them."""
    found = {"bzImage": packages.sha256_file(kernel.bzimage)}
    for ko in sorted(kernel.modules.rglob("*.ko")):
        found[str(ko.relative_to(kernel.modules))] = packages.sha256_file(ko)
    if kernel.balloon_variant is not None:
        found[kernel.balloon_variant.name] = packages.sha256_file(kernel.balloon_variant)
    return found


def built_diff(a: BuiltKernel, b: BuiltKernel) -> list[str]:
    """The artefacts that differ between two builds, one line each: what
    a patch changed in what the guest runs (nothing, for a null patch of
    a reproducible build: kbuild's stamps are fixed, STAMP_ENV)."""
    ha, hb = artefact_hashes(a), artefact_hashes(b)
    lines = []
    for name in sorted(set(ha) | set(hb)):
        if name not in hb:
            lines.append(f"{name}: only in A")
        elif name not in ha:
            lines.append(f"{name}: only in B")
        elif ha[name] != hb[name]:
            lines.append(f"{name}: differs")
    return lines


def arms(
    sources: Sequence[str],
    patch_paths: Sequence[str | os.PathLike[str]],
    config_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    jobs: int | None = None,
    say: Callable[[str], None] = print,
) -> PatchArms:
    """A and B built (A first: B then starts from A's objects): one source
    with the patches on B, or two sources (the patches, if any, on B)."""
    if len(sources) > 2:
        raise BadInput("give --kernel-source at most twice (A and B)")
    if len(sources) < 2 and not patch_paths:
        raise BadInput("one --kernel-source compares nothing: give --patch FILE, or --kernel-source twice")
    patches = tuple(read_patch(p) for p in patch_paths)  # checked before anything is fetched or built
    chosen = list(sources) or [default_source()]
    a = build(chosen[0], (), config_paths, jobs=jobs, say=say)
    b = build(chosen[-1], patch_paths, config_paths, jobs=jobs, say=say)
    diff = config_diff(a.config.read_text(), b.config.read_text())
    return PatchArms(a, b, patches, tuple(diff), tuple(built_diff(a, b)))

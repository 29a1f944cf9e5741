"""Distribution packages, fetched with ``apt-get download`` and unpacked
with ``dpkg -x`` (no root needed for either), cached by file name.

A cached .deb is used only when its sha256 is the one the package lists
give (or the one recorded when apt-get had just fetched it), never by its
name alone.  docs/setup-and-tests.md, "images/packages.py", says how root
takes a download from apt's sandbox."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from memqual.host.core import leftovers
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import write_private_atomic


def _run(argv: list[str], cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as exc:
        raise CapabilityMissing(f"{argv[0]} not found: run ./setup (installs apt, dpkg and kmod)") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise BadInput(f"{' '.join(argv[:3])} failed: {tail[0]} (run 'apt-get update' and try again)")
    return proc.stdout


def run_apt(argv: list[str], cwd: Path | None = None) -> str:
    """An apt or dpkg tool's output; a failure is one BadInput line."""
    return _run(argv, cwd)


def installed_field(package: str, field: str) -> str:
    """A field of an installed package as dpkg-query prints it (``Version``,
    ``source:Version``); "" when it is not installed or dpkg cannot say."""
    try:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f", f"${{{field}}}", package],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def not_installed(names: Sequence[str]) -> list[str]:
    """The packages of ``names`` dpkg does not have installed, in order."""
    return [name for name in names if "install ok installed" not in installed_field(name, "Status")]


def unpack_deb(deb: Path, target: Path) -> None:
    """A .deb's files unpacked into ``target`` (``dpkg -x``, no root)."""
    _run(["dpkg", "-x", str(deb), str(target)])


def _lists_fingerprint() -> str:
    """Changes whenever ``apt-get update`` brings new package lists."""
    lists = Path("/var/lib/apt/lists")
    stamps = sorted(f"{p.name}:{p.stat().st_mtime_ns}" for p in lists.glob("*Packages*"))
    return hashlib.sha256("\n".join(stamps).encode()).hexdigest()


def _memoized(question: str, answer: Callable[[], str], cache: Path) -> str:
    """apt-cache takes about half a second a call: remember its answers
    until the package lists change, so a cached image build stays fast."""
    memo_file = cache / "debs" / "apt-answers.json"
    fingerprint = _lists_fingerprint()
    try:
        memo = json.loads(memo_file.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    if memo.get("lists") != fingerprint:
        memo = {"lists": fingerprint}
    if question not in memo:
        memo[question] = answer()
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        write_private_atomic(memo_file, json.dumps(memo).encode(), 0o644)
    return str(memo[question])


def resolve_kernel_package(cache: Path, meta: str = "linux-image-amd64") -> str:
    """The versioned kernel package a meta package points at."""
    return _memoized(f"depends:{meta}", lambda: _resolve_kernel_package(meta), cache)


def _resolve_kernel_package(meta: str) -> str:
    for line in _run(["apt-cache", "depends", meta]).splitlines():
        line = line.strip()
        if line.startswith("Depends:") and "linux-image-" in line:
            return line.split()[1]
    raise BadInput(f"apt-cache knows no kernel behind {meta}: run 'apt-get update'")


def available_kernels(cache: Path) -> list[str]:
    """The releases of the amd64 kernel packages the archive offers
    (``uname -r`` names such as 6.1.0-57-amd64 or 6.12.111+deb12-amd64)."""
    answer = _memoized("kernel-releases", _list_kernels, cache)
    return [line for line in answer.splitlines() if line]


def _list_kernels() -> str:
    names = _run(["apt-cache", "pkgnames", "linux-image-"]).split()
    releases = set()
    for name in names:
        release = name.removeprefix("linux-image-").removesuffix("-unsigned")
        # A release is x.y.z... ending in the flavour; meta packages
        # (linux-image-amd64, linux-image-6.12-amd64) and debug symbols are
        # not kernels.
        if re.match(r"\d+\.\d+\.\d+", release) and release.endswith("-amd64") and "-dbg" not in release:
            releases.add(release)
    # Imported here, not at the top: ./setup builds the balloon driver with
    # this module on the standard library alone (python -S), before pip has
    # installed python-debian.
    from memqual.images.releases import release_order

    return "\n".join(sorted(releases, key=release_order))


# A kernel's release as Debian names it (6.1.0-57-amd64, 6.12.111+deb12-amd64),
# optionally as its package: checked before the archive is asked.
KERNEL_NAME = re.compile(r"(linux-image-)?[0-9][0-9A-Za-z.+~-]*")


def check_kernel_name(version: str) -> str:
    """``version`` when it has the form of a Debian kernel's name; anything
    else (a path, a space, nothing) is one BadInput line."""
    if not KERNEL_NAME.fullmatch(version.strip()):
        raise BadInput(
            f"{version!r} is no Debian kernel name: give a release such as 6.1.0-57-amd64 "
            "(memqual image kernels lists them)"
        )
    return version


def kernel_package(version: str, cache: Path) -> str:
    """The package of a kernel named by its package or its release; an
    unknown one is a BadInput naming the nearest ones the archive has."""
    release = check_kernel_name(version).strip().removeprefix("linux-image-").removesuffix("-unsigned")
    known = available_kernels(cache)
    if release not in known:
        import difflib

        near = difflib.get_close_matches(release, known, n=4, cutoff=0.5) or known[-4:]
        raise BadInput(
            f"no Debian kernel {version!r}: nearest available: {', '.join(near) or 'none (run apt-get update)'}"
            " (memqual image kernels lists them all)"
        )
    # The signed package holds the same kernel with a signature appended;
    # either boots, the unsigned one is there for every flavour.
    for candidate in (f"linux-image-{release}", f"linux-image-{release}-unsigned"):
        if _memoized(f"candidate:{candidate}", functools.partial(_candidate, candidate), cache) not in ("", "(none)"):
            return candidate
    raise BadInput(f"no installable package for kernel {release}: run 'apt-get update'")


APT_SANDBOX_USER = "_apt"  # apt's APT::Sandbox::User default
DOWNLOAD_PREFIX = "mq-dl"  # under /tmp, for apt's sandbox user (see the module's docstring)


DOWNLOAD_LOCK_DEADLINE_S = 900.0  # another run fetching the same package (linux-source is 139 MB)


def download(package: str, cache: Path, version: str | None = None, apt_options: tuple[str, ...] = ()) -> Path:
    """The .deb of ``package`` at ``version`` (default: the current
    candidate), downloaded once.  One run at a time per package writes into
    debs/ (its lock also tells the sweep of killed downloads what is live).
    ``apt_options`` (``-o`` pairs) point apt at private package lists, e.g.
    a suite the system's sources lack; the hash is then checked against
    those signed lists."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    if version is None:
        version = _memoized(f"candidate:{package}", lambda: _candidate(package), cache)
    if not version or version == "(none)":
        raise BadInput(f"no installable version of {package}: run 'apt-get update'")

    def listed_sha256() -> str:
        # The system's lists unless private ones are named.
        return _archive_sha256(package, version, apt_options) if apt_options else _archive_sha256(package, version)

    expected = _memoized(f"sha256:{package}={version}", listed_sha256, cache)
    leftovers.sweep_debs(debs)
    lock = leftovers.package_lock(debs, package)
    with file_lock(lock, exclusive=True, deadline_s=DOWNLOAD_LOCK_DEADLINE_S, held=f"{package} is being downloaded"):
        return _cached_or_fetched(package, version, expected, debs, apt_options)


def _cached_or_fetched(
    package: str, version: str, expected: str, debs: Path, apt_options: tuple[str, ...] = ()
) -> Path:
    for path in debs.glob(f"{package}_*.deb"):
        if _deb_version(path) != version:
            continue
        if _sha256(path) == (expected or _fetched_sha256(path)):
            return path
        # A .deb that is not the archive's (truncated, replaced), or one
        # nothing vouches for, is fetched again.
        path.unlink()
        path.with_name(f".{path.name}.sha256").unlink(missing_ok=True)
        _fetched_record(path).unlink(missing_ok=True)
    with _DownloadDir(debs, package) as work:
        _run(["apt-get", *apt_options, "download", f"{package}={version}"], cwd=work)
        fetched = sorted(work.glob("*.deb"))
        if len(fetched) != 1 or not fetched[0].name.startswith(f"{package}_"):
            names = ", ".join(p.name for p in fetched) or "none"
            raise BadInput(
                f"apt-get download {package}={version} gave {len(fetched)} .deb files ({names}), not one of "
                f"{package}: run 'apt-get update' and try again"
            )
        target = debs / fetched[0].name
        digest = _copy_private(fetched[0], target, expected)
    write_private_atomic(_fetched_record(target), f"{digest}\n".encode(), 0o644)
    return target


def _fetched_record(deb: Path) -> Path:
    return deb.with_name(f".{deb.name}.fetched")


def _fetched_sha256(deb: Path) -> str | None:
    """The sha256 memqual recorded when apt-get had just fetched ``deb``."""
    try:
        digest = _fetched_record(deb).read_text().strip()
    except OSError:
        return None
    return digest if len(digest) == 64 else None


def sandbox_uid() -> int | None:
    """The uid apt-get downloads as when run by root (its ``_apt`` sandbox
    user); None when not root, or when apt has no such user (it then
    downloads as root anyway)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(APT_SANDBOX_USER).pw_uid
    except KeyError:
        return None


def sandbox_dir(prefix: str) -> tuple[Path, Path]:
    """A fresh place apt's sandbox user may write, reachable from /: a
    root-owned directory (0711: the sandbox user can enter, nobody else can
    list) under /tmp, held live until ``leftovers.release_tempdir``; returns
    it and the sandbox's own 0700 directory inside it (``partial``)."""
    sandbox = sandbox_uid()
    assert sandbox is not None, "only root hands apt a sandbox directory"
    outer = leftovers.live_tempdir(prefix, "/tmp")
    os.chmod(outer, 0o711)
    inner = outer / "partial"
    inner.mkdir(mode=0o700)
    os.chown(inner, sandbox, -1)
    return outer, inner


def copy_checked(source: Path, target: Path, expected: str) -> None:
    """Copy ``source`` (a file apt wrote where its sandbox user may write)
    into a private folder as ``copy_regular`` does, refused unless its
    sha256 is ``expected`` (what the signed lists give)."""
    if not expected:
        raise BadInput(f"{source.name}: the signed lists give no sha256 for it: run the command again")
    _copy_private(source, target, expected)


def copy_regular(source: Path, target: Path) -> None:
    """Copy ``source`` (a file apt wrote where its sandbox user may write)
    into a private folder: without following a link, a regular file only,
    whole or not at all; its modification time is kept."""
    _copy_private(source, target, "")
    st = os.lstat(source)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


class _DownloadDir:
    """Where ``apt-get download`` writes: a scratch directory in the cache
    when not root; as root a directory of apt's sandbox user inside a
    root-owned one (0711: the sandbox user can enter, nobody else can
    list) under /tmp, since the sandbox user cannot reach the 0700 cache
    and apt would then download unsandboxed, as root."""

    def __init__(self, debs: Path, package: str) -> None:
        self.debs = debs
        self.package = package
        self.outer: Path | None = None

    def __enter__(self) -> Path:
        if sandbox_uid() is None:
            self.outer = Path(tempfile.mkdtemp(prefix=f".dl-{self.package}-", dir=self.debs))
            return self.outer
        self.outer, inner = sandbox_dir(DOWNLOAD_PREFIX)
        return inner

    def __exit__(self, *exc: object) -> None:
        if self.outer is not None:
            leftovers.release_tempdir(self.outer)


def _copy_private(source: Path, target: Path, expected: str) -> str:
    """Copy ``source`` (in a directory another user owns) to ``target`` in
    the private cache: opened without following a link, a regular file
    only, hashed while copied, checked against ``expected`` when the lists
    give one; the file appears under ``target`` whole or not at all.
    Returns its sha256."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadInput(f"{source.name} as apt-get left it cannot be read ({exc.strerror}): try again") from exc
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise BadInput(f"{source.name} as apt-get left it is no regular file: refused; try again")
        out_fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        digest = hashlib.sha256()
        try:
            with os.fdopen(out_fd, "wb") as out:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
            if expected and digest.hexdigest() != expected:
                raise BadInput(f"{source.name}: its sha256 is not the archive's: run 'apt-get update' and try again")
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    """sha256 of ``path``, remembered beside it by size and mtime: a cached
    image build must stay well under a second, and a kernel .deb is large."""
    st = path.stat()
    memo = path.with_name(f".{path.name}.sha256")
    stamp = f"{st.st_size} {st.st_mtime_ns}"
    try:
        known_stamp, _, digest = memo.read_text().strip().rpartition(" ")
        if known_stamp == stamp and len(digest) == 64:
            return digest
    except OSError:
        pass
    digest = sha256_file(path)
    write_private_atomic(memo, f"{stamp} {digest}\n".encode(), 0o644)
    return digest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def archive_sha256(package: str, version: str, apt_options: tuple[str, ...] = ()) -> str:
    """The SHA256 the (signed) package lists give for ``package=version``,
    "" when they give none."""
    return _archive_sha256(package, version, apt_options)


def _archive_sha256(package: str, version: str, apt_options: tuple[str, ...] = ()) -> str:
    """The SHA256 the package lists give for this version ("" if none)."""
    for line in _run(["apt-cache", *apt_options, "show", f"{package}={version}"]).splitlines():
        if line.startswith("SHA256:"):
            return line.split(":", 1)[1].strip()
    return ""


def depends(package: str, version: str, cache: Path) -> list[str]:
    """The packages ``package=version`` depends on, by name (the first of
    each set of alternatives, version constraints dropped)."""

    def ask() -> str:
        for line in _run(["apt-cache", "show", f"{package}={version}"]).splitlines():
            if line.startswith("Depends:"):
                return line.split(":", 1)[1]
        return ""

    field = _memoized(f"depends-of:{package}={version}", ask, cache)
    return [alt.split("|")[0].split("(")[0].strip() for alt in field.split(",") if alt.strip()]


def _candidate(package: str) -> str:
    for line in _run(["apt-cache", "policy", package]).splitlines():
        if line.strip().startswith("Candidate:"):
            return line.split(":", 1)[1].strip()
    return ""


def _deb_version(path: Path) -> str:
    # file names are name_version_arch.deb, with ':' of an epoch as %3a
    return path.name.split("_")[1].replace("%3a", ":")


def unpack(deb: Path, cache: Path) -> Path:
    """The unpacked tree of ``deb`` (``dpkg -x``), unpacked once."""
    target = cache / "unpacked" / deb.stem
    stamp = _sha256(deb)
    complete = target / ".complete"
    try:
        if complete.read_text().strip() in (stamp, ""):  # "": unpacked by an older memqual
            return target
    except OSError:
        pass
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    unpack_deb(deb, target)
    complete.write_text(stamp + "\n")  # which .deb this tree is, checked on every use
    return target

"""Debian's QEMU source package by version, for ``memqual qemu build``:
found in private deb-src lists (images/qemu.py ``PrivateApt``), fetched
with ``apt-get source --download-only`` (apt checks every file against the
signed Sources), checked again against the .dsc and kept in
``<cache>/qemu-src/<version>/`` whole or not at all; its patch series read
from root's copy of the Debian tarball.  docs/qemu-builds.md."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from memqual.host.core import leftovers
from memqual.host.core.errors import BadInput
from memqual.host.core.locks import file_lock
from memqual.host.core.trust import trusted_dir
from memqual.images import packages
from memqual.images.qemu import VERSION_FORM, PrivateApt, madison, upstream_version

PACKAGE = "qemu"
MANIFEST = "source.json"
FETCH_LOCK_DEADLINE_S = 900.0  # another run fetching the same source: 24 MB
SERIES = "debian/patches/series"
SERIES_MAX = 1 << 20
# A quilt series line: a patch's name and an optional -pN.
SERIES_LINE = re.compile(r"([\w.+-]+(?:/[\w.+-]+)*)(?:\s+-p(\d))?")
DOWNLOAD_PREFIX = "mq-qemu-src"


@dataclasses.dataclass(frozen=True)
class QemuSource:
    package_version: str  # "1:7.2+dfsg-7+deb12u18"
    directory: Path
    dsc: Path
    orig: Path
    debian: Path
    dsc_sha256: str

    @property
    def label(self) -> str:
        return f"{PACKAGE} {self.package_version}"

    @property
    def upstream(self) -> str:
        return upstream_version(self.package_version)


@dataclasses.dataclass(frozen=True)
class SeriesPatch:
    name: str  # below debian/patches/
    strip: int


def source_apt(cache: Path) -> PrivateApt:
    return PrivateApt(trusted_dir(cache / "qemu-src-apt", "QEMU source apt directory"), source_packages=True)


def offers(cache: Path, update: bool = False) -> list[str]:
    """The source versions of qemu the release's suites offer, newest first
    (madison lists them by suite, not by version)."""
    apt = source_apt(cache)
    if update or not apt.fresh():
        apt.update()
    known = list(dict.fromkeys(v for v, _ in madison(apt, PACKAGE)))
    return sorted(known, key=functools.cmp_to_key(compare_versions), reverse=True)


def compare_versions(a: str, b: str) -> int:
    """Debian's order of two versions (dpkg --compare-versions): -1, 0, 1."""
    if a == b:
        return 0
    try:
        proc = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BadInput(f"dpkg --compare-versions failed ({exc}): run ./setup") from exc
    return -1 if proc.returncode == 0 else 1


def system_source_version() -> str:
    """The source version the system's qemu-system-x86 was built from ("" if none)."""
    return packages.installed_field("qemu-system-x86", "source:Version")


def resolve(version: str | None, cache: Path) -> str:
    """``--version`` as a source package version: None is the system
    QEMU's source when the archive still has it, else the newest; an
    upstream version (7.2, 7.2.22 is not how Debian names it) or Debian's."""
    if version is not None and not VERSION_FORM.fullmatch(version):
        raise BadInput(f"--version {version!r}: give a QEMU source version such as 7.2 (memqual qemu list)")
    known = offers(cache)
    if not known:
        raise BadInput("the archive lists no qemu source package: is the network up? then run the command again")
    if version is None:
        system = system_source_version()
        return system if system in known else known[0]
    for offer in known:
        if version in (offer, upstream_version(offer), offer.split(":", 1)[-1]):
            return offer
    raise BadInput(f"--version {version}: the archive's qemu sources are {', '.join(known)}: give one of them")


def _safe_name(package_version: str) -> str:
    return re.sub(r"[^0-9A-Za-z.+~-]", "_", package_version)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load(directory: Path) -> QemuSource | None:
    try:
        data = json.loads((directory / MANIFEST).read_text())
        source = QemuSource(
            package_version=str(data["package_version"]),
            directory=directory,
            dsc=directory / str(data["dsc"]),
            orig=directory / str(data["orig"]),
            debian=directory / str(data["debian"]),
            dsc_sha256=str(data["dsc_sha256"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(p.is_file() for p in (source.dsc, source.orig, source.debian)):
        return None
    return source


def fetch(version: str | None, cache: Path) -> QemuSource:
    """The source of ``version`` (``resolve``), downloaded once."""
    package_version = resolve(version, cache)
    root = trusted_dir(cache / "qemu-src", "QEMU source cache directory")
    target = root / _safe_name(package_version)
    source = load(target)
    if source is not None:
        return source
    with file_lock(
        root / f".{target.name}.lock",
        exclusive=True,
        deadline_s=FETCH_LOCK_DEADLINE_S,
        held=f"the qemu source {package_version} is being fetched by another run",
    ):
        source = load(target)
        if source is not None:
            return source
        # what a killed fetch of this version left (the lock is ours)
        for stale in root.glob(f".fetch-{target.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".fetch-{target.name}-", dir=root))
        try:
            _download(package_version, source_apt(cache), staging)
            manifest = check(staging, package_version)
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            staging.chmod(0o755)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    fetched = load(target)
    assert fetched is not None  # just made whole
    return fetched


def listed_files(package_version: str, apt: PrivateApt) -> dict[str, str]:
    """The source package's files and their sha256 as the signed Sources
    give them (``apt-get source --print-uris``, asked in an empty folder:
    apt leaves out what the folder already has)."""
    argv = ["apt-get", *apt.options(), "source", "--print-uris", f"{PACKAGE}={package_version}"]
    with tempfile.TemporaryDirectory(prefix="mq-qemu-uris-") as empty:
        out = packages.run_apt(argv, cwd=Path(empty))
    files = {
        m.group(1): m.group(2) for m in re.finditer(r"^'[^']+' (\S+) [0-9]+ SHA256:([0-9a-f]{64})$", out, re.MULTILINE)
    }
    if not files:
        raise BadInput(f"apt lists no files of {PACKAGE} {package_version} with a sha256: run the command again")
    return files


def _download(package_version: str, apt: PrivateApt, staging: Path) -> None:
    """apt-get source --download-only (into apt's sandbox, as root), each
    file copied into ``staging`` only if the signed Sources give its sha256
    (the sandbox's folder is the sandbox user's to change until copied)."""
    listed = listed_files(package_version, apt)
    argv = ["apt-get", *apt.options(), "source", "--download-only", f"{PACKAGE}={package_version}"]
    if packages.sandbox_uid() is None:
        folder = Path(tempfile.mkdtemp(prefix=".download-", dir=staging.parent))
        try:
            packages.run_apt(argv, cwd=folder)
            _take(folder, staging, listed)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    outer, inner = packages.sandbox_dir(DOWNLOAD_PREFIX)
    try:
        packages.run_apt(argv, cwd=inner)
        _take(inner, staging, listed)
    finally:
        leftovers.release_tempdir(outer)


def _take(folder: Path, staging: Path, listed: dict[str, str]) -> None:
    for name, sha256 in listed.items():
        packages.copy_checked(folder / name, staging / name, sha256)


def dsc_files(text: str) -> dict[str, str]:
    """A .dsc's Checksums-Sha256: file name -> sha256."""
    files: dict[str, str] = {}
    inside = False
    for line in text.splitlines():
        if line.startswith("Checksums-Sha256:"):
            inside = True
            continue
        if inside and line.startswith(" "):
            fields = line.split()
            if len(fields) == 3 and re.fullmatch(r"[0-9a-f]{64}", fields[0]):
                files[fields[2]] = fields[0]
            continue
        inside = False
    return files


def check(folder: Path, package_version: str) -> dict[str, str]:
    """The downloaded files: one .dsc of 3.0 (quilt) format naming an
    upstream and a Debian tarball, each with the sha256 it names."""
    dscs = sorted(folder.glob("*.dsc"))
    if len(dscs) != 1:
        raise BadInput(f"apt-get source {PACKAGE}={package_version} gave {len(dscs)} .dsc files, not one: try again")
    text = dscs[0].read_text(errors="replace")
    if not re.search(r"^Format: 3\.0 \(quilt\)\s*$", text, re.MULTILINE):
        raise BadInput(f"{dscs[0].name} is not a 3.0 (quilt) source package: memqual builds no other")
    files = dsc_files(text)
    orig = [n for n in files if re.fullmatch(r"[^/]+\.orig\.tar\.(?:xz|gz|bz2)", n)]
    debian = [n for n in files if re.fullmatch(r"[^/]+\.debian\.tar\.(?:xz|gz|bz2)", n)]
    if len(orig) != 1 or len(debian) != 1:
        raise BadInput(f"{dscs[0].name} names no single upstream and Debian tarball: memqual builds no other")
    for name in (orig[0], debian[0]):
        path = folder / name
        if not path.is_file() or _sha256(path) != files[name]:
            raise BadInput(f"{name}: missing or not the sha256 its .dsc names: try again")
    return {
        "package_version": package_version,
        "dsc": dscs[0].name,
        "orig": orig[0],
        "debian": debian[0],
        "dsc_sha256": _sha256(dscs[0]),
    }


def series(source: QemuSource) -> list[SeriesPatch]:
    """Debian's patches in the order its series applies them, read from
    root's checked copy of the Debian tarball (never from the build tree,
    which the build user owns)."""
    try:
        with tarfile.open(source.debian) as archive:
            member = archive.getmember(SERIES)
            handle = archive.extractfile(member)
            if handle is None or member.size > SERIES_MAX:
                raise BadInput(f"{source.debian.name}: {SERIES} is not a file of sane size")
            text = handle.read().decode(errors="replace")
    except KeyError:
        return []  # no patches: the upstream tarball as it is
    except (OSError, tarfile.TarError) as exc:
        raise BadInput(f"{source.debian.name} cannot be read ({exc}): remove {source.directory} and try again") from exc
    return parse_series(text)


def parse_series(text: str) -> list[SeriesPatch]:
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = SERIES_LINE.fullmatch(line)
        if match is None or ".." in match.group(1).split("/"):
            raise BadInput(f"{SERIES} line {number} is no patch name: {line[:80]!r}")
        out.append(SeriesPatch(match.group(1), int(match.group(2) or 1)))
    return out

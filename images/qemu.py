"""Debian's QEMU by version: the archive's offer listed, the packages
fetched with private apt options and checked against the signed lists,
unpacked into ``CACHE/qemu/<package version>/`` whole or not at all.

The system's apt configuration is never touched.  docs/setup-and-tests.md,
"images/qemu.py", says how the backports suite is added and why every .deb
is checked twice."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from memqual.host.core import leftovers
from memqual.host.core.errors import BadInput
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.trust import trusted_dir
from memqual.images import packages

BINARY = "qemu-system-x86_64"
# What qemu-system-x86_64 needs of its own build: the binary, its modules
# (TCG itself is one in Debian), its firmware and keymaps.
QEMU_PACKAGES = ("qemu-system-x86", "qemu-system-common", "qemu-system-data")
# qemu-system-data's BIOS files are links into ../seabios; QEMU 10 needs a
# newer SeaBIOS than the stable release has, so it comes from the archive too.
FIRMWARE_PACKAGES = ("seabios",)
MANIFEST = "qemu.json"
LISTS_MAX_AGE_S = 24 * 3600  # package lists older than this are updated first
APT_LISTS_PREFIX = "mq-apt"  # under /tmp, for apt's sandbox user (packages.sandbox_dir)
UPDATE_LOCK_DEADLINE_S = 300.0  # another run updating the same lists: seconds
FETCH_LOCK_DEADLINE_S = 900.0  # another run fetching the same QEMU: its packages and unpack, about 10 s here
# A version as a user gives it: upstream (10.0.2) or Debian's (1:10.0.2+ds-2...).
VERSION_FORM = re.compile(r"[0-9][0-9A-Za-z.+~:-]*")


@dataclasses.dataclass(frozen=True)
class ArchiveQemu:
    """One qemu-system-x86 the archive offers."""

    version: str  # upstream, as the package names it: "10.0.2", "7.2"
    package_version: str  # Debian's: "1:10.0.2+ds-2+deb13u1~bpo12+1"
    suite: str  # "bookworm-backports"


@dataclasses.dataclass(frozen=True)
class UnpackedQemu:
    """A QEMU unpacked into the cache: where its parts are."""

    root: Path
    binary: Path
    module_dir: Path | None
    firmware_dir: Path
    archive: ArchiveQemu

    def to_json(self) -> dict[str, str]:
        return {
            "version": self.archive.version,
            "package_version": self.archive.package_version,
            "suite": self.archive.suite,
        }


def upstream_version(package_version: str) -> str:
    """Debian's version without epoch and Debian parts: 1:10.0.2+ds-2 -> 10.0.2."""
    plain = package_version.split(":", 1)[-1]
    return re.split(r"[+~-]", plain, maxsplit=1)[0]


def codename(os_release: Path = Path("/etc/os-release")) -> str:
    try:
        for line in os_release.read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    raise BadInput("this system names no Debian release in /etc/os-release: --qemu VERSION needs Debian")


def _system_mirror() -> str:
    """The Debian mirror the system's sources name (its backports suite is
    on the same mirror)."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in (".list", ".sources") or path.name == "sources.list":
            try:
                texts.append(path.read_text())
            except OSError:
                continue
    for text in texts:
        for uri in re.findall(r"(?:URIs:\s*|^deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.MULTILINE):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def _security_mirror() -> str:
    """The security mirror the system's sources name."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in re.findall(r"(?:URIs:\s*|^deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.MULTILINE):
            if uri.rstrip("/").endswith("/debian-security"):
                return uri.rstrip("/")
    return "http://deb.debian.org/debian-security"


@dataclasses.dataclass(frozen=True)
class PrivateApt:
    """apt pointed at private lists: the system's sources plus backports;
    with ``source_packages``, the source packages of the release's suites
    alone (deb-src lines, and none of the system's, whose binary lists a
    source download does not need)."""

    directory: Path
    source_packages: bool = False

    @property
    def sources(self) -> Path:
        return self.directory / ("sources.list" if self.source_packages else "backports.list")

    def lines(self, release: str) -> str:
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        if not self.source_packages:
            return f"deb [signed-by={keyring}] {_system_mirror()} {release}-backports main\n"
        suites = [(_system_mirror(), s) for s in (release, f"{release}-updates", f"{release}-backports")]
        suites.append((_security_mirror(), f"{release}-security"))
        return "".join(f"deb-src [signed-by={keyring}] {mirror} {suite} main\n" for mirror, suite in suites)

    @property
    def lists(self) -> Path:
        return self.directory / "lists"

    def options(self, lists: Path | None = None) -> tuple[str, ...]:
        # the system's sources.list.d left out: a folder with nothing in it
        parts = ("-o", f"Dir::Etc::sourceparts={self.directory / 'parts'}") if self.source_packages else ()
        return (
            *parts,
            "-o",
            f"Dir::Etc::sourcelist={self.sources}",
            "-o",
            f"Dir::State::Lists={lists or self.lists}",
            "-o",
            f"Dir::Cache={self.directory / 'cache'}",
        )

    def fresh(self) -> bool:
        stamps = list(self.lists.glob("*Sources*" if self.source_packages else "*Packages*"))
        return bool(stamps) and time.time() - min(p.stat().st_mtime for p in stamps) < LISTS_MAX_AGE_S

    def update(self, release: str | None = None) -> None:
        """``apt-get update`` into the private lists (about 3 s here)."""
        release = release or codename()
        (self.directory / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (self.directory / "parts").mkdir(exist_ok=True)
        write_private_atomic(self.sources, self.lines(release).encode(), 0o644)
        with file_lock(
            self.directory / ".update.lock", exclusive=True, deadline_s=UPDATE_LOCK_DEADLINE_S, held="apt-get update"
        ):
            if packages.sandbox_uid() is None:
                (self.lists / "partial").mkdir(parents=True, exist_ok=True)
                packages.run_apt(["apt-get", *self.options(), "update"])
                return
            # As root, apt-get downloads as its sandbox user, who cannot
            # reach the private cache: the lists are fetched into a folder
            # that user can reach (its partial/ the user's own, inside a
            # root-owned 0711 parent), then copied in.
            outer, _ = packages.sandbox_dir(APT_LISTS_PREFIX)
            try:
                packages.run_apt(["apt-get", *self.options(outer), "update"])
                self._take_lists(outer)
            finally:
                leftovers.release_tempdir(outer)

    def _take_lists(self, fetched: Path) -> None:
        """The lists apt-get left in ``fetched`` (its root-owned files, not
        the sandbox's partial/ or auxfiles/) as the private lists, in one
        step: ``lists`` is a link to a complete folder, replaced whole."""
        fresh = Path(tempfile.mkdtemp(prefix="lists.", dir=self.directory))
        try:
            for entry in os.scandir(fetched):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and entry.name not in ("lock", leftovers.LIVE_LOCK):
                    packages.copy_regular(Path(entry.path), fresh / entry.name)
            os.chmod(fresh, 0o755)
            link = self.directory / f".lists-{os.getpid()}"
            link.unlink(missing_ok=True)
            link.symlink_to(fresh.name)
            if self.lists.exists() and not self.lists.is_symlink():  # a folder of an older memqual
                shutil.rmtree(self.lists)
            os.replace(link, self.lists)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        # The lists before, and any a killed update left (under the update
        # lock nobody else is making one).
        for stale in self.directory.glob("lists.*"):
            if stale != fresh and not stale.is_symlink() and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)


def private_apt(cache: Path) -> PrivateApt:
    return PrivateApt(trusted_dir(cache / "qemu-apt", "QEMU apt directory"))


def _ready_apt(cache: Path, update: bool = False) -> PrivateApt:
    apt = private_apt(cache)
    if update or not apt.fresh():
        apt.update()
    return apt


def madison(apt: PrivateApt, package: str) -> list[tuple[str, str]]:
    """(package version, suite) the lists offer, newest first."""
    out = packages.run_apt(["apt-cache", *apt.options(), "madison", package])
    offers: list[tuple[str, str]] = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 3 and fields[0] == package:
            suite = fields[2].split()[1].split("/")[0] if len(fields[2].split()) > 1 else ""
            if (fields[1], suite) not in offers:
                offers.append((fields[1], suite))
    return offers


def available(cache: Path, update: bool = False) -> list[ArchiveQemu]:
    """Every qemu-system-x86 the archive offers (stable, its updates and
    security suites, backports), newest first."""
    apt = _ready_apt(cache, update)
    return [ArchiveQemu(upstream_version(v), v, s) for v, s in madison(apt, QEMU_PACKAGES[0])]


def check_version_form(text: str) -> str:
    if not VERSION_FORM.fullmatch(text):
        raise BadInput(f"{text!r} is no QEMU version: give one such as 10.0.2 (memqual qemu list lists them)")
    return text


def find(version: str, cache: Path) -> ArchiveQemu:
    """The archive's newest package of ``version`` (upstream or Debian's)."""
    check_version_form(version)
    offers = available(cache)
    for offer in offers:
        if version in (offer.version, offer.package_version):
            return offer
    known = ", ".join(dict.fromkeys(o.version for o in offers)) or "none (is the network up?)"
    raise BadInput(f"the archive has no QEMU {version}: it has {known} (memqual qemu list)")


def _companion_version(apt: PrivateApt, package: str, main_version: str) -> str:
    """The version of ``package`` that goes with qemu-system-x86 at
    ``main_version``: the same, or the same without a binary-only rebuild
    suffix (+bN, which arch-all packages lack); firmware: the newest."""
    offers = [v for v, _ in madison(apt, package)]
    if package in FIRMWARE_PACKAGES:
        if offers:
            return offers[0]
    else:
        source_version = re.sub(r"\+b[0-9]+$", "", main_version)
        for candidate in (main_version, source_version):
            if candidate in offers:
                return candidate
    raise BadInput(f"the archive has no {package} to go with qemu-system-x86 {main_version}: run memqual qemu list")


def _fetch_checked(package: str, version: str, apt: PrivateApt, cache: Path) -> Path:
    expected = packages.archive_sha256(package, version, apt.options())
    if not expected:
        raise BadInput(f"the package lists give no SHA256 for {package} {version}: run memqual qemu list --update")
    deb = packages.download(package, cache, version, apt.options())
    if packages.sha256_file(deb) != expected:
        deb.unlink(missing_ok=True)
        raise BadInput(f"{deb.name}: its sha256 is not the signed lists' (removed): run the command again")
    return deb


def qemu_root(cache: Path) -> Path:
    return trusted_dir(cache / "qemu", "QEMU cache directory")


def _safe_name(package_version: str) -> str:
    return re.sub(r"[^0-9A-Za-z.+~-]", "_", package_version)


def fetch(version: str, cache: Path) -> UnpackedQemu:
    """QEMU ``version`` from the archive, unpacked into the cache once.
    One run at a time fetches a version (its lock ``qemu/.NAME.lock``):
    another waits, then takes the tree the first one made, so no fetch
    replaces a tree that another run has just made or is running."""
    offer = find(version, cache)
    root = qemu_root(cache)
    name = _safe_name(offer.package_version)
    target = root / name
    cached = load(target)
    if cached is not None:
        return cached
    leftovers.sweep_qemu(root)
    with file_lock(
        leftovers.qemu_lock(root, name),
        exclusive=True,
        deadline_s=FETCH_LOCK_DEADLINE_S,
        held=f"QEMU {offer.package_version} is being fetched by another run",
    ):
        cached = load(target)
        if cached is not None:
            return cached
        apt = private_apt(cache)
        debs = [_fetch_checked(QEMU_PACKAGES[0], offer.package_version, apt, cache)]
        for package in (*QEMU_PACKAGES[1:], *FIRMWARE_PACKAGES):
            debs.append(_fetch_checked(package, _companion_version(apt, package, offer.package_version), apt, cache))
        return unpack(offer, debs, target)


def unpack(offer: ArchiveQemu, debs: list[Path], target: Path) -> UnpackedQemu:
    """``debs`` unpacked into ``target`` whole: in a temporary sibling,
    checked (its binary answers ``--version`` with its own modules), then
    renamed into place; on any failure the sibling is removed.  The caller
    holds the version's lock (``fetch``)."""
    work = Path(tempfile.mkdtemp(prefix=f".unpack-{target.name}-", dir=target.parent))
    try:
        for deb in debs:
            packages.unpack_deb(deb, work)
        manifest = {
            **dataclasses.asdict(offer),
            "debs": {deb.name: packages.sha256_file(deb) for deb in debs},
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        unpacked = _layout(work, offer)
        if unpacked is None:
            raise BadInput(f"the packages of QEMU {offer.package_version} hold no {BINARY}: not a QEMU")
        _check_runs(unpacked)
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = load(target)
    assert result is not None  # just checked in its temporary place
    return result


def _check_runs(unpacked: UnpackedQemu) -> None:
    env = dict(os.environ)
    if unpacked.module_dir is not None:
        env["QEMU_MODULE_DIR"] = str(unpacked.module_dir)
    try:
        out = subprocess.run(
            [str(unpacked.binary), "--version"], capture_output=True, text=True, timeout=30, env=env
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BadInput(f"the unpacked {BINARY} {unpacked.archive.version} does not run ({exc})") from exc
    if "QEMU emulator version" not in out:
        raise BadInput(f"the unpacked {BINARY} {unpacked.archive.version} does not say it is QEMU: not a QEMU")


def _layout(root: Path, offer: ArchiveQemu) -> UnpackedQemu | None:
    binary = root / "usr" / "bin" / BINARY
    if not binary.is_file():
        return None
    modules = sorted(root.glob("usr/lib/*/qemu"))
    return UnpackedQemu(
        root=root,
        binary=binary,
        module_dir=modules[0] if modules else None,
        firmware_dir=root / "usr" / "share" / "qemu",
        archive=offer,
    )


def load(root: Path) -> UnpackedQemu | None:
    """The unpacked QEMU at ``root``, or None when there is none whole."""
    try:
        data = json.loads((root / MANIFEST).read_text())
        offer = ArchiveQemu(str(data["version"]), str(data["package_version"]), str(data["suite"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return _layout(root, offer)


def owning(binary: Path) -> UnpackedQemu | None:
    """The unpacked QEMU ``binary`` belongs to (ROOT/usr/bin/qemu-...), if
    it is one memqual unpacked."""
    binary = Path(binary)
    if binary.name != BINARY or binary.parent.name != "bin":
        return None
    return load(binary.parent.parent.parent)

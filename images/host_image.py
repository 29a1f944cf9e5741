"""The host under test's image (L1): the host kernel's guest image
(images/build.py) with a second archive appended to its initrd: the guest
drivers plus kvm_amd and qemu_fw_cfg, QEMU with its libraries and x86
firmware at their host paths, the guest's kernel and initrd under /l2/,
and guest/rc.host, which starts the guest's QEMU from the argv fw_cfg
hands in.  Cached in ``<cache>/hosts/<key>/`` (host.cpio, initrd,
manifest.json); the kernel and SSH key stay the base image's.
docs/host-under-test.md has the layout and why."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from memqual.host.core import leftovers, locks
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import cache_dir
from memqual.images import modules
from memqual.images.build import GUEST_DIR, Image, KernelSource, build
from memqual.images.cpio import CpioWriter, add_tree
from memqual.images.packages import sha256_file

log = logging.getLogger("memqual.host_image")

HOST_BUILDER_VERSION = "1"  # bump when the layout of host.cpio changes
# What L1 loads beyond a guest's drivers: KVM for AMD (TCG emulates an
# AMD CPU with SVM, never VMX) and the fw_cfg reader the guest's argv comes
# through; kvm_intel when the kernel has it, for a lab host whose KVM nests
# on Intel (images/host.config, what a kernel memqual builds gets, leaves
# it out: under TCG it never loads).
HOST_MODULES = ("kvm_amd", "qemu_fw_cfg")
OPTIONAL_HOST_MODULES = ("kvm_intel",)
# The modules whose parameters --host-kernel-param may set: the ones L1 loads.
PARAM_MODULES = ("kvm", "kvm_amd")
# The firmware an x86 guest's QEMU may read: the BIOSes, the option ROMs of
# the NICs and the boot stubs.  The other architectures' files are left out.
FIRMWARE_SUFFIXES = (".bin", ".rom")
L2_KERNEL = "/l2/kernel"
L2_INITRD = "/l2/initrd"
BUILD_LOCK_DEADLINE_S = 600.0
# L1 images beyond this, least recently used first, are removed: each new
# QEMU, guest image or host kernel makes one (139-260 MB), and a lab host
# that qualifies kernels for months would fill its disk with them.
CACHE_CAP_BYTES = 4 << 30
# An image used this recently is kept whatever the cap: a run that found
# it may not have started its QEMU yet.
IN_USE_S = 3600.0


@dataclasses.dataclass(frozen=True)
class HostImage:
    """L1: its kernel, its initrd (with QEMU and the guest inside), the key
    memqual's SSH into L1 uses, and what it was built from."""

    directory: Path
    kernel: Path
    initrd: Path
    key: Path
    release: str
    guest_release: str
    qemu: str  # the QEMU binary inside L1, at its host path
    initrd_sha256: str

    def to_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in dataclasses.asdict(self).items()}


def _ldd(binary: Path, env: dict[str, str] | None) -> list[Path]:
    """The shared libraries ``binary`` loads, with the loader."""
    try:
        proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CapabilityMissing(f"ldd {binary} failed ({exc}): L1 needs QEMU's libraries") from exc
    found = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) >= 3 else (parts[0] if parts else "")
        if path.startswith("/"):
            found.append(Path(path))
    return found


def firmware_files(directories: tuple[Path, ...]) -> list[Path]:
    """Every x86 firmware file of QEMU's data folders, at the path QEMU
    looks for it (links kept as the names QEMU opens)."""
    files = []
    for directory in directories:
        if not directory.is_dir():
            continue
        for entry in sorted(directory.iterdir()):
            if entry.suffix in FIRMWARE_SUFFIXES and entry.is_file():
                files.append(entry)
    return files


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]


def _add_file(writer: CpioWriter, seen: set[str], host_path: Path, mode: int) -> None:
    """``host_path`` into the archive at the same path, its content
    resolved through links."""
    name = str(host_path).lstrip("/")
    for parent in _parents(name):
        if parent not in seen:
            writer.directory(parent)
            seen.add(parent)
    if name not in seen:
        writer.file(name, host_path.read_bytes(), mode)
        seen.add(name)


def _key(base: Image, guest: Image, qemu: Path, files: list[Path]) -> str:
    digest = hashlib.sha256(HOST_BUILDER_VERSION.encode())
    digest.update(",".join(modules.GUEST_MODULES + HOST_MODULES + OPTIONAL_HOST_MODULES).encode())
    digest.update(f"{base.kernel_sha256} {base.initrd_sha256} {guest.kernel_sha256} {guest.initrd_sha256}".encode())
    digest.update(str(qemu).encode())
    for path in files:
        st = path.stat()
        digest.update(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def module_parameters(source: KernelSource) -> dict[str, set[str]]:
    """The parameters of the modules L1 loads, by module, as modinfo reads
    them from the host kernel's own files."""
    from memqual.images.build import kernel_modules_dir

    modules_dir = kernel_modules_dir(source)
    found: dict[str, set[str]] = {}
    for name in PARAM_MODULES:
        path = next(
            (p for p in modules_dir.rglob("*.ko*") if modules.module_name(p.name) == name),
            None,
        )
        if path is None:
            raise BadInput(
                f"the host kernel has no {name} module: build it with CONFIG_{name.upper()}=m "
                "(L1 must load KVM for AMD)"
            )
        proc = subprocess.run(
            ["modinfo", "-F", "parm", str(path)], capture_output=True, text=True, timeout=30, check=False
        )
        found[name] = {line.split(":", 1)[0].strip() for line in proc.stdout.splitlines() if ":" in line}
    return found


def build_host(
    source: KernelSource, guest: Image, qemu: Path, firmware_dirs: tuple[Path, ...], env: dict[str, str] | None
) -> HostImage:
    """L1's image for the host kernel ``source``, with ``guest`` and the
    QEMU ``qemu`` inside (cached)."""
    base = build(source)
    from memqual.images.build import kernel_modules_dir

    modules_dir = kernel_modules_dir(source)
    libs = _ldd(qemu, env)
    firmware = firmware_files(firmware_dirs)
    rc_host = GUEST_DIR / "rc.host"
    key = _key(base, guest, qemu, [qemu, *libs, *firmware, rc_host])
    hosts = cache_dir() / "hosts"
    hosts.mkdir(parents=True, exist_ok=True, mode=0o700)
    leftovers.sweep_images(hosts)
    target = hosts / key
    with file_lock(
        hosts / f".{key}.lock",
        exclusive=True,
        deadline_s=BUILD_LOCK_DEADLINE_S,
        held=f"host image {key} is still being built by another run",
    ):
        cached = _load(target)
        if cached is not None:
            os.utime(target / "manifest.json")  # its last use, which the cap goes by
            enforce_cap(hosts, keep=target)
            return cached
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=hosts))
        try:
            image = _assemble(staging, target, base, guest, modules_dir, qemu, libs, firmware, rc_host)
            (staging / "manifest.json").write_text(json.dumps(image.to_json(), indent=2) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        enforce_cap(hosts, keep=target)
    return image


def enforce_cap(hosts: Path, keep: Path, cap_bytes: int = CACHE_CAP_BYTES, in_use_s: float = IN_USE_S) -> list[Path]:
    """Remove the least recently used L1 images of ``hosts`` while they
    hold more than ``cap_bytes``, never ``keep`` (the one being used), one
    used in the last ``in_use_s`` or one whose lock another run holds (it
    is being built or found); returns those removed.  A warm-start
    snapshot of a removed image goes with it (host/core/snapshot.py)."""
    entries = []
    for manifest in hosts.glob("*/manifest.json"):
        try:
            used = manifest.stat().st_mtime
        except OSError:
            continue
        entries.append((used, leftovers.tree_size(manifest.parent), manifest.parent))
    total = sum(size for _, size, _ in entries)
    now = time.time()
    removed = []
    for used, size, directory in sorted(entries):
        if total <= cap_bytes or now - used < in_use_s:
            break  # sorted by last use: every later one is newer
        if directory == keep or locks.is_free(hosts / f".{directory.name}.lock") is False:
            continue
        log.info("removing the host under test's image %s: the cache of them is over its cap", directory.name)
        shutil.rmtree(directory, ignore_errors=True)
        total -= size
        removed.append(directory)
    return removed


def _load(target: Path) -> HostImage | None:
    try:
        data = json.loads((target / "manifest.json").read_text())
        image = HostImage(
            directory=Path(data["directory"]),
            kernel=Path(data["kernel"]),
            initrd=Path(data["initrd"]),
            key=Path(data["key"]),
            release=data["release"],
            guest_release=data["guest_release"],
            qemu=data["qemu"],
            initrd_sha256=data["initrd_sha256"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not image.initrd.is_file() or sha256_file(image.initrd) != image.initrd_sha256:
        return None
    return image


def _assemble(
    staging: Path,
    final: Path,
    base: Image,
    guest: Image,
    modules_dir: Path,
    qemu: Path,
    libs: list[Path],
    firmware: list[Path],
    rc_host: Path,
) -> HostImage:
    root = staging / "root"
    modules.stage_modules(modules_dir, base.release, root, extra=HOST_MODULES, optional_extra=OPTIONAL_HOST_MODULES)
    buffer = io.BytesIO()
    writer = CpioWriter(buffer)
    seen = {"bin", "usr", "usr/bin", "etc", "lib", "lib64", "lib/x86_64-linux-gnu", "lib/modules"}
    add_tree(writer, root / "lib/modules", "lib/modules")
    _add_file(writer, seen, qemu, 0o755)
    for lib in libs:
        _add_file(writer, seen, lib, 0o755)
    for path in firmware:
        _add_file(writer, seen, path, 0o644)
    writer.directory("l2")
    writer.file(L2_KERNEL.lstrip("/"), guest.kernel.read_bytes(), 0o644)
    writer.file(L2_INITRD.lstrip("/"), guest.initrd.read_bytes(), 0o600)
    writer.file("etc/rc.host", rc_host.read_bytes(), 0o755)
    writer.close()
    extra = buffer.getvalue()
    shutil.rmtree(root)
    shutil.rmtree(staging / "root-depmod", ignore_errors=True)
    (staging / "host.cpio").write_bytes(extra)
    digest = hashlib.sha256()
    with open(staging / "initrd", "wb") as out, open(base.initrd, "rb") as first:
        for block in iter(lambda: first.read(1 << 20), b""):
            out.write(block)
            digest.update(block)
        out.write(extra)
        digest.update(extra)
    return HostImage(
        directory=final,
        kernel=base.kernel,
        initrd=final / "initrd",
        key=base.key,
        release=base.release,
        guest_release=guest.release,
        qemu=str(qemu),
        initrd_sha256=digest.hexdigest(),
    )

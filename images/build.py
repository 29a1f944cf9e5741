"""The guest image: a kernel plus an initramfs, built offline from
distribution packages and cached under a key of every input's hash.

Layout of one cache entry (``<cache>/images/<key>/``):
    kernel          vmlinux (PVH entry) when it could be extracted, else the bzImage
    initramfs.cpio  the reproducible base archive (busybox, dropbear, modules, init)
    keys.cpio       per-image SSH keys (not reproducible on purpose)
    initrd          initramfs.cpio + keys.cpio, what QEMU loads
    id_ed25519      the client key for this image (0600)
    manifest.json   what it was built from, and the sha256 of each file
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

from memqual.host.core import leftovers
from memqual.host.core.errors import BadInput, CapabilityMissing, MemqualError
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import cache_dir, shipped, write_private_atomic
from memqual.images import built_kernels, keys, modules, packages
from memqual.images.cpio import CpioWriter, add_tree
from memqual.images.kernel import check_release, extract_vmlinux, read_release
from memqual.images.packages import sha256_file

BUILDER_VERSION = "1"  # bump when the image layout changes
GUEST_DIR = shipped("guest")
BUSYBOX = Path("/bin/busybox")
DROPBEAR = Path("/usr/sbin/dropbear")
BUILD_LOCK_DEADLINE_S = 600.0  # another run building the same entry (a Debian kernel build takes ~10 s)
# What a lib/modules/RELEASE tree holds: from a package (kernel/, modules.order,
# modules.builtin) or from make modules_install (also modules.dep).
_MODULES_TREE_MARKS = ("modules.dep", "modules.order", "modules.builtin")


class CacheDamaged(MemqualError):
    """A cached image does not match what its manifest says."""

    exit_status = 1


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """Where the guest kernel comes from: Debian's package by default, or a
    user's own bzImage and its lib/modules/RELEASE tree."""

    bzimage: Path | None = None
    modules_dir: Path | None = None
    debian: str | None = None  # a Debian kernel by package name or release

    def __post_init__(self) -> None:
        if (self.bzimage is None) != (self.modules_dir is None):
            raise BadInput("give both --kernel BZIMAGE and --modules DIR (lib/modules/RELEASE), or neither")
        if self.debian is not None and self.bzimage is not None:
            raise BadInput("give either --debian-kernel VERSION or --kernel/--modules, not both")


@dataclasses.dataclass(frozen=True)
class Image:
    directory: Path
    kernel: Path
    initrd: Path
    key: Path
    release: str
    pvh: bool  # kernel is an ELF vmlinux booted through its PVH entry
    initramfs_sha256: str
    kernel_sha256: str
    cached: bool = False
    initrd_sha256: str = ""  # absent from manifests of older builds

    def to_json(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}


def _require_host_tools() -> None:
    missing = [str(p) for p in (BUSYBOX, DROPBEAR) if not p.exists()]
    if missing:
        raise CapabilityMissing(f"missing {', '.join(missing)}: run ./setup (installs busybox-static and dropbear-bin)")
    if not shutil.which("dpkg") or not shutil.which("apt-get"):
        raise CapabilityMissing("dpkg/apt-get not found: memqual builds guests from Debian packages")


def _shared_libraries(binary: Path) -> list[Path]:
    """What the dynamic loader needs for ``binary`` (dropbear is dynamic)."""
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    libs = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) >= 3 else parts[0]
        if path.startswith("/"):
            libs.append(Path(path))
    return libs


def _kernel_inputs(source: KernelSource, cache: Path) -> tuple[Path, Path, str]:
    """(bzImage, lib/modules/RELEASE dir, release) for the chosen kernel."""
    if source.bzimage is not None:
        assert source.modules_dir is not None
        if not source.bzimage.is_file():
            raise BadInput(f"{source.bzimage}: no such kernel file; pass a bzImage (arch/x86/boot/bzImage)")
        release = read_release(source.bzimage)
        return source.bzimage, source.modules_dir, release
    if source.debian is not None:
        # a name `memqual kernel build` printed stands for its kernel
        built = built_kernels.named(source.debian, cache)
        if built is not None:
            return built.bzimage, built.modules, built.release
        package = packages.kernel_package(source.debian, cache)
    else:
        package = packages.resolve_kernel_package(cache)
    tree = packages.unpack(packages.download(package, cache), cache)
    (vmlinuz,) = sorted((tree / "boot").glob("vmlinuz-*"))
    release = check_release(vmlinuz.name.removeprefix("vmlinuz-"), str(vmlinuz))
    return vmlinuz, tree / "lib/modules" / release, release


def kernel_modules_dir(source: KernelSource) -> Path:
    """The lib/modules/RELEASE tree of ``source``'s kernel (downloaded and
    unpacked into the cache once)."""
    return _kernel_inputs(source, cache_dir())[1]


def debian_kernel_files(version: str) -> tuple[Path, Path]:
    """(vmlinuz, lib/modules/RELEASE) of a Debian kernel, downloaded and
    unpacked into the cache once: what --guest-kernel/--guest-modules take."""
    bzimage, modules_dir, _ = _kernel_inputs(KernelSource(debian=version), cache_dir())
    return bzimage, modules_dir


_HASH_MEMO = "file-hashes.json"


def _memo_sha256(paths: list[Path], cache: Path) -> dict[Path, str]:
    """sha256 of each file, remembered by (path, size, mtime): a cached
    build must answer in well under a second, and hashing a kernel and
    libc every time costs most of that."""
    memo_file = cache / _HASH_MEMO
    try:
        memo: dict[str, str] = json.loads(memo_file.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    result, changed = {}, False
    for path in paths:
        st = path.stat()
        stamp = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        if stamp not in memo:
            memo[stamp] = sha256_file(path)
            changed = True
        result[path] = memo[stamp]
    if changed:
        write_private_atomic(memo_file, json.dumps(memo).encode(), 0o644)
    return result


def _module_files(directory: str, prefix: str) -> list[tuple[str, int]]:
    """(relative path, size) of every module file below ``directory``;
    os.scandir because a module tree has thousands of entries."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                found += _module_files(entry.path, prefix + entry.name + "/")
            elif ".ko" in entry.name:
                found.append((prefix + entry.name, entry.stat().st_size))
    return found


def _input_key(bzimage: Path, modules_dir: Path, host_files: list[Path], cache: Path) -> str:
    digest = hashlib.sha256(BUILDER_VERSION.encode())
    # Which modules an image ships is part of what it is.
    digest.update(",".join(modules.GUEST_MODULES + modules.OPTIONAL_GUEST_MODULES).encode())
    hashes = _memo_sha256([bzimage, *host_files], cache)
    digest.update(hashes[bzimage].encode())
    # Path and size are enough for module trees from a package or a build;
    # the kernel hash above changes with every rebuild anyway.
    for rel, size in sorted(_module_files(str(modules_dir), "")):
        digest.update(f"{rel}:{size}".encode())
    for path in host_files:
        # The guest's files by their name inside guest/, so two clones (or a
        # clone and an installed wheel) share one image; host files by their
        # absolute path.
        name = path.relative_to(GUEST_DIR.parent) if path.is_relative_to(GUEST_DIR) else path
        digest.update(str(name).encode() + hashes[path].encode())
    return digest.hexdigest()[:20]


def check_modules_tree(modules_dir: Path, release: str) -> None:
    """Refuse, before anything is hashed or copied, a directory that is no
    lib/modules/RELEASE tree (``--modules /usr`` would be walked whole)."""
    if not modules_dir.is_dir():
        raise BadInput(f"{modules_dir}: no such modules directory; pass lib/modules/{release}")
    if not ((modules_dir / "kernel").is_dir() or any((modules_dir / m).is_file() for m in _MODULES_TREE_MARKS)):
        raise BadInput(
            f"{modules_dir} is no kernel modules tree (no kernel/, modules.dep, modules.order or modules.builtin): "
            f"pass lib/modules/{release} (make modules_install INSTALL_MOD_PATH=DIR puts it in DIR/lib/modules)"
        )


def _build_lock(images: Path, key: str, exclusive: bool) -> AbstractContextManager[None]:
    """One builder per cache entry; readers wait for a build under way."""
    return file_lock(
        images / f".{key}.lock",
        exclusive=exclusive,
        deadline_s=BUILD_LOCK_DEADLINE_S,
        held=f"image {key} is still being built by another run",
    )


def _load_cached(target: Path, cache: Path) -> Image | None:
    """The cached entry, its files checked against the manifest's sha256
    (a memo by size and mtime keeps this fast); None when there is none."""
    manifest = target / "manifest.json"
    try:
        text = manifest.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheDamaged(f"{manifest} is unreadable ({exc}): run 'memqual image build --force'") from exc
    try:
        data = json.loads(text)
        data.pop("cached", None)
        image = Image(**{**data, **{k: Path(data[k]) for k in ("directory", "kernel", "initrd", "key")}}, cached=True)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CacheDamaged(
            f"{manifest} is damaged ({type(exc).__name__}: {exc}): run 'memqual image build --force'"
        ) from exc
    expected = {image.kernel: image.kernel_sha256, target / "initramfs.cpio": image.initramfs_sha256}
    if image.initrd_sha256:
        expected[image.initrd] = image.initrd_sha256
    try:
        actual = _memo_sha256(list(expected), cache)
    except OSError as exc:
        raise CacheDamaged(
            f"cached image {target.name} is incomplete ({exc.strerror}: {exc.filename}): "
            "run 'memqual image build --force'"
        ) from exc
    for path, digest in expected.items():
        if actual[path] != digest:
            raise CacheDamaged(
                f"cached image file {path} does not match its manifest's sha256: run 'memqual image build --force'"
            )
    return image


def build(source: KernelSource = KernelSource(), force: bool = False) -> Image:
    """Build (or find in the cache) the guest image for ``source``."""
    _require_host_tools()
    cache = cache_dir()
    bzimage, modules_dir, release = _kernel_inputs(source, cache)
    check_modules_tree(modules_dir, release)
    libs = _shared_libraries(DROPBEAR)
    guest_files = sorted(p for p in GUEST_DIR.iterdir() if p.suffix in ("", ".sh") and p.is_file())
    key = _input_key(bzimage, modules_dir, [BUSYBOX, DROPBEAR, *libs, *guest_files], cache)
    images = cache / "images"
    images.mkdir(parents=True, exist_ok=True)
    leftovers.sweep_images(images)  # staging entries of builds that were killed
    target = images / key
    if not force:
        with _build_lock(images, key, exclusive=False):
            cached = _load_cached(target, cache)
        if cached is not None:
            return cached
    with _build_lock(images, key, exclusive=True):
        if not force:
            cached = _load_cached(target, cache)  # built meanwhile by another run
            if cached is not None:
                return cached
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=images))
        try:
            image = _assemble(staging, target, bzimage, modules_dir, release, libs)
            (staging / "manifest.json").write_text(json.dumps(image.to_json(), indent=2) + "\n")
            # mkdtemp made it 0700, and so it stays: keys.cpio and the initrd
            # hold the guest's private host key.
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)  # a reader sees the whole entry or none
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return image


def _assemble(staging: Path, final: Path, bzimage: Path, modules_dir: Path, release: str, libs: list[Path]) -> Image:
    vmlinux = extract_vmlinux(bzimage)
    kernel = staging / "kernel"
    if vmlinux is not None:
        kernel.write_bytes(vmlinux)
    else:
        shutil.copyfile(bzimage, kernel)

    root = staging / "root"
    modules.stage_modules(modules_dir, release, root)
    buffer = io.BytesIO()
    writer = CpioWriter(buffer)
    for directory in (
        "bin",
        "sbin",
        "usr",
        "usr/bin",
        "usr/sbin",
        "etc",
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "root",
        "lib",
        "lib64",
        "lib/x86_64-linux-gnu",
        "var",
        "var/log",
    ):
        writer.directory(directory, 0o1777 if directory == "tmp" else 0o755)
    writer.device("dev/console", True, 5, 1)
    writer.device("dev/null", True, 1, 3, 0o666)
    writer.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    applets = subprocess.run([str(BUSYBOX), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    for applet in sorted(set(applets)):
        if applet not in ("bin/busybox",) and not applet.startswith("lib"):
            writer.symlink(applet, "/bin/busybox")
    writer.symlink("init", "/bin/busybox")
    writer.file("usr/sbin/dropbear", DROPBEAR.read_bytes(), 0o755)
    for lib in libs:
        name = str(lib).lstrip("/")
        if name.startswith("lib64/"):
            writer.file(name, lib.read_bytes(), 0o755)
        else:
            writer.file("lib/x86_64-linux-gnu/" + lib.name, lib.read_bytes(), 0o755)
    writer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    writer.file("etc/group", b"root:x:0:\n")
    writer.file("etc/shells", b"/bin/sh\n")
    writer.file("etc/inittab", (GUEST_DIR / "inittab").read_bytes())
    writer.file("etc/rc.memqual", (GUEST_DIR / "rc.sh").read_bytes(), 0o755)
    writer.directory("lib/modules")
    add_tree(writer, root / "lib/modules", "lib/modules")
    writer.close()
    base = buffer.getvalue()
    (staging / "initramfs.cpio").write_bytes(base)
    shutil.rmtree(root)
    shutil.rmtree(staging / "root-depmod", ignore_errors=True)

    key_path, keys_cpio = keys.generate(staging / "ssh")
    (staging / "keys.cpio").write_bytes(keys_cpio)
    (staging / "initrd").write_bytes(base + keys_cpio)
    final_key = final / "ssh" / key_path.name
    return Image(
        directory=final,
        kernel=final / "kernel",
        initrd=final / "initrd",
        key=final_key,
        release=release,
        pvh=vmlinux is not None,
        initramfs_sha256=hashlib.sha256(base).hexdigest(),
        kernel_sha256=sha256_file(kernel),
        initrd_sha256=hashlib.sha256(base + keys_cpio).hexdigest(),
    )

"""The virtio_balloon variant with a settable request size:
virtio_balloon_mq.ko, built from the guest kernel's own source.

For the Debian image kernel: ``linux-source-<x.y>`` of exactly the kernel
package's version gives drivers/virtio/virtio_balloon.c (only that file is
taken out of the 139 MB archive); guest/virtio_balloon-mq.patch turns it
into virtio_balloon_mq.c; ``linux-headers-<release>`` with its -common
tree and ``linux-kbuild-<x.y>`` (all ``apt-get download`` + ``dpkg -x``, no
root) build it out of tree with the host gcc.  Nothing of the kernel's
source is kept in the repository.

Cache (``<cache>/balloon-driver/<release>-<key>/``): the .ko and a
manifest; ``key`` hashes the kernel release, the source file, the patch
and the compiler, so the module is built once per kernel.  A user kernel
(``--kernel/--modules``) has no variant: CapabilityMissing says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from host.errors import BadInput, CapabilityMissing
from host.paths import REPO_ROOT, cache_dir
from images import packages

if TYPE_CHECKING:  # only the type: the image builder is not needed here
    from images.build import Image

PATCH = REPO_ROOT / "guest" / "virtio_balloon-mq.patch"
MODULE = "virtio_balloon_mq"
SOURCE_MEMBER = "drivers/virtio/virtio_balloon.c"
FLAVOURS = ("cloud-amd64", "rt-amd64", "amd64")  # Debian's x86-64 kernel flavours
VERSION = "1"  # bump when the build recipe changes


@dataclasses.dataclass(frozen=True)
class Variant:
    ko: Path
    release: str
    kernel_version: str  # the Debian package version, e.g. 6.1.192-3
    source_sha256: str
    patch_sha256: str
    cached: bool = False
    build_s: float = 0.0  # download + extract + build, when built now

    def to_json(self) -> dict[str, object]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def deb_version(deb: Path) -> str:
    """name_version_arch.deb, an epoch's ':' written %3a."""
    return deb.name.split("_")[1].replace("%3a", ":")


def package_names(release: str, version: str) -> dict[str, str]:
    """The Debian packages behind a kernel release (6.1.0-57-amd64) and its
    package version (6.1.192-3)."""
    flavour = next((f for f in FLAVOURS if release.endswith("-" + f)), None)
    abi = release[: -len(flavour) - 1] if flavour else ""
    if not abi or not version[:1].isdigit():
        raise BadInput(f"kernel release {release!r} is not a Debian one (like 6.1.0-57-amd64)")
    xy = ".".join(version.split(".")[:2])
    return {
        "source": f"linux-source-{xy}",
        "headers": f"linux-headers-{release}",
        "common": f"linux-headers-{abi}-common",
        "kbuild": f"linux-kbuild-{xy}",
    }


def extract_source(deb: Path, dest: Path) -> Path:
    """drivers/virtio/virtio_balloon.c out of linux-source's .tar.xz, read
    as a stream: the archive is never unpacked (about 8 s under load)."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
            for member in outer:
                if member.name.endswith(".tar.xz") and "/usr/src/linux-source-" in "/" + member.name.lstrip("./"):
                    inner_file = outer.extractfile(member)
                    assert inner_file is not None
                    with tarfile.open(fileobj=inner_file, mode="r|xz") as inner:
                        for item in inner:
                            if item.isfile() and item.name.split("/", 1)[-1] == SOURCE_MEMBER:
                                data = inner.extractfile(item)
                                assert data is not None
                                dest.write_bytes(data.read())
                                return dest
        raise BadInput(f"{deb.name} holds no {SOURCE_MEMBER}")
    finally:
        proc.kill()
        proc.wait()


def _unpack_headers(debs: list[Path], cache: Path, release: str) -> Path:
    """The three header packages unpacked into one tree (the amd64 headers'
    ``scripts`` link points into linux-kbuild by a relative path)."""
    root = cache / "unpacked" / f"headers-{release}"
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        for deb in debs:
            packages.unpack_deb(deb, staging)
        (staging / ".complete").touch()
        shutil.rmtree(root, ignore_errors=True)
        try:
            os.replace(staging, root)
        except OSError:  # another run put it there first
            if not (root / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def _make(headers: Path, common: Path, workdir: Path) -> None:
    if not shutil.which("make") or not shutil.which("gcc"):
        raise CapabilityMissing("make and gcc are needed to build the balloon driver variant: run ./setup")
    # The headers' Makefile includes the -common tree by its absolute
    # /usr/src path; naming the -common Makefile directly avoids that.
    argv = ["make", "-s", "-C", str(headers), "-f", str(common / "Makefile"), f"M={workdir}", "modules"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not (workdir / f"{MODULE}.ko").exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise BadInput(f"building {MODULE}.ko failed: {' | '.join(tail)}")


def _gcc_version() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise CapabilityMissing("gcc not found: run ./setup (installs gcc)")
    return subprocess.run([gcc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def build(release: str | None = None, force: bool = False) -> Variant:
    """The variant for the Debian kernel ``release`` (default: the image's
    default kernel), built once and cached."""
    started = time.monotonic()
    cache = cache_dir()
    kernel_pkg = packages.resolve_kernel_package(cache)
    if release is not None and kernel_pkg != f"linux-image-{release}":
        kernel_pkg = f"linux-image-{release}"
    release = kernel_pkg.removeprefix("linux-image-")
    version = deb_version(packages.download(kernel_pkg, cache))
    names = package_names(release, version)
    debs = {role: packages.download(name, cache) for role, name in names.items()}
    wrong = {names[r]: deb_version(d) for r, d in debs.items() if deb_version(d) != version}
    if wrong:
        raise CapabilityMissing(
            f"the balloon driver variant needs packages at the image kernel's version {version}; the archive has "
            + ", ".join(f"{n} {v}" for n, v in wrong.items())
        )
    out = cache / "balloon-driver"
    out.mkdir(parents=True, exist_ok=True)
    source = out / f"virtio_balloon.c-{debs['source'].stem}"
    if not source.exists():
        tmp = source.with_name(source.name + f".tmp{os.getpid()}")
        extract_source(debs["source"], tmp)
        os.replace(tmp, source)
    patch = PATCH.read_bytes()
    src_sha, patch_sha = _sha256(source.read_bytes()), _sha256(patch)
    key = _sha256(f"{VERSION}|{release}|{src_sha}|{patch_sha}|{_gcc_version()}".encode())[:16]
    target = out / f"{release}-{key}"
    manifest = target / "manifest.json"
    if manifest.exists() and not force:
        data = json.loads(manifest.read_text())
        return Variant(**{**data, "ko": Path(data["ko"]), "cached": True, "build_s": 0.0})

    tree = _unpack_headers([debs["headers"], debs["common"], debs["kbuild"]], cache, release)
    headers = tree / "usr/src" / names["headers"]
    common = tree / "usr/src" / names["common"]
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=out))
    try:
        c_file = staging / f"{MODULE}.c"
        proc = subprocess.run(
            ["patch", "--no-backup-if-mismatch", "-s", "-o", "-", str(source)], input=patch, capture_output=True
        )
        if proc.returncode != 0:
            raise BadInput(
                f"{PATCH.name} does not apply to {names['source']} {version}: "
                f"{proc.stderr.decode(errors='replace').strip()[:200]}"
            )
        c_file.write_bytes(proc.stdout)
        (staging / "Kbuild").write_text(f"obj-m := {MODULE}.o\n")
        _make(headers, common, staging)
        variant = Variant(target / f"{MODULE}.ko", release, version, src_sha, patch_sha)
        keep = staging / "keep"
        keep.mkdir()
        shutil.copyfile(staging / f"{MODULE}.ko", keep / f"{MODULE}.ko")
        (keep / "manifest.json").write_text(json.dumps(variant.to_json(), indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(keep, target)  # a reader sees the whole entry or none
        except OSError:  # another run built the same entry first
            if not manifest.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dataclasses.replace(variant, build_s=round(time.monotonic() - started, 2))


def for_image(image: Image) -> Variant:
    """The variant for a built image, or CapabilityMissing with the reason."""
    if os.environ.get("MEMQUAL_GUEST_KERNEL"):
        raise CapabilityMissing(
            "the balloon driver variant is built only for Debian's image kernels; a kernel given with "
            "--kernel/--modules has no variant (its build tree would be needed)"
        )
    return build(image.release)


def main() -> int:
    """``python -m images.balloon_driver``: what ./setup runs after the image."""
    from host.errors import MemqualError

    try:
        variant = build()
    except CapabilityMissing as exc:
        print(f"setup: no balloon driver variant ({exc}); the balloon-driver scenario will skip")
        return 0
    except MemqualError as exc:
        print(f"setup: balloon driver variant not built: {exc}")
        return 0
    state = "cached" if variant.cached else f"built in {variant.build_s:.0f} s"
    print(f"balloon driver variant {MODULE}.ko for {variant.release}: {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

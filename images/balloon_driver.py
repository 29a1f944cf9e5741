"""The virtio_balloon variant with a settable request size,
virtio_balloon_mq.ko, built from the guest kernel's own source.

Debian's kernel: the one source file out of linux-source, patched with
guest/virtio_balloon-mq.patch, built against linux-headers and
linux-kbuild (no root).  A user's kernel: the same patch in its build tree
(``--kernel-build``), else CapabilityMissing.  Cached per kernel in
``<cache>/balloon-driver/<release>-<key>/``.  docs/balloon.md,
"images/balloon_driver.py"."""

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

from memqual.host.core import settings
from memqual.host.core.errors import BadInput, CapabilityMissing, MemqualError
from memqual.host.core.paths import cache_dir, shipped
from memqual.host.core.trust import tree_weak_spot, user_owners, weak_spot
from memqual.images import built_kernels, packages
from memqual.images.kernel import check_release

if TYPE_CHECKING:  # only the type: the image builder is not needed here
    from memqual.images.build import Image

PATCH = shipped("guest") / "virtio_balloon-mq.patch"
MODULE = "virtio_balloon_mq"
SOURCE_MEMBER = "drivers/virtio/virtio_balloon.c"
FLAVOURS = ("cloud-amd64", "rt-amd64", "amd64")  # Debian's x86-64 kernel flavours
VERSION = "1"  # bump when the build recipe changes
# What marks a kernel build tree an external module can be built against:
# kbuild's Makefile, the configuration, and the exported symbols' CRCs.
KBUILD_MARKS = ("Makefile", ".config", "Module.symvers")
# The scenario's environment (memqual run --kernel-build; e2e/base.py has
# the kernel's and modules' variables).
ENV_KERNEL = settings.GUEST_KERNEL
ENV_KERNEL_BUILD = settings.GUEST_KERNEL_BUILD


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


def _make(kbuild: list[str], workdir: Path) -> None:
    """``kbuild`` is make's argv up to M=: where the kernel's kbuild is."""
    if not shutil.which("make") or not shutil.which("gcc"):
        raise CapabilityMissing("make and gcc are needed to build the balloon driver variant: run ./setup")
    # BTF for a module needs pahole, which Debian's 6.12 kbuild enables and
    # the host may lack; the module loads the same without it.
    argv = [*kbuild, f"M={workdir}", "CONFIG_DEBUG_INFO_BTF_MODULES=", "modules"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not (workdir / f"{MODULE}.ko").exists():
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        # make's own "Error 2" lines say only that something failed before
        causes = [line for line in lines if "error" in line.lower() and "***" not in line] or lines[-3:]
        raise BadInput(f"building {MODULE}.ko failed: {' | '.join(causes[:3])}")


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
    try:
        # The headers package names its -common tree and its kbuild: read,
        # not assumed (6.1 depends on linux-kbuild-6.1, 6.12 on
        # linux-kbuild-6.12.N+deb12, one per point release).
        needs = packages.depends(names["headers"], version, cache)
        names["common"] = next((n for n in needs if n.startswith("linux-headers-") and n.endswith("-common")), "")
        names["common"] = names["common"] or package_names(release, version)["common"]
        names["kbuild"] = next((n for n in needs if n.startswith("linux-kbuild-")), names["kbuild"])
        # The archive keeps older point releases: take each at the kernel's
        # own version, the candidate only for a kbuild it does not version.
        debs = {role: packages.download(name, cache, version) for role, name in names.items() if role != "kbuild"}
        try:
            debs["kbuild"] = packages.download(names["kbuild"], cache, version)
        except BadInput:
            debs["kbuild"] = packages.download(names["kbuild"], cache)
    except BadInput as exc:
        raise CapabilityMissing(f"the balloon driver variant's packages for {release} {version}: {exc}") from exc
    wrong = {names[r]: deb_version(d) for r, d in debs.items() if r != "kbuild" and deb_version(d) != version}
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
    # The headers' Makefile includes the -common tree by its absolute
    # /usr/src path; naming the -common Makefile directly avoids that.
    kbuild = ["make", "-s", "-C", str(headers), "-f", str(common / "Makefile")]
    variant = Variant(target / f"{MODULE}.ko", release, version, src_sha, patch_sha)
    return _build_into(out, source, kbuild, variant, f"{names['source']} {version}", started)


def _build_into(out: Path, source: Path, kbuild: list[str], variant: Variant, what: str, started: float) -> Variant:
    """Patch ``source``, build it with ``kbuild``, keep the .ko and its
    manifest where ``variant.ko`` says; a patch that does not apply means
    this kernel has no variant."""
    target = variant.ko.parent
    manifest = target / "manifest.json"
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=out))
    try:
        c_file = staging / f"{MODULE}.c"
        proc = subprocess.run(
            ["patch", "--no-backup-if-mismatch", "-s", "-o", "-", str(source)],
            input=PATCH.read_bytes(),
            capture_output=True,
        )
        if proc.returncode != 0:
            raise CapabilityMissing(
                f"{PATCH.name} does not apply to {what}: {proc.stderr.decode(errors='replace').strip()[:200]}"
            )
        c_file.write_bytes(proc.stdout)
        (staging / "Kbuild").write_text(f"obj-m := {MODULE}.o\n")
        _make(kbuild, staging)
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


def check_kernel_build(path: str | os.PathLike[str]) -> Path:
    """A kernel build tree, or BadInput in one line: a directory with
    kbuild's Makefile, the .config and Module.symvers (what ``make``
    leaves where it built the kernel)."""
    tree = Path(path)
    if not tree.is_dir():
        raise BadInput(f"kernel build tree {tree}: no such directory")
    missing = [mark for mark in KBUILD_MARKS if not (tree / mark).is_file()]
    if missing:
        raise BadInput(
            f"{tree} is not a kernel build tree (no {', '.join(missing)}): give the directory the kernel was built in"
        )
    check_tree_owner(tree)
    return tree.resolve()


def tree_owners() -> frozenset[int]:
    """Who may own a kernel tree root builds in (``trust.user_owners``)."""
    return user_owners()


def check_tree_owner(tree: Path) -> None:
    """Refuse (one line) a tree another user could change under ``make``,
    which runs as root and reads (and runs) whatever kbuild finds in it:
    its Makefiles and make fragments, .config and the generated headers,
    scripts, compiled helpers (fixdep, modpost) and gcc plugins; no list of
    those stays complete across kernel versions.  So every file, folder and
    link of the whole tree is checked (``trust.tree_weak_spot``), every folder above
    it up to /, and what each link leading out of it points at, walked the
    same way (an O= build's ``source`` link: its source tree).  Each must
    belong to ``tree_owners`` and be writable by neither group nor others.
    What kbuild writes (the module's own build folder) is memqual's
    private staging folder in the cache."""
    owners = tree_owners()
    problem = weak_spot(tree, owners) or tree_weak_spot(tree, owners)
    if problem is not None:
        raise BadInput(
            f"kernel build tree {tree}: {problem}, so another user could change what make runs as root "
            f"(uids trusted: {', '.join(map(str, sorted(owners)))}): build in a tree of your own, "
            "or chown -R / chmod -R go-w it"
        )


def tree_release(tree: Path) -> str:
    release = tree / "include" / "config" / "kernel.release"
    if not release.is_file():
        raise BadInput(f"kernel build tree {tree}: no include/config/kernel.release (is the kernel built there?)")
    return check_release(release.read_text().strip(), str(release))


def _tree_source(tree: Path) -> Path:
    """The tree's virtio_balloon.c: in the tree, or under the ``source``
    link an ``O=`` build leaves."""
    for base in (tree, tree / "source"):
        if (base / SOURCE_MEMBER).is_file():
            return base / SOURCE_MEMBER
    raise CapabilityMissing(f"kernel build tree {tree} has no {SOURCE_MEMBER} (nor under its source link)")


def _balloon_config(tree: Path) -> None:
    """The variant replaces a loaded virtio_balloon module: a kernel with
    the driver built in (=y) or without it has no place for it."""
    value = "n"
    for line in (tree / ".config").read_text(errors="replace").splitlines():
        if line.startswith("CONFIG_VIRTIO_BALLOON="):
            value = line.split("=", 1)[1].strip()
    if value != "m":
        raise CapabilityMissing(
            f"kernel build tree {tree}: CONFIG_VIRTIO_BALLOON={value}; the variant replaces the virtio_balloon "
            "module, so the kernel needs CONFIG_VIRTIO_BALLOON=m"
        )


def build_from_tree(path: str | os.PathLike[str], release: str | None = None, force: bool = False) -> Variant:
    """The variant for a user's kernel, from its build tree; ``release``
    (the image's) must be the one the tree built."""
    started = time.monotonic()
    tree = check_kernel_build(path)
    built = tree_release(tree)
    if release is not None and built != release:
        raise BadInput(f"kernel build tree {tree} built {built}, but the guest kernel is {release}")
    _balloon_config(tree)
    source = _tree_source(tree)
    src_sha, patch_sha = _sha256(source.read_bytes()), _sha256(PATCH.read_bytes())
    # A module must match the kernel's symbol CRCs: Module.symvers is in the key.
    symvers = _sha256((tree / "Module.symvers").read_bytes())
    key = _sha256(f"{VERSION}|{built}|{src_sha}|{patch_sha}|{symvers}|{_gcc_version()}".encode())[:16]
    out = cache_dir() / "balloon-driver"
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{built}-{key}"
    manifest = target / "manifest.json"
    if manifest.exists() and not force:
        data = json.loads(manifest.read_text())
        return Variant(**{**data, "ko": Path(data["ko"]), "cached": True, "build_s": 0.0})
    variant = Variant(target / f"{MODULE}.ko", built, f"build tree {tree}", src_sha, patch_sha)
    return _build_into(out, source, ["make", "-s", "-C", str(tree)], variant, f"the tree {tree}", started)


def for_image(image: Image) -> Variant:
    """The variant for a built image, or CapabilityMissing with the reason:
    a user's kernel has one only with its build tree."""
    kernel = settings.guest_kernel()
    if kernel and not debian_release_of(Path(kernel)):
        built = built_variant(Path(kernel))
        if built is not None:
            return built
        tree = settings.guest_kernel_build()
        if not tree:
            raise CapabilityMissing(
                "a guest kernel given with --kernel/--modules has the balloon driver variant only with its "
                "build tree: give --kernel-build DIR"
            )
        return build_from_tree(tree, image.release)
    return build(image.release)


def built_variant(kernel: Path) -> Variant | None:
    """The variant ``memqual kernel build`` made beside a kernel it built
    (``<cache>/kernels/NAME/bzImage``; CapabilityMissing with its
    manifest's reason when there is none), or None for a kernel it did not
    build."""
    built = built_kernels.of_bzimage(kernel)
    if built is None:
        return None
    if built.balloon_variant is None:
        raise CapabilityMissing(built.balloon_variant_unavailable or f"{built.name} has no {MODULE}.ko")
    return Variant(
        built.balloon_variant,
        built.release,
        f"built {built.name}",
        built.source_sha256,
        _sha256(PATCH.read_bytes()),
        cached=True,
    )


def debian_release_of(kernel: Path) -> str | None:
    """The release of a kernel memqual unpacked from a Debian package into
    its own cache (what ``--debian-kernel`` hands the scenarios as a
    kernel file), or None for any other kernel.  Such a kernel gets the
    variant built from Debian's source like the default one."""
    unpacked = cache_dir() / "unpacked"
    try:
        rel = kernel.resolve().relative_to(unpacked.resolve())
    except ValueError:
        return None
    parts = rel.parts
    if (
        len(parts) == 3
        and parts[0].startswith("linux-image-")
        and parts[1] == "boot"
        and parts[2].startswith("vmlinuz-")
    ):
        return parts[2].removeprefix("vmlinuz-")
    return None


def tree_variant_or_reason(tree: str | os.PathLike[str], release: str) -> dict[str, str | None]:
    """For ``image build`` and ``boot --kernel-build``: the variant's .ko
    built from the tree, or why there is none (the image works either way)."""
    try:
        return {"balloon_variant": str(build_from_tree(tree, release).ko), "balloon_variant_unavailable": None}
    except CapabilityMissing as exc:
        return {"balloon_variant": None, "balloon_variant_unavailable": str(exc)}


def main() -> int:
    """``python -m memqual.images.balloon_driver``: what ./setup runs after the image."""
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

"""A kernel built elsewhere (a bzImage and its installed modules) made a
kernel of the cache, as ``memqual kernel build``'s are: a private copy
named by its release and the hash of what was copied, so wherever a
built kernel's name or bzImage is accepted (a guest's kernel, a host
under test) this one is too, and two different builds never share a
name.  The copy is hashed, not the files given: what memqual boots is
what it named, whoever can write the originals."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Protocol

from memqual.host.core.errors import BadInput
from memqual.host.core.paths import cache_dir
from memqual.images.built_kernels import BUILT_NAME, BuiltKernel, kernels_dir, listing, of_bzimage
from memqual.images.kernel import read_release
from memqual.images.packages import sha256_file

IMPORTED = "imported"  # a built kernel's compiler when memqual did not compile it
# kbuild's modules_install (and a distribution's package) writes
# modules.order beside the modules' kernel/ folder: a tree without it was
# not installed.
MODULES_INDEX = "modules.order"


class Digest(Protocol):
    """What the copy feeds: a hashlib hash."""

    def update(self, data: bytes, /) -> None: ...


def default_modules(release: str) -> Path:
    """Where ``make modules_install`` puts a release's modules."""
    return Path("/lib/modules") / release


def _check_inputs(bzimage: Path, modules: Path, release: str, config: Path | None) -> None:
    if modules.name != release:
        raise BadInput(
            f"{modules}: the bzImage is {release}, so its modules are lib/modules/{release}; give that directory"
        )
    if not (modules / MODULES_INDEX).is_file():
        raise BadInput(
            f"{modules}: no {MODULES_INDEX}, so not an installed modules tree; run 'make modules_install' "
            "(INSTALL_MOD_PATH=DIR to keep it out of /lib/modules) and give DIR/lib/modules/" + release
        )
    if config is not None and not config.is_file():
        raise BadInput(f"{config}: no such file; give the kernel's .config or leave --config out")


def _copy_tree(source: Path, target: Path, digest: Digest) -> None:
    """The regular files and folders under ``source`` (modules_install's
    ``build`` and ``source`` links point into the build tree and are left),
    each hashed as copied, in a fixed order."""
    target.mkdir(mode=0o755)
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            digest.update(f"d {entry.name}\n".encode())
            _copy_tree(Path(entry.path), target / entry.name, digest)
            digest.update(b"u\n")
        elif stat.S_ISREG(st.st_mode):
            digest.update(f"f {entry.name}\n".encode())
            _copy_file(Path(entry.path), target / entry.name, digest)


def _copy_file(source: Path, target: Path, digest: Digest) -> None:
    # O_NOFOLLOW: a link put in the file's place after the scan is refused.
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as src, open(target, "xb") as dst:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
            dst.write(block)
    os.chmod(target, 0o644)


def import_kernel(
    bzimage: Path, modules: Path | None = None, config: Path | None = None, cache: Path | None = None
) -> BuiltKernel:
    """The cache's kernel for ``bzimage`` with ``modules`` (default
    /lib/modules/RELEASE) and its ``config`` when given; the same files
    imported again find the same entry."""
    if not bzimage.is_file():
        raise BadInput(f"{bzimage}: no such file; give a bzImage (arch/x86/boot/bzImage)")
    release = read_release(bzimage)
    modules = modules or default_modules(release)
    if not modules.is_dir():
        raise BadInput(f"{modules}: no such directory; give the kernel's installed modules with --modules DIR")
    _check_inputs(bzimage, modules, release, config)
    root = kernels_dir(cache)
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=root))
    try:
        digest = hashlib.sha256(b"memqual kernel import 1\n")
        _copy_file(bzimage, staging / "bzImage", digest)
        # The bzImage was read again for the copy: its release is the copy's.
        if read_release(staging / "bzImage") != release:
            raise BadInput(f"{bzimage}: changed while it was copied; import it again")
        digest.update(b"modules\n")
        (staging / "lib" / "modules").mkdir(parents=True)
        _copy_tree(modules, staging / "lib" / "modules" / release, digest)
        if config is not None:
            digest.update(b"config\n")
            _copy_file(config, staging / "config", digest)
        key = digest.hexdigest()[:16]
        name = f"{release}-{key}"
        if not BUILT_NAME.fullmatch(name):
            raise BadInput(f"{bzimage}: release {release!r} cannot name a kernel here; build it with a plainer one")
        target = root / name
        kernel = BuiltKernel(
            name=name,
            release=release,
            directory=target,
            source=f"{IMPORTED} {bzimage.resolve()}",
            source_sha256=key,
            patches=(),
            config_fragments=(),
            compiler=IMPORTED,
            key=key,
            balloon_variant_unavailable="an imported kernel brings no balloon driver variant",
        )
        if (target / "manifest.json").is_file():
            return dataclasses.replace(kernel, cached=True)
        (staging / "manifest.json").write_text(json.dumps(kernel.to_json(), indent=2) + "\n")
        os.chmod(staging, 0o755)
        shutil.rmtree(target, ignore_errors=True)  # a half entry a killed import left
        os.replace(staging, target)
        return kernel
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def kernel_of(bzimage: Path, cache: Path | None = None) -> BuiltKernel:
    """The cache's kernel ``bzimage`` is: a built or imported kernel's own
    bzImage, or a file imported from there whose bytes are still the
    copy's; anything else one BadInput line saying how to make it one."""
    if not bzimage.is_file():
        raise BadInput(
            f"{bzimage}: {'not a file' if bzimage.exists() else 'no such file'}; give a bzImage or a kernel's name"
        )
    # Nothing is made while an argument is checked: no cache of kernels, none here.
    have_kernels = ((cache or cache_dir()) / "kernels").is_dir()
    built = of_bzimage(bzimage, cache) if have_kernels else None
    if built is not None:
        return built
    source = f"{IMPORTED} {bzimage.resolve()}"
    imports = [k for k in listing(cache) if k.source == source] if have_kernels else []
    if not imports:
        raise BadInput(
            f"{bzimage}: a bzImage memqual has not imported; 'memqual kernel import {bzimage}' copies it with its "
            "modules (or 'memqual kernel build SOURCE' builds one)"
        )
    digest = sha256_file(bzimage)
    for kernel in imports:
        if sha256_file(kernel.bzimage) == digest:
            return kernel
    raise BadInput(f"{bzimage}: changed since it was imported; 'memqual kernel import {bzimage}' imports it again")

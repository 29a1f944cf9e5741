"""A kernel built elsewhere (a bzImage and its installed modules) made a
kernel of the cache, as ``memqual kernel build``'s are: a private copy
named by its release and the hash of what was copied, so wherever a
built kernel's name or bzImage is accepted (a guest's kernel, a host
under test) this one is too, and two different builds never share a
name.  The copy is hashed, not the files given: what memqual boots is
what it named, whoever can write the originals."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Protocol

from memqual.host.core.errors import BadInput
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import cache_dir
from memqual.images.built_kernels import BUILT_NAME, BuiltKernel, kernels_dir, listing, of_bzimage
from memqual.images.kernel import read_release
from memqual.images.packages import sha256_file

IMPORTED = "imported"  # a built kernel's compiler when memqual did not compile it
# kbuild's modules_install (and a distribution's package) writes
# modules.order beside the modules' kernel/ folder: a tree without it was
# not installed.
MODULES_INDEX = "modules.order"
IMPORT_LOCK_S = 600.0  # how long an import waits for another to end


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


# Read-only, never through a link, never waiting on a FIFO: a path is
# looked up again between the scan and the open, and another user may
# have changed it meanwhile (memqual runs as root).
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _copy_tree(dir_fd: int, target: Path, digest: Digest) -> None:
    """The regular files and folders of the open folder ``dir_fd``
    (modules_install's ``build`` and ``source`` links point into the
    build tree and are left, as is anything but a file or a folder), each
    hashed as copied, in a fixed order, every name and size in the hash."""
    target.mkdir(mode=0o755)
    for name in sorted(os.listdir(dir_fd)):
        try:
            fd = os.open(name, READ, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):  # a link, a socket: left
                continue
            raise
        try:
            st = os.fstat(fd)
            # Checked on what was opened, not on what a scan saw.
            if stat.S_ISDIR(st.st_mode):
                digest.update(f"d {len(name)}:{name}\n".encode())
                _copy_tree(fd, target / name, digest)
                digest.update(b"u\n")
            elif stat.S_ISREG(st.st_mode):
                digest.update(f"f {len(name)}:{name} {st.st_size}\n".encode())
                _copy_open(fd, st.st_size, target / name, digest)
        finally:
            os.close(fd)


def _copy_open(fd: int, size: int, target: Path, digest: Digest) -> None:
    """The open regular file ``fd`` of ``size`` bytes into ``target``."""
    copied = 0
    with open(target, "xb") as dst:
        for block in iter(lambda: os.read(fd, 1 << 20), b""):
            digest.update(block)
            dst.write(block)
            copied += len(block)
    if copied != size:
        raise BadInput(f"{target.name}: changed while it was copied ({copied} of {size} bytes); import it again")
    os.chmod(target, 0o644)


def _copy_file(source: Path, target: Path, digest: Digest) -> None:
    """The regular file ``source`` (the bzImage, the config) into ``target``,
    its size in the hash before its bytes."""
    fd = os.open(source, READ)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{source}: not a regular file; give the kernel's own file")
        digest.update(f"{st.st_size}\n".encode())
        _copy_open(fd, st.st_size, target, digest)
    finally:
        os.close(fd)


def _resolved(path: Path, what: str) -> Path:
    """``path`` with the links the user gave resolved once (a kernel's
    bzImage is often a link: /vmlinuz); what is below it is read without."""
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise BadInput(f"{path}: no such {what}; give the kernel's own") from None


def import_kernel(
    bzimage: Path, modules: Path | None = None, config: Path | None = None, cache: Path | None = None
) -> BuiltKernel:
    """The cache's kernel for ``bzimage`` with ``modules`` (default
    /lib/modules/RELEASE) and its ``config`` when given; the same files
    imported again find the same entry."""
    bzimage = _resolved(bzimage, "file (arch/x86/boot/bzImage)")
    if not bzimage.is_file():
        raise BadInput(f"{bzimage}: not a file; give a bzImage (arch/x86/boot/bzImage)")
    release = read_release(bzimage)
    given = modules or default_modules(release)
    if not given.is_dir():
        raise BadInput(f"{given}: no such directory; give the kernel's installed modules with --modules DIR")
    modules = _resolved(given, "directory")
    config = _resolved(config, "file") if config is not None else None
    _check_inputs(bzimage, modules, release, config)
    root = kernels_dir(cache)
    # One import at a time: two of the same files would share one entry.
    with file_lock(root / ".import.lock", exclusive=True, deadline_s=IMPORT_LOCK_S, held="another import"):
        return _import(bzimage, modules, release, config, root)


def _import(bzimage: Path, modules: Path, release: str, config: Path | None, root: Path) -> BuiltKernel:
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=root))
    try:
        digest = hashlib.sha256(b"memqual kernel import 2\n")
        _copy_file(bzimage, staging / "bzImage", digest)
        # The bzImage was read again for the copy: its release is the copy's.
        if read_release(staging / "bzImage") != release:
            raise BadInput(f"{bzimage}: changed while it was copied; import it again")
        digest.update(b"modules\n")
        (staging / "lib" / "modules").mkdir(parents=True)
        top = os.open(modules, READ | os.O_DIRECTORY)
        try:
            _copy_tree(top, staging / "lib" / "modules" / release, digest)
        finally:
            os.close(top)
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
            source=f"{IMPORTED} {bzimage}",
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
    same = [k for k in imports if sha256_file(k.bzimage) == digest]
    if not same:
        raise BadInput(f"{bzimage}: changed since it was imported; 'memqual kernel import {bzimage}' imports it again")
    if len(same) > 1:
        names = ", ".join(k.name for k in same)
        raise BadInput(f"{bzimage}: imported with different modules or configs ({names}); give one of those names")
    return same[0]

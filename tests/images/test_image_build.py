"""memqual.images.build: the cache key covers every input, a second build is a
cache hit in well under a second, the base initramfs is reproducible, and
bad kernel inputs are one clear error.  Most tests use a tiny fake kernel
(tests/support/fake_kernel.py); one uses Debian's real kernel package."""

from __future__ import annotations

import shutil
import stat
import subprocess
import time
from pathlib import Path

import fake_kernel
import pytest
from image_tools import needs_host_tools

from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.images import build as build_module
from memqual.images import cpio
from memqual.images.build import Image, KernelSource, build, sha256_file


def key_of(image: Image) -> str:
    return image.directory.name


@needs_host_tools
def test_first_build_then_cache_hit_under_a_second(kernel: KernelSource) -> None:
    first = build(kernel)
    assert not first.cached
    assert first.release == fake_kernel.RELEASE and not first.pvh  # no vmlinux inside a fake
    started = time.monotonic()
    second = build(kernel)
    assert time.monotonic() - started < 1.0
    assert second.cached
    assert (key_of(second), second.initramfs_sha256, second.kernel_sha256) == (
        key_of(first),
        first.initramfs_sha256,
        first.kernel_sha256,
    )


@needs_host_tools
def test_what_the_entry_holds(kernel: KernelSource) -> None:
    image = build(kernel)
    base = (image.directory / "initramfs.cpio").read_bytes()
    initrd = image.initrd.read_bytes()
    assert initrd.startswith(base) and len(initrd) > len(base)  # + the per-image keys archive
    assert sha256_file(image.kernel) == image.kernel_sha256
    assert image.key.stat().st_mode & 0o077 == 0  # the client key is private
    entries = {e.name: e for e in cpio.read(base)}
    assert entries["init"].data == b"/bin/busybox"
    assert entries["etc/rc.memqual"].data == (build_module.GUEST_DIR / "rc.sh").read_bytes()
    assert stat.S_ISCHR(entries["dev/console"].mode)
    assert f"lib/modules/{fake_kernel.RELEASE}/modules.dep" in entries
    assert "usr/sbin/dropbear" in entries
    keys = {e.name for e in cpio.read(initrd[len(base) :])}
    assert "root/.ssh/authorized_keys" in keys
    assert not any("id_ed25519" in name and "host" not in name for name in entries)  # no client key in the guest


@needs_host_tools
def test_same_inputs_same_initramfs_even_when_rebuilt(kernel: KernelSource) -> None:
    first = build(kernel)
    again = build(kernel, force=True)
    assert not again.cached
    assert again.initramfs_sha256 == first.initramfs_sha256
    assert key_of(again) == key_of(first)


@needs_host_tools
def test_changing_the_kernel_changes_the_key(kernel: KernelSource) -> None:
    assert kernel.bzimage is not None
    before = build(kernel)
    kernel.bzimage.write_bytes(fake_kernel.bzimage_bytes(salt=b"patched"))
    after = build(kernel)
    assert not after.cached
    assert key_of(after) != key_of(before)
    assert after.kernel_sha256 != before.kernel_sha256


@needs_host_tools
def test_changing_a_module_changes_the_key(kernel: KernelSource) -> None:
    assert kernel.modules_dir is not None
    before = build(kernel)
    (kernel.modules_dir / "kernel/extra/dummy.ko").write_bytes(b"\0" * 128)
    assert key_of(build(kernel)) != key_of(before)
    (kernel.modules_dir / "kernel/extra/new.ko.xz").write_bytes(b"\0")
    assert len({key_of(before), key_of(build(kernel))}) == 2


@needs_host_tools
def test_changing_a_guest_file_changes_the_key(kernel: KernelSource, tmp_path: Path, monkeypatch) -> None:
    before = build(kernel)
    guest = tmp_path / "guest"
    shutil.copytree(build_module.GUEST_DIR, guest)
    monkeypatch.setattr(build_module, "GUEST_DIR", guest)
    with open(guest / "rc.sh", "a") as rc:
        rc.write("# changed\n")
    after = build(kernel)
    assert key_of(after) != key_of(before)
    base = (after.directory / "initramfs.cpio").read_bytes()
    rc_entry = next(e for e in cpio.read(base) if e.name == "etc/rc.memqual")
    assert rc_entry.data.endswith(b"# changed\n")


@pytest.mark.usefixtures("memqual_cache")
def test_a_kernel_path_that_does_not_exist(tmp_path: Path) -> None:
    try:
        build(KernelSource(tmp_path / "no-such-bzImage", tmp_path))
    except CapabilityMissing:
        pytest.skip("host tools for image builds are missing")
    except BadInput as exc:
        assert "no such kernel file" in str(exc)
    else:
        pytest.fail("a missing kernel file was accepted")


@needs_host_tools
def test_a_file_that_is_not_a_bzimage(kernel: KernelSource, tmp_path: Path) -> None:
    assert kernel.bzimage is not None and kernel.modules_dir is not None
    kernel.bzimage.write_bytes(b"\x7fELF not a bzImage" + bytes(2000))
    with pytest.raises(BadInput, match="not a bzImage"):
        build(kernel)


@needs_host_tools
def test_a_modules_directory_that_does_not_exist(kernel: KernelSource, tmp_path: Path) -> None:
    assert kernel.bzimage is not None
    with pytest.raises(BadInput, match="no such modules directory"):
        build(KernelSource(kernel.bzimage, tmp_path / "nowhere"))


def test_kernel_without_modules_is_refused() -> None:
    with pytest.raises(BadInput, match="give both --kernel BZIMAGE and --modules DIR"):
        KernelSource(Path("/boot/vmlinuz"), None)


@pytest.mark.skipif(
    not (shutil.which("apt-get") and shutil.which("dpkg") and shutil.which("apt-cache")),
    reason="apt-get/apt-cache/dpkg unavailable: the default image comes from Debian packages",
)
@needs_host_tools
def test_debian_kernel_image_is_cached_in_the_user_cache() -> None:
    """The real default image, in the user's cache (the first run downloads
    and builds it; later runs reuse it, as ``memqual image build`` does)."""
    # Checked before the attempt: with the package known to apt, any failure
    # of the build is a failure of memqual, not a missing capability.
    known = subprocess.run(["apt-cache", "show", "linux-image-amd64"], capture_output=True, timeout=60)
    if known.returncode != 0:
        pytest.skip("apt-cache knows no linux-image-amd64 here (run apt-get update)")
    build()
    started = time.monotonic()
    image = build()
    assert time.monotonic() - started < 1.0
    assert image.cached
    assert image.release[0].isdigit()
    assert image.kernel.exists() and image.initrd.exists()
    if image.pvh:
        assert image.kernel.read_bytes()[:4] == b"\x7fELF"

"""Kernels, module trees and kernel build trees from other users, and the
parents of the cache and state directories: root must neither write where
such input says nor trust a directory another user could swap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fake_kernel
import pytest
from other_user import needs_root, nobody_uid

from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT, cache_dir
from memqual.host.core.trust import Untrusted, trusted_dir
from memqual.host.ksm.state import HostState
from memqual.images import balloon_driver as bdrv
from memqual.images import modules
from memqual.images.build import KernelSource, build
from memqual.images.kernel import read_release


# -- the release string of a bzImage ----------------------------------------------
@pytest.mark.parametrize(
    "release", ["6.1.0-57-amd64", "6.12.111+deb12-amd64", "6.9.0-rc1_local~1", fake_kernel.RELEASE, "6.1." + "x" * 60]
)
def test_a_kernel_release_of_kbuilds_form_is_read(tmp_path: Path, release: str) -> None:
    bzimage = tmp_path / "bzImage"
    bzimage.write_bytes(fake_kernel.bzimage_bytes(release))
    assert read_release(bzimage) == release


@pytest.mark.parametrize(
    "release",
    [
        "../../../../tmp/escaped",
        "6.1.0/../../../escaped",
        "6.1..0",
        "6.1.0\x01x",
        "6.1.0\tx",
        "6.1.0-é",
        "6.1." + "x" * 61,  # one more than UTS_RELEASE's 64
        "linux",
        "",
    ],
)
def test_a_kernel_release_that_is_no_release_is_refused(tmp_path: Path, release: str) -> None:
    bzimage = tmp_path / "bzImage"
    bzimage.write_bytes(fake_kernel.bzimage_bytes(release))
    with pytest.raises(BadInput, match="is not a kernel release"):
        read_release(bzimage)


def test_image_build_with_a_release_that_is_a_path_writes_nothing_outside(tmp_path: Path) -> None:
    """The crafted kernel of the review: its release climbs out of the
    image tree.  One line, exit 2, nothing written there nor in the cache."""
    victim_dir = tmp_path / "escaped"
    release = "../../../../../../../../../../.." + str(victim_dir)
    bzimage, _ = fake_kernel.make(tmp_path / "kernel")
    bzimage.write_bytes(fake_kernel.bzimage_bytes(release))
    good_modules = tmp_path / "kernel/lib/modules" / fake_kernel.RELEASE
    cache = tmp_path / "cache"
    env = {**os.environ, "MEMQUAL_CACHE": str(cache)}
    env.pop("MEMQUAL_DEBUG", None)
    out = subprocess.run(
        [sys.executable, "-m", "memqual.host.cli.main", "image", "build", "--kernel", str(bzimage)]
        + ["--modules", str(good_modules)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert not victim_dir.exists()
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "is not a kernel release" in out.stderr
    assert not (cache / "images").exists() or list((cache / "images").iterdir()) == []


# -- paths from modules.dep ---------------------------------------------------------
def _modules_tree(root: Path, dep_line: str) -> Path:
    tree = root / "lib/modules" / fake_kernel.RELEASE
    (tree / "kernel").mkdir(parents=True)
    # virtio_mmio is the one guest driver not built in: its line is staged.
    builtin = [p for p in fake_kernel.BUILTIN if "virtio_mmio" not in p]
    (tree / "modules.builtin").write_text("\n".join(builtin) + "\n")
    (tree / "modules.dep").write_text(dep_line + "\n")
    return tree


@pytest.mark.parametrize("rel", ["../../outside/virtio_mmio.ko", "/ABS/outside/virtio_mmio.ko"])
def test_a_modules_dep_path_out_of_the_tree_is_refused_before_anything_is_written(tmp_path: Path, rel: str) -> None:
    rel = rel.replace("/ABS", str(tmp_path))
    source = _modules_tree(tmp_path / "src", f"{rel}:")
    outside = Path(os.path.normpath(source / rel))
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_bytes(b"\0" * 64)
    dest_root = tmp_path / "stage/root"
    with pytest.raises(BadInput, match="is not a path inside"):
        modules.stage_modules(source, fake_kernel.RELEASE, dest_root)
    assert not dest_root.exists()
    # the same path below the destination: what root would have written
    written = Path(os.path.normpath(dest_root / "lib/modules" / fake_kernel.RELEASE / rel))
    assert rel.startswith("/") or not written.exists()


def test_a_dependency_path_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    source = _modules_tree(tmp_path / "src", "kernel/virtio_mmio.ko: ../../../x/virtio_ring.ko")
    (source / "kernel/virtio_mmio.ko").write_bytes(b"\0" * 64)
    with pytest.raises(BadInput, match="'../../../x/virtio_ring.ko' is not a path inside"):
        modules.stage_modules(source, fake_kernel.RELEASE, tmp_path / "stage/root")
    assert not (tmp_path / "stage").exists()


def test_a_module_reached_through_a_symlink_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    source = _modules_tree(tmp_path / "src", "kernel/drivers/virtio_mmio.ko:")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "virtio_mmio.ko").write_text("not the user's to give\n")
    (source / "kernel/drivers").symlink_to(elsewhere)
    with pytest.raises(BadInput, match="leads outside .* through a symlink"):
        modules.stage_modules(source, fake_kernel.RELEASE, tmp_path / "stage/root")
    assert not (tmp_path / "stage").exists()


def test_a_tree_of_plain_paths_still_stages(tmp_path: Path) -> None:
    source = _modules_tree(tmp_path / "src", "kernel/virtio_mmio.ko:")
    (source / "kernel/virtio_mmio.ko").write_bytes(b"\0" * 64)
    staged = modules.stage_modules(source, fake_kernel.RELEASE, tmp_path / "stage/root")
    assert staged == ["kernel/virtio_mmio.ko"]
    assert (tmp_path / "stage/root/lib/modules" / fake_kernel.RELEASE / "kernel/virtio_mmio.ko").is_file()


def test_a_bad_modules_dep_leaves_no_half_built_image(kernel: KernelSource, memqual_cache: Path) -> None:
    assert kernel.modules_dir is not None
    (kernel.modules_dir / "modules.builtin").write_text("\n".join(fake_kernel.BUILTIN[1:]) + "\n")
    (kernel.modules_dir / "modules.dep").write_text("../../../../virtio_mmio.ko:\n")
    with pytest.raises(BadInput, match="is not a path inside"):
        build(kernel)
    images = memqual_cache / "images"
    assert [p.name for p in images.iterdir() if not p.name.endswith(".lock")] == []


# -- --kernel-build trees -------------------------------------------------------------
def _kbuild_tree(root: Path) -> Path:
    tree = root / "linux"
    (tree / "include/config").mkdir(parents=True)
    (tree / "scripts").mkdir()
    (tree / "Makefile").write_text("# kbuild\n")
    (tree / ".config").write_text("CONFIG_VIRTIO_BALLOON=m\n")
    (tree / "Module.symvers").write_text("")
    (tree / "scripts/Makefile.build").write_text("# kbuild\n")
    (tree / "include/config/kernel.release").write_text("6.9.0-test\n")
    return tree


@pytest.mark.parametrize("part", [".", "Makefile", ".config", "include/config", "scripts/Makefile.build"])
def test_a_kernel_tree_others_may_write_is_refused(tmp_path: Path, part: str) -> None:
    tree = _kbuild_tree(tmp_path)
    os.chmod(tree / part, 0o777 if (tree / part).is_dir() else 0o666)
    with pytest.raises(BadInput, match=r"is writable by others .*another user could change what make runs"):
        bdrv.check_kernel_build(tree)


@needs_root
@pytest.mark.parametrize("part", [".", "Makefile", "include"])
def test_a_kernel_tree_of_another_user_is_refused(tmp_path: Path, part: str, monkeypatch) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)
    tree = _kbuild_tree(tmp_path)
    os.chown(tree / part, nobody_uid(), -1)
    with pytest.raises(BadInput, match=f"belongs to uid {nobody_uid()}"):
        bdrv.check_kernel_build(tree)
    # the user who ran memqual through sudo may own it
    monkeypatch.setenv("SUDO_UID", str(nobody_uid()))
    assert bdrv.check_kernel_build(tree) == tree.resolve()


@needs_root
def test_a_kernel_tree_under_another_users_folder_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    tree = _kbuild_tree(home)
    os.chown(home, nobody_uid(), -1)
    with pytest.raises(BadInput, match=f"{home} belongs to uid"):
        bdrv.check_kernel_build(tree)


def test_an_o_build_source_tree_others_may_write_is_refused(tmp_path: Path) -> None:
    tree = _kbuild_tree(tmp_path / "out")
    source = tmp_path / "src"
    (source / "scripts").mkdir(parents=True)
    (source / "Makefile").write_text("# kbuild\n")
    (tree / "source").symlink_to(source)
    assert bdrv.check_kernel_build(tree) == tree.resolve()
    os.chmod(source / "Makefile", 0o666)
    with pytest.raises(BadInput, match=f"{source / 'Makefile'} is writable by others"):
        bdrv.check_kernel_build(tree)


def test_the_cli_refuses_a_writable_kernel_tree_in_one_line(tmp_path: Path, capsys) -> None:
    from memqual.host.cli import main as cli

    tree = _kbuild_tree(tmp_path)
    os.chmod(tree, 0o777)
    with pytest.raises(SystemExit) as exited:
        cli.main(["image", "build", "--kernel", "K", "--modules", "M", "--kernel-build", str(tree)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writable by others" in err


# -- the parents of the cache and the state directory ---------------------------------
@needs_root
def test_a_cache_under_a_folder_another_user_owns_is_refused(tmp_path: Path, monkeypatch) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    os.chown(dev, nobody_uid(), -1)
    monkeypatch.setenv("MEMQUAL_CACHE", str(dev / "cache"))
    with pytest.raises(Untrusted, match=f"under {dev} belongs to uid {nobody_uid()}"):
        cache_dir()


def test_a_cache_under_a_folder_others_may_write_is_refused(tmp_path: Path, monkeypatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "cache").mkdir(mode=0o700)
    os.chmod(shared, 0o777)  # no sticky bit: anyone may rename cache/
    monkeypatch.setenv("MEMQUAL_CACHE", str(shared / "cache"))
    with pytest.raises(Untrusted, match="is writable by others"):
        cache_dir()


@needs_root
def test_a_symlinked_cache_is_checked_along_its_targets_parents(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    (dev / "cache").mkdir(parents=True, mode=0o700)
    os.chown(dev, nobody_uid(), -1)
    (tmp_path / "link").symlink_to(dev / "cache")
    with pytest.raises(Untrusted, match=f"{dev} belongs to uid"):
        trusted_dir(tmp_path / "link", "cache directory")


def test_a_cache_under_a_root_sticky_folder_like_tmp_is_accepted(tmp_path: Path, monkeypatch) -> None:
    if os.stat("/tmp").st_uid != 0 or not os.stat("/tmp").st_mode & 0o1000:
        pytest.skip("/tmp is not root's sticky directory here")
    assert os.path.realpath(tmp_path).startswith("/tmp/")
    monkeypatch.setenv("MEMQUAL_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"


def test_a_sticky_folder_others_may_write_is_no_cache_itself(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    with pytest.raises(Untrusted, match="writable by others"):
        trusted_dir(sticky, "cache directory")


@needs_root
def test_a_state_dir_under_a_folder_another_user_owns_is_refused(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    (dev / "state").mkdir(parents=True)
    os.chown(dev, nobody_uid(), -1)
    with pytest.raises(Untrusted, match=f"state directory .* lies under {dev} belongs to uid"):
        HostState(dev / "state", tmp_path / "ksm", tmp_path / "thp").check_dir()

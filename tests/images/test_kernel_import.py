"""A kernel built elsewhere made one of the cache's (images/kernel_import.py):
named by what was copied, found again by its name, the cache's bzImage or
the original while unchanged, and accepted where a kernel is given."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import fake_kernel
import pytest

from memqual.host.cli import args as cliargs
from memqual.host.cli import main as cli
from memqual.host.core.errors import BadInput
from memqual.images import built_kernels
from memqual.images.kernel_import import import_kernel, kernel_of


def staged(cache: Path) -> list[str]:
    """What a failed or finished import left beside the kernels."""
    return [p.name for p in (cache / "kernels").iterdir() if p.name.startswith(".")]


def test_an_import_is_a_kernel_by_name_and_by_either_bzimage(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    (modules / "build").symlink_to("/")  # modules_install's link into the tree: not followed
    kernel = import_kernel(bzimage, modules)
    assert kernel.name.startswith(fake_kernel.RELEASE + "-") and not kernel.cached
    assert built_kernels.named(kernel.name) == kernel
    assert (kernel.modules / "kernel/extra/dummy.ko").is_file()
    assert not (kernel.modules / "build").exists()
    assert kernel_of(bzimage).name == kernel_of(kernel.bzimage).name == kernel.name
    assert cliargs.debian_kernel(str(bzimage)) == kernel.name
    assert cliargs.debian_kernel_arm(f"{bzimage}:init_on_free=1") == f"{kernel.name}:init_on_free=1"
    again = import_kernel(bzimage, modules)
    assert (again.name, again.cached) == (kernel.name, True)
    assert staged(memqual_cache) == [".import.lock"]


def test_other_bytes_are_another_kernel(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    first = import_kernel(bzimage, modules)
    (modules / "kernel/extra/dummy.ko").write_bytes(b"\1" * 64)
    assert import_kernel(bzimage, modules).name != first.name
    bzimage.write_bytes(fake_kernel.bzimage_bytes(salt=b"rebuilt"))
    third = import_kernel(bzimage, modules)
    assert third.name not in (first.name,) and kernel_of(bzimage).name == third.name


def test_names_and_sizes_are_hashed_so_moved_bytes_are_another_kernel(tmp_path: Path, memqual_cache: Path) -> None:
    """Bytes moved from a module into the bzImage's end, with the module's
    name as if it were the copy's next record: another kernel, not the
    first's cache entry."""
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    (modules / "a").write_bytes(b"payload")
    first = import_kernel(bzimage, modules)
    (modules / "a").unlink()
    bzimage.write_bytes(bzimage.read_bytes() + b"modules\nf a\npayload")
    assert import_kernel(bzimage, modules).name != first.name


def test_links_fifos_and_odd_files_below_the_modules_are_left(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    secret = tmp_path / "secret"
    secret.write_text("root's")
    (modules / "kernel" / "link.ko").symlink_to(secret)
    (modules / "kernel" / "dir-link").symlink_to(tmp_path)
    os.mkfifo(modules / "kernel" / "fifo")
    kernel = import_kernel(bzimage, modules)
    copied = sorted(p.name for p in kernel.modules.rglob("*"))
    assert "link.ko" not in copied and "dir-link" not in copied and "fifo" not in copied
    assert "dummy.ko" in copied


def test_a_linked_bzimage_is_the_file_it_names(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    link = tmp_path / "vmlinuz"
    link.symlink_to(bzimage)
    kernel = import_kernel(link, modules)
    assert kernel_of(bzimage).name == kernel_of(link).name == kernel.name


def test_one_bzimage_with_two_module_trees_is_named_by_its_user(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    import_kernel(bzimage, modules)
    (modules / "kernel/extra/dummy.ko").write_bytes(b"\1" * 64)
    import_kernel(bzimage, modules)
    with pytest.raises(BadInput, match="imported with different modules or configs"):
        kernel_of(bzimage)


def test_a_failure_after_the_copy_leaves_nothing(tmp_path: Path, memqual_cache: Path) -> None:
    """A release kbuild allows but a cache name does not (an underscore):
    refused once everything was copied, and the copy goes."""
    bzimage, modules = fake_kernel.make(tmp_path / "tree", release="6.1.0_custom")
    with pytest.raises(BadInput, match="cannot name a kernel here"):
        import_kernel(bzimage, modules)
    assert built_kernels.listing() == [] and staged(memqual_cache) == [".import.lock"]


def test_a_bzimage_changed_since_its_import_is_refused(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    import_kernel(bzimage, modules)
    bzimage.write_bytes(fake_kernel.bzimage_bytes(salt=b"rebuilt"))
    with pytest.raises(BadInput, match="changed since it was imported; 'memqual kernel import"):
        kernel_of(bzimage)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda b, m: b.unlink(), "no such file"),
        (lambda b, m: (m / "modules.order").unlink(), "no modules.order, so not an installed modules tree"),
        (lambda b, m: m.rename(m.with_name("6.1.0-other")), "no such directory"),
        (lambda b, m: b.write_bytes(b"\0" * 4096), "not a bzImage"),
    ],
    ids=["no bzImage", "not installed", "no modules", "not a bzImage"],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path: Path, memqual_cache: Path, spoil, message: str) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    spoil(bzimage, modules)
    with pytest.raises(BadInput, match=message):
        import_kernel(bzimage, modules)
    assert built_kernels.listing() == [] and staged(memqual_cache) in ([], [".import.lock"])


def test_modules_of_another_release_are_refused(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, _ = fake_kernel.make(tmp_path / "tree")
    _, other = fake_kernel.make(tmp_path / "other", release="6.12.0-other")
    with pytest.raises(BadInput, match=f"the bzImage is {fake_kernel.RELEASE}, so its modules are lib/modules/"):
        import_kernel(bzimage, other)


def test_a_bzimage_never_imported_says_how(tmp_path: Path, memqual_cache: Path) -> None:
    bzimage, _ = fake_kernel.make(tmp_path / "tree")
    with pytest.raises(argparse.ArgumentTypeError, match=f"'memqual kernel import {bzimage}' copies it"):
        cliargs.debian_kernel_arm(str(bzimage))


def test_the_command(tmp_path: Path, memqual_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "tree")
    assert cli.main(["kernel", "import", str(bzimage), "--modules", str(modules)]) == 0
    (name,) = [k.name for k in built_kernels.listing()]
    assert capsys.readouterr().out.startswith(f"{name}: {fake_kernel.RELEASE} imported {bzimage}")
    assert cli.main(["kernel", "import", str(bzimage), "--modules", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lib/modules/" in err
    assert sorted(os.listdir(memqual_cache / "kernels")) == [".import.lock", name]

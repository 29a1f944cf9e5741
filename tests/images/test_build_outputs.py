"""What root takes back from a kernel build (images/kernel_build.py
``build_outputs``, images/unprivileged.py ``receive``) and what it lets
depmod read of a modules tree (images/modules.py ``checked_tree``): names
on an allow-list, entries under a cap, regular files only."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import fake_kernel
import pytest

from memqual.host.core.errors import BadInput
from memqual.images import kernel_build, modules, unprivileged

RELEASE = "6.1.192-memqual"
TREE = f"lib/modules/{RELEASE}"


def _stream(members: list[tuple[str, bytes]]) -> io.BytesIO:
    """A tar stream as the build user's tar writes one: a name ending in '/'
    is a folder, 'name -> target' a link, anything else a file."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for name, body in members:
            info = tarfile.TarInfo(name.split(" -> ")[0].rstrip("/"))
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
            elif " -> " in name:
                info.type, info.linkname = tarfile.SYMTYPE, name.split(" -> ")[1]
            else:
                info.size = len(body)
            archive.addfile(info, io.BytesIO(body) if info.isreg() else None)
    data.seek(0)
    return data


INSTALLED = [
    ("./", b""),
    ("./bzImage", b"kernel"),
    ("./config", b"CONFIG_X=y\n"),
    ("./virtio_balloon_mq.ko", b"variant"),
    ("./lib/", b""),
    ("./lib/modules/", b""),
    (f"./{TREE}/", b""),
    (f"./{TREE}/modules.order", b"kernel/drivers/x.ko\n"),
    (f"./{TREE}/modules.builtin.modinfo", b""),
    (f"./{TREE}/kernel/drivers/", b""),
    (f"./{TREE}/kernel/drivers/x.ko", b"module"),
    (f"./{TREE}/kernel/fs/y.ko.xz", b"compressed"),
    (f"./{TREE}/build -> /usr/src/linux", b""),
]


def test_what_a_build_installs_comes_back_and_its_links_stay_behind(tmp_path: Path) -> None:
    skipped = unprivileged.receive(_stream(INSTALLED), tmp_path, kernel_build.build_outputs(RELEASE))
    assert skipped == [f"{TREE}/build"]
    assert (tmp_path / TREE / "kernel/drivers/x.ko").read_bytes() == b"module"
    assert (tmp_path / TREE / "kernel/fs/y.ko.xz").is_file() and (tmp_path / "virtio_balloon_mq.ko").is_file()


@pytest.mark.parametrize(
    "extra",
    [
        ("./manifest.json", b"{}"),  # root's own, written after the build
        ("./manifest.json/", b""),  # a folder root would then fail to write it into
        ("./etc/", b""),
        ("./notes.txt", b"x"),
        (f"./{TREE}/kernel/drivers/run.sh", b"#!/bin/sh\n"),
        (f"./{TREE}/kernel/modules.dep", b""),  # an index file below the top
        ("./lib/modules/6.1.0-other/kernel/x.ko", b"another release's"),
    ],
)
def test_a_name_a_build_does_not_make_is_refused_in_one_line(tmp_path: Path, extra: tuple[str, bytes]) -> None:
    with pytest.raises(BadInput, match="which a build does not make: refused$") as refused:
        unprivileged.receive(_stream([*INSTALLED, extra]), tmp_path, kernel_build.build_outputs(RELEASE))
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "manifest.json").exists()


def test_twenty_thousand_modules_are_refused_at_the_cap(tmp_path: Path) -> None:
    """What a hostile patch put into root's cache entry: every name is a
    module's, so only the count stops it, before the cap is passed."""
    many = [(f"./{TREE}/kernel/m{n}.ko", b"") for n in range(20_000)]
    with pytest.raises(BadInput, match=f"more than {modules.MAX_TREE_ENTRIES} files and folders"):
        unprivileged.receive(_stream([*INSTALLED, *many]), tmp_path, kernel_build.build_outputs(RELEASE))
    written = sum(len(files) + len(dirs) for _, dirs, files in os.walk(tmp_path))
    assert written <= modules.MAX_TREE_ENTRIES


def test_the_folders_a_name_implies_count_against_the_cap(tmp_path: Path) -> None:
    outputs = kernel_build.build_outputs(RELEASE)
    deep = "/".join(["d"] * 40)
    small = unprivileged.Outputs(outputs.files, outputs.folders, max_entries=30)
    with pytest.raises(BadInput, match="more than 30 files and folders"):
        unprivileged.receive(_stream([(f"./{TREE}/{deep}/x.ko", b"")]), tmp_path, small)


# ------------------------------------------------------------ what depmod reads


def _built_tree(root: Path) -> Path:
    """A modules tree as a build gives it back (no modules.dep: kbuild's
    depmod is /bin/true), with what depmod must not be given beside the
    modules: a link out to a file of root's, a link to a module, a fifo
    and a file that is no module."""
    tree = root / "lib/modules" / fake_kernel.RELEASE
    (tree / "kernel/drivers").mkdir(parents=True)
    for name in ("virtio_mmio", "virtio_pci", "virtio_net", "virtio_balloon"):
        (tree / f"kernel/drivers/{name}.ko").write_bytes(b"\0" * 64)
    (tree / "modules.order").write_text("kernel/drivers/virtio_mmio.ko\n")
    secret = root / "secret"
    secret.write_text("root's\n")
    (tree / "kernel/drivers/secret.ko").symlink_to(secret)
    (tree / "kernel/drivers/again.ko").symlink_to("virtio_pci.ko")
    os.mkfifo(tree / "kernel/drivers/pipe.ko")
    (tree / "kernel/drivers/run.sh").write_text("#!/bin/sh\n")
    return tree


def test_depmod_reads_only_the_checked_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _built_tree(tmp_path / "built")
    given: list[list[str]] = []

    def depmod(root: Path, release: str) -> None:
        release_dir = root / "lib/modules" / release
        given.append(sorted(str(p.relative_to(release_dir)) for p in release_dir.rglob("*") if not p.is_dir()))
        for path in release_dir.rglob("*"):
            assert path.is_dir() or (path.is_file() and not path.is_symlink())
        deps = "".join(f"{rel}:\n" for rel in given[-1] if rel.endswith(".ko"))
        (release_dir / "modules.dep").write_text(deps)

    monkeypatch.setattr(modules, "depmod", depmod)
    modules.stage_modules(tree, fake_kernel.RELEASE, tmp_path / "stage/root")
    drivers = [f"kernel/drivers/{n}.ko" for n in ("virtio_balloon", "virtio_mmio", "virtio_net", "virtio_pci")]
    assert given[0] == sorted([*drivers, "modules.order"])  # the scratch copy: no link, fifo or script


def test_a_modules_tree_past_the_cap_is_refused_before_depmod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _built_tree(tmp_path / "built")
    monkeypatch.setattr(modules, "MAX_TREE_ENTRIES", 8)
    monkeypatch.setattr(modules, "depmod", lambda root, release: pytest.fail("depmod ran"))
    with pytest.raises(BadInput, match="more than 8 files and folders, not a kernel's modules tree"):
        modules.stage_modules(tree, fake_kernel.RELEASE, tmp_path / "stage/root")


def test_a_modules_dep_naming_no_module_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "lib/modules" / fake_kernel.RELEASE
    (tree / "kernel").mkdir(parents=True)
    (tree / "kernel/virtio_mmio.ko").write_bytes(b"\0" * 64)
    (tree / "kernel/run.sh").write_text("#!/bin/sh\n")
    (tree / "modules.builtin").write_text("\n".join(p for p in fake_kernel.BUILTIN if "virtio_mmio" not in p) + "\n")
    (tree / "modules.dep").write_text("kernel/virtio_mmio.ko: kernel/run.sh\n")  # a dependency that is a script
    with pytest.raises(BadInput, match="'kernel/run.sh' is not a module's name"):
        modules.stage_modules(tree, fake_kernel.RELEASE, tmp_path / "stage/root")

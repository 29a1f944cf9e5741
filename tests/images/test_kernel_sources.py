"""A kernel source folder or repository (images/kernel_sources.py): checked
whole (every entry its owners', none writable by others, no link out of
the tree), and a folder read once, so what is unpacked is what was hashed
for the cache key even when the folder changes between the two."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from other_user import needs_root, nobody_uid

from memqual.host.core.errors import BadInput
from memqual.images import kernel_sources, unprivileged

needs_drop = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="unpacking as the build user needs root and setpriv (util-linux)",
)


def _tree(root: Path) -> Path:
    tree = root / "linux"
    (tree / "init").mkdir(parents=True)
    (tree / "Makefile").write_text("all:\n")
    (tree / "Kconfig").write_text("mainmenu fake\n")
    (tree / "init/main.c").write_text("int main(void) { return 0; }\n")
    return tree


def test_a_world_writable_folder_deep_in_the_tree_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "init/sub").mkdir()
    os.chmod(tree / "init/sub", 0o777)
    with pytest.raises(BadInput, match=r"init/sub is writable by others \(mode 777\): build from a tree of your own"):
        kernel_sources.resolve_source(str(tree), tmp_path / "cache")


def test_a_link_out_of_the_tree_is_refused_even_to_a_file_of_ones_own(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tmp_path / "elsewhere.c").write_text("not in the tree's hash\n")
    (tree / "init/other.c").symlink_to(tmp_path / "elsewhere.c")
    with pytest.raises(BadInput, match=r"init/other.c is a link out of the tree"):
        kernel_sources.resolve_source(str(tree), tmp_path / "cache")


@needs_root
def test_a_link_to_another_users_file_and_a_file_of_theirs_are_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    theirs = tmp_path / "theirs.c"
    theirs.write_text("another user's\n")
    os.chown(theirs, nobody_uid(), nobody_uid())
    (tree / "init/link.c").symlink_to(theirs)
    with pytest.raises(BadInput, match="is a link out of the tree"):
        kernel_sources.resolve_source(str(tree), tmp_path / "cache")
    (tree / "init/link.c").unlink()
    shutil.move(theirs, tree / "init/theirs.c")
    with pytest.raises(BadInput, match=rf"init/theirs.c belongs to uid {nobody_uid()}"):
        kernel_sources.resolve_source(str(tree), tmp_path / "cache")


def test_links_inside_the_tree_and_unread_vcs_folders_pass(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "init/alias.c").symlink_to("main.c")
    (tree / "top").symlink_to(".")
    (tree / ".git/objects").mkdir(parents=True)
    os.chmod(tree / ".git/objects", 0o777)  # tar's --exclude-vcs leaves it out of what is read
    source = kernel_sources.resolve_source(str(tree), tmp_path / "cache")
    assert source.kind == "folder" and len(source.sha256) == 64


def test_a_world_writable_folder_in_a_repositorys_objects_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    assert kernel_sources.resolve_source(f"{tree}@HEAD").kind == "git"
    loose = next(p for p in (tree / ".git/objects").iterdir() if len(p.name) == 2)
    os.chmod(loose, 0o777)  # another user could swap an object git archive reads
    with pytest.raises(BadInput, match=rf"{loose.name} is writable by others"):
        kernel_sources.resolve_source(f"{tree}@HEAD")


@pytest.fixture
def build_folder() -> Iterator[tuple[unprivileged.BuildUser, Path]]:
    """A build user's fresh folder below a root-owned 0711 parent (a test's
    tmp_path is root's 0700)."""
    outer = Path(tempfile.mkdtemp(prefix="mq-sources-test-", dir="/tmp"))
    os.chmod(outer, 0o711)
    user = unprivileged.build_user()
    parent = unprivileged.build_parent(outer / "kbuild")
    folder = unprivileged.fresh_folder(parent, user, "work-test")
    yield user, folder
    unprivileged.remove_folder(user, folder)
    shutil.rmtree(outer)


@needs_drop
def test_a_folder_is_read_once_what_is_unpacked_is_what_was_hashed(
    tmp_path: Path, build_folder: tuple[unprivileged.BuildUser, Path]
) -> None:
    """The folder changes after its hash was taken (the cache key) and
    before it is unpacked: the build gets the content the key names."""
    user, folder = build_folder
    tree = _tree(tmp_path)
    source = kernel_sources.resolve_source(str(tree), tmp_path / "cache")
    (tree / "init/main.c").write_text("int main(void) { return 1; } /* after the hash */\n")
    (tree / "init/new.c").write_text("added after the hash\n")
    kernel_sources.unpack(source, user, folder)
    unpacked = folder / "linux"
    assert (unpacked / "init/main.c").read_text() == "int main(void) { return 0; }\n"
    assert not (unpacked / "init/new.c").exists()
    # and again from the start: a base and its patched build unpack one source
    unprivileged.run(user, ["rm", "-rf", "linux"], folder, folder / "home")
    kernel_sources.unpack(source, user, folder)
    assert (unpacked / "init/main.c").read_text() == "int main(void) { return 0; }\n"
    assert kernel_sources.resolve_source(str(tree), tmp_path / "cache").sha256 != source.sha256

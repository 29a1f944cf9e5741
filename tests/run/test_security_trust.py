"""What root runs, loads or writes must be out of every other user's reach:
a kernel tree checked whole (kbuild reads far more than any list), a QEMU
given by path and the test files Avocado imports, trusted folders checked
before anything is made in them and never through another user's link,
output folders checked up to /, and writers that never follow a link.

Ownership tests chown to ``nobody`` and so need root (memqual's lab case)."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest
from other_user import needs_root, nobody_uid
from rich.console import Console

from memqual.host.core import paths
from memqual.host.core.errors import BadInput
from memqual.host.core.trust import Untrusted, check_output_dir, trusted_dir
from memqual.images import balloon_driver as bdrv

VICTIM_TEXT = "root's file, not to be overwritten\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    victim.chmod(0o600)
    return victim


# -- 1. a --kernel-build tree is checked whole ------------------------------------------
def _kbuild_tree(root: Path) -> Path:
    tree = root / "linux"
    for folder in ("include/config", "scripts/gcc-plugins", "arch/x86"):
        (tree / folder).mkdir(parents=True)
    (tree / "Makefile").write_text("include scripts/Makefile.compiler\n")
    (tree / ".config").write_text("CONFIG_VIRTIO_BALLOON=m\n")
    (tree / "Module.symvers").write_text("")
    (tree / "scripts/Makefile.compiler").write_text("# kbuild\n")
    (tree / "scripts/subarch.include").write_text("# kbuild\n")
    (tree / "scripts/check-local-export").write_text("#!/bin/sh\n")
    (tree / "scripts/gcc-plugins/stackleak_plugin.so").write_bytes(b"\x7fELF")
    (tree / "include/config/kernel.release").write_text("6.9.0-test\n")
    return tree


@pytest.mark.parametrize(
    "part",
    [
        "scripts/Makefile.compiler",
        "scripts/subarch.include",
        "scripts/check-local-export",
        "scripts/gcc-plugins/stackleak_plugin.so",
        "scripts/gcc-plugins",
        "arch/x86",
    ],
)
def test_any_file_or_folder_of_a_kernel_tree_others_may_write_is_refused(tmp_path: Path, part: str) -> None:
    tree = _kbuild_tree(tmp_path)
    assert bdrv.check_kernel_build(tree) == tree.resolve()
    os.chmod(tree / part, 0o777 if (tree / part).is_dir() else 0o666)
    with pytest.raises(BadInput, match=f"{tree / part} is writable by others .*another user could change what make"):
        bdrv.check_kernel_build(tree)


@needs_root
def test_a_make_fragment_of_another_user_in_a_kernel_tree_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)
    tree = _kbuild_tree(tmp_path)
    os.chown(tree / "scripts/Makefile.compiler", nobody_uid(), -1)  # mode 644: only its owner writes it
    with pytest.raises(BadInput, match=f"Makefile.compiler belongs to uid {nobody_uid()}"):
        bdrv.check_kernel_build(tree)


def test_a_link_out_of_a_kernel_tree_is_checked_at_its_target(tmp_path: Path) -> None:
    tree = _kbuild_tree(tmp_path / "out")
    shared = tmp_path / "shared"
    (shared / "scripts").mkdir(parents=True)
    (shared / "scripts/Makefile.extrawarn").write_text("# kbuild\n")
    (tree / "scripts/Makefile.extrawarn").symlink_to(shared / "scripts/Makefile.extrawarn")
    (tree / "source").symlink_to(shared)
    assert bdrv.check_kernel_build(tree) == tree.resolve()
    os.chmod(shared / "scripts", 0o777)  # anyone may replace the fragment the link names
    with pytest.raises(BadInput, match=f"{shared / 'scripts'} is writable by others"):
        bdrv.check_kernel_build(tree)


def test_a_dangling_link_counts_by_the_folder_its_target_would_be_made_in(tmp_path: Path) -> None:
    tree = _kbuild_tree(tmp_path / "out")
    drop = tmp_path / "drop"
    drop.mkdir()
    (tree / "scripts/Makefile.gcc-plugins").symlink_to(drop / "not-yet")
    assert bdrv.check_kernel_build(tree) == tree.resolve()
    os.chmod(drop, 0o777)
    with pytest.raises(BadInput, match=f"leads to {drop / 'not-yet'}, and {drop} is writable by others"):
        bdrv.check_kernel_build(tree)


# -- 2. programs and test files memqual runs or loads ------------------------------------
def _program(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    qemu = folder / "qemu-system-x86_64"
    qemu.write_text("#!/bin/sh\necho 'QEMU emulator version 9.9.9'\n")
    qemu.chmod(0o755)
    return qemu


@needs_root
def test_a_qemu_of_another_user_given_by_path_is_refused_before_it_runs(tmp_path: Path, monkeypatch) -> None:
    from memqual.host.core import qemu_binary

    monkeypatch.delenv("SUDO_UID", raising=False)
    qemu = _program(tmp_path / "build")
    ran = tmp_path / "ran"
    qemu.write_text(f"#!/bin/sh\ntouch {ran}\necho 'QEMU emulator version 9.9.9'\n")
    assert qemu_binary.resolve(str(qemu), tmp_path / "cache").version == "9.9.9"
    ran.unlink()
    qemu_binary._version_of.cache_clear()
    os.chown(qemu, nobody_uid(), -1)
    with pytest.raises(Untrusted, match=f"--qemu {qemu}: {qemu} belongs to uid {nobody_uid()}"):
        qemu_binary.resolve(str(qemu), tmp_path / "cache")
    assert not ran.exists()  # never run


def test_a_qemu_in_a_folder_others_may_write_is_refused(tmp_path: Path, monkeypatch) -> None:
    from memqual.host.core import qemu_binary, settings

    qemu = _program(tmp_path / "build")
    (tmp_path / "build" / "pc-bios").mkdir()
    os.chmod(tmp_path / "build" / "pc-bios", 0o777)  # beside the binary: what it loads
    with pytest.raises(Untrusted, match="pc-bios is writable by others"):
        qemu_binary.resolve(str(qemu), tmp_path / "cache")
    monkeypatch.setenv(settings.QEMU, str(qemu))
    with pytest.raises(Untrusted, match="pc-bios is writable by others"):
        qemu_binary.current()


@pytest.mark.parametrize("as_file", [False, True])
def test_tests_others_may_write_are_refused_before_avocado_imports_them(tmp_path: Path, as_file: bool) -> None:
    from memqual.host.cli import run as run_command
    from memqual.host.cli.command import parser_for

    tests = tmp_path / "e2e"
    tests.mkdir()
    (tests / "test_x.py").write_text("# a test\n")
    (tests / "base.py").write_text("# what the test imports\n")
    given = tests / "test_x.py" if as_file else tests
    parser = parser_for(run_command.COMMAND)
    args = parser.parse_args(["run", "--output", str(tmp_path / "out"), "--tests", str(given)])
    assert run_command.config_from_args(args).tests == given
    os.chmod(tests / "base.py", 0o666)
    with pytest.raises(Untrusted, match=r"--tests .*base.py is writable by others"):
        run_command.config_from_args(args)


# -- 3. trusted folders: checked first, the last entry lstat'ed, no group's sticky folder --
@needs_root
def test_nothing_is_made_under_another_users_folder(tmp_path: Path) -> None:
    bob = tmp_path / "bobown"
    bob.mkdir()
    os.chown(bob, nobody_uid(), -1)
    with pytest.raises(Untrusted, match=f"would be made under {bob} belongs to uid"):
        trusted_dir(bob / "sub" / "cache", "cache directory")
    assert list(bob.iterdir()) == []  # nothing created, then refused


@needs_root
def test_another_users_link_in_a_sticky_folder_is_refused(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = sticky / "cache"
    link.symlink_to(mine)
    assert trusted_dir(link, "cache directory") == link  # our own link: followed, its target checked
    os.lchown(link, nobody_uid(), -1)  # its owner could remove it and point a new one elsewhere
    with pytest.raises(Untrusted, match=f"is a link of uid {nobody_uid()}"):
        trusted_dir(link, "cache directory")


def test_a_sticky_folder_a_group_may_write_counts_only_when_the_group_is_roots(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    (sticky / "cache").mkdir(parents=True, mode=0o700)
    os.chmod(sticky, 0o1770)
    if os.geteuid() != 0:
        pytest.skip("a root-owned sticky folder needs root")
    os.chown(sticky, 0, 0)
    assert trusted_dir(sticky / "cache", "cache directory") == sticky / "cache"
    os.chown(sticky, 0, nobody_uid())  # a group of others: protected_symlinks does not cover it
    with pytest.raises(Untrusted, match=f"{sticky} is writable by others"):
        trusted_dir(sticky / "cache", "cache directory")


# -- 4. output folders checked to /, writers that follow no link ---------------------------
@needs_root
def test_another_users_link_as_an_output_folder_is_refused(tmp_path: Path) -> None:
    bob = tmp_path / "bob"
    bob.mkdir()
    os.chmod(bob, 0o1777)
    root_folder = tmp_path / "rootonly"
    root_folder.mkdir(mode=0o700)
    (bob / "out").symlink_to(root_folder)
    os.lchown(bob / "out", nobody_uid(), -1)
    with pytest.raises(Untrusted, match=f"{bob / 'out'} is a link of uid {nobody_uid()}"):
        check_output_dir(bob / "out", "--html")


@needs_root
def test_an_output_folder_inside_another_users_folder_is_refused(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    (lab / "run").mkdir(parents=True)
    os.chmod(lab / "run", 0o755)
    os.chown(lab, nobody_uid(), -1)  # nobody may rename run/ and put their own in its place
    with pytest.raises(Untrusted, match=f"{lab} belongs to uid {nobody_uid()}"):
        check_output_dir(lab / "run", "output folder")
    with pytest.raises(Untrusted, match=f"{lab} belongs to uid {nobody_uid()}"):
        check_output_dir(lab / "run" / "new" / "deeper", "output folder")


def test_an_output_folder_under_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "run").mkdir(parents=True)
    os.chmod(shared, 0o777)
    with pytest.raises(Untrusted, match=f"{shared} is writable by others"):
        check_output_dir(shared / "run", "output folder")


def test_a_streamed_log_is_never_written_through_a_link(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    log = tmp_path / "avocado-stdout.log"
    log.symlink_to(victim)
    with pytest.raises(BadInput, match="is a link"):
        paths.open_nofollow(log)
    with pytest.raises(BadInput, match="is a link"):
        paths.open_nofollow(log, append=True)
    assert victim.read_text() == VICTIM_TEXT
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="not a regular file"):
        paths.open_nofollow(fifo)  # neither blocks nor is taken for a log


def test_the_avocado_logs_are_never_written_through_a_link(tmp_path: Path, monkeypatch) -> None:
    from memqual.host.run import avocado
    from memqual.host.run.config import RunConfig

    victim = _victim(tmp_path)
    results = tmp_path / "out" / "avocado"
    results.mkdir(parents=True)
    (results / "avocado-stdout.log").symlink_to(victim)
    monkeypatch.setattr(avocado.jobevents, "check_plugin", lambda: None)
    config = RunConfig(output=tmp_path / "out", profile="quick", only=(), tests=tmp_path)
    with pytest.raises(BadInput, match="is a link"):
        avocado.run_avocado(config, results, None, Console(file=open(os.devnull, "w")))
    assert victim.read_text() == VICTIM_TEXT


def test_the_bisect_log_is_never_appended_through_a_link(tmp_path: Path) -> None:
    from memqual.host.run.bisect import run, series

    victim = _victim(tmp_path)
    out = tmp_path / "bisect"
    out.mkdir()
    (out / "bisect.log").symlink_to(victim)
    kernels = tuple(series.KernelSpec("6.1.0-57-amd64", f"memqual.k={i}") for i in range(3))
    b = run.Bisector(run.Settings(kernels=kernels, metric="deflate_s"), out, lambda *a: ([], "", 0, None))
    with pytest.raises(BadInput, match="is a link"):
        b._log("# a line")
    assert victim.read_text() == VICTIM_TEXT


def test_the_variants_file_of_a_block_job_is_never_written_through_a_link(tmp_path: Path, monkeypatch) -> None:
    from memqual.host.run import block_jobs
    from memqual.host.run.config import RunConfig

    victim = _victim(tmp_path)
    (tmp_path / "out" / "variants").mkdir(parents=True)
    (tmp_path / "out" / "variants" / "job-1.json").symlink_to(victim)
    seen: dict[str, Path] = {}
    monkeypatch.setattr(
        block_jobs, "run_avocado", lambda config, *a, **k: seen.setdefault("file", config.variants_file)
    )
    config = RunConfig(output=tmp_path / "out", profile="ab", only=(), tests=tmp_path)
    block_jobs.run_block_job(config, {}, [], 1, Console(file=io.StringIO()))
    assert victim.read_text() == VICTIM_TEXT
    assert not seen["file"].is_symlink() and seen["file"].read_text() == "[]\n"


def test_the_balloon_png_is_never_written_through_a_link(tmp_path: Path) -> None:
    from request_size_records import request_size_records as _records

    from memqual.host.report import balloon_curve as plot

    victim = _victim(tmp_path)
    target = tmp_path / "curve.png"
    target.symlink_to(victim)
    assert plot.write_png(_records(), str(target)) == 1
    assert victim.read_text() == VICTIM_TEXT
    assert not target.is_symlink() and target.read_bytes().startswith(b"\x89PNG")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_an_avocado_others_may_write_is_refused_before_it_runs(tmp_path: Path, monkeypatch) -> None:
    from memqual.host.core import settings
    from memqual.host.run import avocado

    fake = _program(tmp_path / "bin")
    monkeypatch.setenv(settings.AVOCADO, str(fake))
    assert avocado.avocado_executable() == [str(fake)]
    os.chmod(fake, 0o757)
    with pytest.raises(Untrusted, match="MEMQUAL_AVOCADO .* is writable by others"):
        avocado.avocado_executable()

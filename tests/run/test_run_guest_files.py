"""``memqual run --guest-kernel FILE``: a file that is no kernel (or modules
that are no modules tree) is one line and exit 2 before the job starts,
with nothing written; a real bzImage header and modules tree get through."""

from __future__ import annotations

import shutil
from pathlib import Path

import fake_kernel
import pytest

from memqual.host.cli import main as cli
from memqual.host.run import job as runjob


def _must_not_run(*args, **kwargs):
    raise AssertionError("the job started despite a bad guest kernel")


def _memqual_run(tmp_path: Path, kernel: str, modules: Path) -> int:
    (tmp_path / "e2e").mkdir(exist_ok=True)
    return cli.main(
        [
            "run",
            "--tests",
            str(tmp_path / "e2e"),
            "--output",
            str(tmp_path / "out"),
            "--guest-kernel",
            kernel,
            "--guest-modules",
            str(modules),
        ]
    )


def _text_file(tmp_path: Path) -> str:
    path = tmp_path / "notes.txt"
    path.write_text("not a kernel\n" * 100)
    return str(path)


def _elf_that_is_no_kernel(tmp_path: Path) -> str:
    elf = shutil.which("true") or "/bin/true"
    assert Path(elf).read_bytes()[:4] == b"\x7fELF"
    return elf


def _vmlinux_without_setup_header(tmp_path: Path) -> str:
    # An ELF where the bzImage's setup header would be: memqual's image
    # build boots the bzImage itself (it extracts the vmlinux), so refuses it.
    path = tmp_path / "vmlinux"
    path.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(0x1000))
    return str(path)


@pytest.mark.parametrize(
    "kernel, message",
    [
        (_text_file, "not a bzImage"),
        (_elf_that_is_no_kernel, "not a bzImage"),
        (_vmlinux_without_setup_header, "not a bzImage"),
        (lambda _: "/dev/zero", "not a regular file"),
    ],
)
def test_a_file_that_is_no_kernel_is_one_line_and_exit_2_before_the_job(tmp_path, monkeypatch, capsys, kernel, message):
    monkeypatch.setattr(runjob, "run", _must_not_run)
    monkeypatch.setattr(runjob, "run_avocado", _must_not_run)
    _, modules = fake_kernel.make(tmp_path / "k")
    assert _memqual_run(tmp_path, kernel(tmp_path), modules) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "--guest-kernel" in err[0]
    assert "give a bzImage" in err[0] or "pass a bzImage" in err[0]  # says what to do
    assert not (tmp_path / "out").exists()


def test_modules_that_are_no_modules_tree_are_refused_before_the_job(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runjob, "run", _must_not_run)
    bzimage, _ = fake_kernel.make(tmp_path / "k")
    (tmp_path / "empty").mkdir()
    assert _memqual_run(tmp_path, str(bzimage), tmp_path / "empty") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--guest-modules" in err[0] and "no kernel modules tree" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_kernel_with_a_setup_header_and_its_modules_reach_the_job(tmp_path, monkeypatch):
    started = []

    def run(config):
        started.append(config)
        return 0

    monkeypatch.setattr(runjob, "run", run)
    bzimage, modules = fake_kernel.make(tmp_path / "k")
    assert _memqual_run(tmp_path, str(bzimage), modules) == 0
    assert [k.bzimage for k in started[0].kernels] == [bzimage.resolve()]

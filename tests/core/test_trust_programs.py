"""Every accessor of a program memqual runs as root checks it itself
(host/core/trust.py ``program``): a binary another user owns, one in a
folder others may write, or reached through another user's link is refused
in one line, and never run; one of root's own is taken.  The callers that
used to reach an unchecked QEMU (doctor, the probes) run none.

Ownership tests chown to ``nobody`` and so need root (memqual's lab case)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from other_user import needs_root, nobody_uid

from memqual.host.core import probe, qemu, qemu_binary, settings
from memqual.host.core.errors import BadInput
from memqual.host.run import avocado

pytestmark = needs_root

FAKE = """#!/bin/sh
echo ran >> {marker}
echo "QEMU emulator version 9.9.9"
"""


def _program(folder: Path, name: str, marker: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / name
    program.write_text(FAKE.format(marker=marker))
    program.chmod(0o755)
    return program


def _untrusted(kind: str, tmp_path: Path, name: str, marker: Path) -> Path:
    """A program of ``kind``, named ``name``, that appends to ``marker`` when run."""
    if kind == "another user's":
        program = _program(tmp_path / "bin", name, marker)
        os.chown(program, nobody_uid(), -1)
        return program
    if kind == "in a folder others may write":
        program = _program(tmp_path / "bin", name, marker)
        os.chmod(program.parent, 0o777)
        return program
    if kind == "another user's link":
        program = _program(tmp_path / "real", name, marker)
        (tmp_path / "bin").mkdir()
        link = tmp_path / "bin" / name
        link.symlink_to(program)
        os.lchown(link, nobody_uid(), -1)
        return link
    assert kind == "root's own"
    return _program(tmp_path / "bin", name, marker)


def _qemu_env(monkeypatch: pytest.MonkeyPatch, program: Path) -> Callable[[], object]:
    monkeypatch.setenv(settings.QEMU, str(program))
    return qemu.qemu_binary


def _qemu_current(monkeypatch: pytest.MonkeyPatch, program: Path) -> Callable[[], object]:
    monkeypatch.setenv(settings.QEMU, str(program))
    return qemu_binary.current


def _qemu_path(monkeypatch: pytest.MonkeyPatch, program: Path) -> Callable[[], object]:
    monkeypatch.delenv(settings.QEMU, raising=False)
    monkeypatch.setenv("PATH", f"{program.parent}:{os.environ['PATH']}")
    return qemu.qemu_binary


def _qemu_option(monkeypatch: pytest.MonkeyPatch, program: Path) -> Callable[[], object]:
    return lambda: qemu_binary.resolve(str(program), program.parent / "cache")


def _avocado(monkeypatch: pytest.MonkeyPatch, program: Path) -> Callable[[], object]:
    monkeypatch.setenv(settings.AVOCADO, str(program))
    return avocado.avocado_executable


# Every way memqual is told which program to run, by the accessor that hands it out.
ACCESSORS: dict[str, tuple[str, Callable[[pytest.MonkeyPatch, Path], Callable[[], object]]]] = {
    "$MEMQUAL_QEMU (qemu.qemu_binary)": ("qemu-system-x86_64", _qemu_env),
    "$MEMQUAL_QEMU (qemu_binary.current)": ("qemu-system-x86_64", _qemu_current),
    "qemu-system-x86_64 on PATH": ("qemu-system-x86_64", _qemu_path),
    "--qemu PATH": ("qemu-system-x86_64", _qemu_option),
    "$MEMQUAL_AVOCADO": ("avocado", _avocado),
}
KINDS = ("another user's", "in a folder others may write", "another user's link")


@pytest.fixture(autouse=True)
def _fresh_versions() -> None:
    qemu_binary._version_of.cache_clear()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("accessor", sorted(ACCESSORS))
def test_an_untrusted_program_is_refused_by_its_accessor_and_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accessor: str, kind: str
) -> None:
    name, given = ACCESSORS[accessor]
    marker = tmp_path / "ran"
    get = given(monkeypatch, _untrusted(kind, tmp_path, name, marker))
    with pytest.raises(BadInput) as caught:
        get()
    assert "\n" not in str(caught.value)
    assert not marker.exists()


@pytest.mark.parametrize("accessor", sorted(ACCESSORS))
def test_roots_own_program_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accessor: str) -> None:
    name, given = ACCESSORS[accessor]
    get = given(monkeypatch, _untrusted("root's own", tmp_path, name, tmp_path / "ran"))
    get()


@pytest.mark.parametrize("kind", KINDS)
def test_the_probes_run_no_untrusted_qemu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """doctor's report and the environment (recorded by every test, and a
    lab host's probe answer) asked QEMU its version before anything checked it."""
    marker = tmp_path / "ran"
    monkeypatch.setenv(settings.QEMU, str(_untrusted(kind, tmp_path, "qemu-system-x86_64", marker)))
    monkeypatch.setenv(settings.CACHE, str(tmp_path / "cache"))
    assert probe.environment().qemu is None
    found = probe.capabilities().to_json()
    assert found["qemu_version"] == "missing" and "not probed" in found["kvm_boot_detail"]
    assert not marker.exists()

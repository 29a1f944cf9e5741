"""The commands that reached an unchecked ``$MEMQUAL_QEMU`` run none that
another user could change: ``memqual balloon measure`` stops in one line
(exit 2) before anything is built, ``memqual doctor`` reports it missing
and asks it nothing.

Ownership tests chown to ``nobody`` and so need root (memqual's lab case)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from other_user import needs_root, nobody_uid

from memqual.host.cli import main as cli
from memqual.host.core import settings

pytestmark = needs_root


def _foreign_qemu(tmp_path: Path, marker: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    qemu = folder / "qemu-system-x86_64"
    qemu.write_text(f'#!/bin/sh\necho ran >> {marker}\necho "QEMU emulator version 9.9.9"\n')
    qemu.chmod(0o755)
    os.chown(qemu, nobody_uid(), -1)
    return qemu


@pytest.fixture
def foreign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    marker = tmp_path / "ran"
    monkeypatch.setenv(settings.QEMU, str(_foreign_qemu(tmp_path, marker)))
    monkeypatch.setenv(settings.CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv(settings.STATE_DIR, str(tmp_path / "state"))
    monkeypatch.delenv(settings.DEBUG, raising=False)
    return marker


def test_balloon_measure_refuses_it_before_building_anything(
    foreign: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memqual.images import build

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("an image was built for an untrusted QEMU")

    monkeypatch.setattr(build, "build", no_build)
    status = cli.main(["balloon", "measure", "--target", "256", "--memory", "512", "--repeats", "1"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and f"belongs to uid {nobody_uid()}" in err
    assert not foreign.exists()


def test_doctor_asks_it_nothing(foreign: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["qemu_version"] == "missing"
    assert f"belongs to uid {nobody_uid()}" in report["kvm_boot_detail"]
    assert not foreign.exists()

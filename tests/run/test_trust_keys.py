"""A hosts file's ``key`` and ``known_hosts``, given or by default, go
through host/core/trust.py: another user's file, one in a folder others
may write, or another user's link to a good one is refused in one line
(whoever could change known_hosts could stand in for a lab host).

Ownership tests chown to ``nobody`` and so need root (memqual's lab case)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from other_user import needs_root, nobody_uid

from memqual.host.core.errors import BadInput
from memqual.host.run.hosts import config

pytestmark = needs_root

CONTENT = {"key": "not a real key\n", "known_hosts": "10.0.0.1 ssh-ed25519 AAAA\n"}
DEFAULT_NAME = {"key": "id_ed25519", "known_hosts": "known_hosts"}


def _file(folder: Path, name: str, field: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(CONTENT[field])
    path.chmod(0o600)
    return path


def _place(kind: str, folder: Path, name: str, field: str) -> None:
    """``folder/name`` as a file of ``kind``."""
    if kind == "another user's":
        os.chown(_file(folder, name, field), nobody_uid(), -1)
    elif kind == "in a folder others may write":
        _file(folder, name, field)
        os.chmod(folder, 0o777)
    elif kind == "another user's link":
        real = _file(folder.parent / "real", name, field)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(real)
        os.lchown(folder / name, nobody_uid(), -1)
    else:
        assert kind == "yours"
        _file(folder, name, field)


def _hosts_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, given: bool, kind: str) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    lines = ['[[host]]\nname = "lab1"\naddress = "10.0.0.1"\n']
    for each in ("key", "known_hosts"):
        if each == field and not given:
            _place(kind, home / ".ssh", DEFAULT_NAME[each], each)
            continue
        folder = tmp_path / f"given-{each}"
        if each == field:
            _place(kind, folder, each, each)
        else:
            _file(folder, each, each)
        lines.append(f'{each} = "{folder / each}"\n')
    path = tmp_path / "hosts.toml"
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("kind", ["another user's", "in a folder others may write", "another user's link"])
@pytest.mark.parametrize("given", [True, False], ids=["given", "default"])
@pytest.mark.parametrize("field", ["key", "known_hosts"])
def test_a_key_or_known_hosts_others_could_change_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, given: bool, kind: str
) -> None:
    path = _hosts_file(tmp_path, monkeypatch, field, given, kind)
    with pytest.raises(BadInput) as caught:
        config.load(path)
    assert "\n" not in str(caught.value)
    assert f"host 'lab1': {field}" in str(caught.value)


@pytest.mark.parametrize("given", [True, False], ids=["given", "default"])
@pytest.mark.parametrize("field", ["key", "known_hosts"])
def test_your_own_key_and_known_hosts_are_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, given: bool
) -> None:
    (host,) = config.load(_hosts_file(tmp_path, monkeypatch, field, given, "yours"))
    assert getattr(host, field).read_text() == CONTENT[field]

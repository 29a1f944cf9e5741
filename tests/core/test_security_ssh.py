"""The guest's SSH host key is pinned: a server on the forwarded port that
shows another key is refused, the image's own key is accepted.  The server
is paramiko's own (ServerInterface) on 127.0.0.1, running ``echo``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from fake_sshd import FakeSshd, ed25519_file, public_line

from memqual.host.core.errors import GuestError
from memqual.host.core.ssh import SSH, HostKeyMismatch


@pytest.fixture
def server_key(tmp_path: Path) -> paramiko.Ed25519Key:
    return paramiko.Ed25519Key.from_private_key_file(str(ed25519_file(tmp_path / "hk")))


@pytest.fixture
def sshd(server_key: paramiko.Ed25519Key) -> Iterator[FakeSshd]:
    server = FakeSshd(server_key)
    yield server
    server.close()


@pytest.fixture
def client_key(tmp_path: Path) -> Path:
    return ed25519_file(tmp_path / "id_ed25519")


def test_the_images_own_host_key_is_accepted(sshd: FakeSshd, server_key: paramiko.PKey, client_key: Path) -> None:
    ssh = SSH(sshd.port, client_key, host_key=public_line(server_key))
    ssh.connect(timeout=5)
    try:
        assert ssh.run(["echo", "hi"], timeout=10).stdout == "hello\n"
    finally:
        ssh.close()


def test_a_wrong_host_key_is_refused_before_any_command(sshd: FakeSshd, client_key: Path, tmp_path: Path) -> None:
    other = paramiko.Ed25519Key.from_private_key_file(str(ed25519_file(tmp_path / "other")))
    ssh = SSH(sshd.port, client_key, host_key=public_line(other))
    with pytest.raises(HostKeyMismatch, match="is not the guest") as info:
        ssh.connect(timeout=5)
    assert "\n" not in str(info.value)
    assert sshd.commands == []
    with pytest.raises(GuestError, match="not connected"):
        ssh.run(["true"])


def test_a_host_key_of_another_type_is_refused(sshd: FakeSshd, client_key: Path) -> None:
    rsa = paramiko.RSAKey.generate(1024)
    ssh = SSH(sshd.port, client_key, host_key=public_line(rsa))
    with pytest.raises(HostKeyMismatch):
        ssh.connect(timeout=5)
    assert sshd.commands == []


def test_the_pinned_key_comes_from_the_images_key_directory(
    sshd: FakeSshd, server_key: paramiko.PKey, tmp_path: Path
) -> None:
    """By default SSH reads host_key.pub beside the image's client key."""
    keys = tmp_path / "ssh"
    keys.mkdir()
    client = ed25519_file(keys / "id_ed25519")
    (keys / "host_key.pub").write_text(public_line(server_key) + "\n")
    ssh = SSH(sshd.port, client)
    ssh.connect(timeout=5)
    ssh.close()
    (keys / "host_key.pub").unlink()
    with pytest.raises(GuestError, match="no SSH host key for the image"):
        SSH(sshd.port, client).connect(timeout=5)

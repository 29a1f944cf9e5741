"""The guest's SSH host key is pinned: a server on the forwarded port that
shows another key is refused, the image's own key is accepted.  The server
is paramiko's own (ServerInterface) on 127.0.0.1, running ``echo``."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from memqual.host.core.errors import GuestError
from memqual.host.core.ssh import SSH, HostKeyMismatch


def _ed25519_file(path: Path) -> Path:
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    return path


def _public_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


class _Server(paramiko.ServerInterface):
    def __init__(self) -> None:
        self.commands: list[bytes] = []
        self.exec_event = threading.Event()

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL if username == "root" else paramiko.AUTH_FAILED

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.commands.append(command)
        self.exec_event.set()
        return True


class FakeSshd:
    """One-connection-at-a-time sshd with a given host key; each exec
    answers "hello" and exit status 0."""

    def __init__(self, host_key: paramiko.PKey) -> None:
        self.host_key = host_key
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.commands: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._transports: list[paramiko.Transport] = []
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            transport = paramiko.Transport(conn)
            self._transports.append(transport)
            transport.add_server_key(self.host_key)
            server = _Server()
            try:
                transport.start_server(server=server)
            except (paramiko.SSHException, EOFError, OSError):
                continue
            threading.Thread(target=self._serve, args=(transport, server), daemon=True).start()

    def _serve(self, transport: paramiko.Transport, server: _Server) -> None:
        while transport.is_active() and not self._stop.is_set():
            channel = transport.accept(0.2)
            if channel is None:
                continue
            if not server.exec_event.wait(5):
                channel.close()
                continue
            server.exec_event.clear()
            self.commands.extend(server.commands)
            channel.sendall(b"hello\n")
            channel.send_exit_status(0)
            channel.shutdown_write()
            channel.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for transport in self._transports:
            transport.close()
        self.sock.close()


@pytest.fixture
def server_key(tmp_path: Path) -> paramiko.Ed25519Key:
    return paramiko.Ed25519Key.from_private_key_file(str(_ed25519_file(tmp_path / "hk")))


@pytest.fixture
def sshd(server_key: paramiko.Ed25519Key) -> Iterator[FakeSshd]:
    server = FakeSshd(server_key)
    yield server
    server.close()


@pytest.fixture
def client_key(tmp_path: Path) -> Path:
    return _ed25519_file(tmp_path / "id_ed25519")


def test_the_images_own_host_key_is_accepted(sshd: FakeSshd, server_key: paramiko.PKey, client_key: Path) -> None:
    ssh = SSH(sshd.port, client_key, host_key=_public_line(server_key))
    ssh.connect(timeout=5)
    try:
        assert ssh.run(["echo", "hi"], timeout=10).stdout == "hello\n"
    finally:
        ssh.close()


def test_a_wrong_host_key_is_refused_before_any_command(sshd: FakeSshd, client_key: Path, tmp_path: Path) -> None:
    other = paramiko.Ed25519Key.from_private_key_file(str(_ed25519_file(tmp_path / "other")))
    ssh = SSH(sshd.port, client_key, host_key=_public_line(other))
    with pytest.raises(HostKeyMismatch, match="is not the guest") as info:
        ssh.connect(timeout=5)
    assert "\n" not in str(info.value)
    assert sshd.commands == []
    with pytest.raises(GuestError, match="not connected"):
        ssh.run(["true"])


def test_a_host_key_of_another_type_is_refused(sshd: FakeSshd, client_key: Path) -> None:
    rsa = paramiko.RSAKey.generate(1024)
    ssh = SSH(sshd.port, client_key, host_key=_public_line(rsa))
    with pytest.raises(HostKeyMismatch):
        ssh.connect(timeout=5)
    assert sshd.commands == []


def test_the_pinned_key_comes_from_the_images_key_directory(
    sshd: FakeSshd, server_key: paramiko.PKey, tmp_path: Path
) -> None:
    """By default SSH reads host_key.pub beside the image's client key."""
    keys = tmp_path / "ssh"
    keys.mkdir()
    client = _ed25519_file(keys / "id_ed25519")
    (keys / "host_key.pub").write_text(_public_line(server_key) + "\n")
    ssh = SSH(sshd.port, client)
    ssh.connect(timeout=5)
    ssh.close()
    (keys / "host_key.pub").unlink()
    with pytest.raises(GuestError, match="no SSH host key for the image"):
        SSH(sshd.port, client).connect(timeout=5)

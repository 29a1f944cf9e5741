"""An sshd on 127.0.0.1 with a host key the test chooses (paramiko), and
the key files a client needs."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def ed25519_file(path: Path) -> Path:
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    return path


def public_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


class Server(paramiko.ServerInterface):
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
            server = Server()
            try:
                transport.start_server(server=server)
            except (paramiko.SSHException, EOFError, OSError):
                continue
            threading.Thread(target=self._serve, args=(transport, server), daemon=True).start()

    def _serve(self, transport: paramiko.Transport, server: Server) -> None:
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

"""SSH into the guest with paramiko: commands with status and a timeout,
files streamed over an exec channel (dropbear has no SFTP), background
commands whose output is collected as it comes.

Only 127.0.0.1 is ever dialled; the host key is the one built into this
image's keys archive, so it is accepted without a known_hosts file."""

from __future__ import annotations

import dataclasses
import logging
import shlex
import socket
import time
from pathlib import Path
from typing import Iterator

import paramiko

from host.errors import GuestError, Timeout

log = logging.getLogger("memqual.ssh")


@dataclasses.dataclass
class CommandResult:
    argv: list[str]
    status: int
    stdout: str
    stderr: str
    duration_s: float

    def check(self) -> "CommandResult":
        if self.status != 0:
            raise GuestError(
                f"guest command {shlex.join(self.argv)} exited {self.status}: {self.stderr.strip()[-300:]}"
            )
        return self


def banner_ready(port: int, timeout: float = 0.5) -> bool:
    """True once an SSH server answers with its banner.  QEMU's user-mode
    network accepts TCP connections before the guest listens, so a bare
    connect proves nothing; the banner does."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(8).startswith(b"SSH-")
    except OSError:
        return False


class BackgroundCommand:
    """A guest command running while the test goes on."""

    def __init__(self, channel: paramiko.Channel, argv: list[str]) -> None:
        self._channel = channel
        self.argv = argv
        self._started = time.monotonic()
        self._stdout: list[str] = []
        self._stderr = bytearray()
        self._pending = b""

    def _pump(self, block_s: float) -> bool:
        """Read what is there; False once stdout reached its end.

        The end is the channel's EOF, never the exit status: the status can
        arrive while output is still buffered, and stopping then would drop
        the command's last lines."""
        self._channel.settimeout(block_s)
        while self._channel.recv_stderr_ready():
            self._stderr += self._channel.recv_stderr(65536)
        try:
            chunk = self._channel.recv(65536)
        except socket.timeout:
            return True
        if chunk:
            self._pending += chunk
            *lines, self._pending = self._pending.split(b"\n")
            self._stdout.extend(line.decode(errors="replace") for line in lines)
            return True
        if self._pending:
            self._stdout.append(self._pending.decode(errors="replace"))
            self._pending = b""
        while self._channel.recv_stderr_ready():
            self._stderr += self._channel.recv_stderr(65536)
        return False

    def lines(self, timeout: float = 3600.0) -> Iterator[str]:
        """Stdout lines as they come, until the command ends or the deadline."""
        deadline = time.monotonic() + timeout
        emitted = 0
        while True:
            while emitted < len(self._stdout):
                emitted += 1
                yield self._stdout[emitted - 1]
            if time.monotonic() > deadline:
                raise Timeout(f"guest command {shlex.join(self.argv)} still running after {timeout:.0f} s")
            if not self._pump(0.2) and emitted >= len(self._stdout):
                return

    def wait(self, timeout: float = 60.0) -> CommandResult:
        for _ in self.lines(timeout):
            pass
        status = self._channel.recv_exit_status()
        while self._channel.recv_stderr_ready():  # stderr may trail stdout's end
            self._stderr += self._channel.recv_stderr(65536)
        return CommandResult(
            self.argv, status, "\n".join(self._stdout) + ("\n" if self._stdout else ""),
            self._stderr.decode(errors="replace"), time.monotonic() - self._started,
        )

    def kill(self) -> None:
        """Closing the channel makes dropbear hang up the command's session."""
        self._channel.close()


class SSH:
    def __init__(self, port: int, key_path: Path) -> None:
        self.port = port
        self._key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
        self._client: paramiko.SSHClient | None = None

    def connect(self, timeout: float = 10.0) -> None:
        client = paramiko.SSHClient()
        # The host key was made with this image; the port is ours on
        # loopback.  There is no known_hosts to consult.
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            client.connect(
                "127.0.0.1", port=self.port, username="root", pkey=self._key, timeout=timeout,
                banner_timeout=timeout, auth_timeout=timeout, allow_agent=False, look_for_keys=False,
            )
        except (paramiko.SSHException, OSError) as exc:
            client.close()
            raise GuestError(f"SSH to the guest on 127.0.0.1:{self.port} failed: {exc}") from exc
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(5)
        self._client = client

    def set_keepalive(self, seconds: int) -> None:
        """Keepalive period; 0 turns it off.  A guest driven to its memory
        limit can OOM-kill its SSH server while it answers a keepalive."""
        transport = self._client.get_transport() if self._client else None
        if transport is not None:
            transport.set_keepalive(seconds)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _channel(self, argv: list[str]) -> paramiko.Channel:
        if self._client is None:
            raise GuestError("SSH is not connected (the guest is not running?)")
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise GuestError("the SSH connection to the guest is gone (did the guest crash? see the console log)")
        try:
            channel = transport.open_session()
            # The guest runs argv through /bin/sh: quote every word, so
            # nothing a test passes is ever interpreted by the shell.
            channel.exec_command(shlex.join(argv))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # The connection died under us: the guest's SSH server was
            # killed (an OOM kill at the balloon floor) or the guest is gone.
            raise GuestError(
                f"the SSH connection to the guest broke starting {shlex.join(argv)!r} "
                f"({type(exc).__name__}: {exc or 'connection closed'}); was the guest's SSH server killed?"
            ) from exc
        return channel

    def start(self, argv: list[str]) -> BackgroundCommand:
        return BackgroundCommand(self._channel(argv), argv)

    def run(self, argv: list[str], timeout: float = 60.0, check: bool = True, input: bytes | None = None) -> CommandResult:
        started = time.monotonic()
        channel = self._channel(argv)
        if input is not None:
            channel.sendall(input)
            channel.shutdown_write()
        try:
            result = BackgroundCommand(channel, argv).wait(timeout)
        finally:
            channel.close()
        result.duration_s = time.monotonic() - started
        log.info("guest: %s -> %d (%.3f s)", shlex.join(argv), result.status, result.duration_s)
        return result.check() if check else result

    def push(self, local: Path, guest_path: str, mode: int = 0o755) -> None:
        """Stream a file into the guest over an exec channel (no SFTP)."""
        data = Path(local).read_bytes()
        self.run(["sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "push", guest_path, f"{mode:o}"], input=data)

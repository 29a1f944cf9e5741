"""SSH waits are bounded and background commands keep to their own
connection: an exit status that never comes and input nobody reads are
Timeouts; a background command opens a connection of its own and closes
it once over (dropbear 2022.83 breaks when a channel ends while another
opens on one connection)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from fake_sshd import FakeSshd, ed25519_file, public_line

from memqual.host.core.errors import Timeout
from memqual.host.core.ssh import SSH, _wait_exit_status


class SilentChannel:
    """A channel whose command never ends and never reads its input."""

    def __init__(self) -> None:
        self.status_event = threading.Event()
        self.timeout: float | None = None
        self.closed = False

    def exit_status_ready(self) -> bool:
        return False

    def recv_exit_status(self) -> int:
        raise AssertionError("would block forever")

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def sendall(self, data: bytes) -> None:
        assert self.timeout is not None, "sendall without a deadline blocks forever"
        time.sleep(self.timeout)
        raise TimeoutError()

    def close(self) -> None:
        self.closed = True

    def exec_command(self, command: str) -> None:
        pass


def test_an_exit_status_that_never_comes_is_a_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(Timeout, match="gave no exit status"):
        _wait_exit_status(SilentChannel(), time.monotonic() + 0.3, ["sleep", "inf"])
    assert time.monotonic() - started < 2


def test_input_the_guest_does_not_read_is_a_timeout(tmp_path: Path) -> None:
    channel = SilentChannel()

    class Transport:
        def is_active(self) -> bool:
            return True

        def open_session(self, timeout: float | None = None) -> SilentChannel:
            return channel

    class Client:
        def get_transport(self) -> Transport:
            return Transport()

        def close(self) -> None:
            pass

    ssh = SSH(1, ed25519_file(tmp_path / "id"))
    ssh._client = Client()
    started = time.monotonic()
    with pytest.raises(Timeout, match="did not take its input within 1 s"):
        ssh.run(["cat"], timeout=1, input=b"x" * 10)
    assert time.monotonic() - started < 3
    assert channel.closed


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_deadline_must_be_finite(tmp_path: Path, bad: float) -> None:
    ssh = SSH(1, ed25519_file(tmp_path / "id"))
    with pytest.raises(ValueError, match="finite"):
        ssh.run(["true"], timeout=bad)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[FakeSshd, paramiko.PKey]]:
    key = paramiko.Ed25519Key.from_private_key_file(str(ed25519_file(tmp_path / "hk")))
    sshd = FakeSshd(key)
    yield sshd, key
    sshd.close()


def test_a_background_command_has_its_own_connection_closed_when_it_ends(
    server: tuple[FakeSshd, paramiko.PKey], tmp_path: Path
) -> None:
    sshd, key = server
    ssh = SSH(sshd.port, ed25519_file(tmp_path / "id"), host_key=public_line(key))
    ssh.connect(timeout=5)
    try:
        command = ssh.start(["agent", "run"])
        assert len(sshd._transports) == 2, "the background command should have opened a connection of its own"
        side = command._connection
        assert side is not None and side is not ssh
        assert list(command.lines(timeout=10)) == ["hello"]
        assert command._connection is None and side._client is None  # closed once over
        assert command.wait(timeout=5).status == 0
        assert ssh.run(["true"], timeout=10).status == 0  # the main connection is untouched
    finally:
        ssh.close()


def test_a_command_that_could_not_start_is_started_on_a_fresh_connection(
    server: tuple[FakeSshd, paramiko.PKey], tmp_path: Path
) -> None:
    """The guest's per-connection server died between two commands (as
    dropbear's did): no channel could open, so the command never ran and
    runs once on a new connection."""
    sshd, key = server
    ssh = SSH(sshd.port, ed25519_file(tmp_path / "id"), host_key=public_line(key))
    ssh.connect(timeout=5)
    try:
        assert ssh.run(["first"], timeout=10).stdout == "hello\n"
        sshd._transports[0].close()  # the server side of the connection dies
        deadline = time.monotonic() + 5
        while ssh._client is not None and ssh._client.get_transport().is_active():
            assert time.monotonic() < deadline
            time.sleep(0.01)  # the client notices the hang-up
        assert ssh.run(["second"], timeout=10).stdout == "hello\n"
        assert len(sshd._transports) == 2
        assert sshd.commands == [b"first", b"second"]  # each ran once
    finally:
        ssh.close()

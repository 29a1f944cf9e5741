"""memqual.host.core.ssh: the readiness check against local TCP servers, and command
quoting/streaming through an exec channel that runs on the host's /bin/sh
(what dropbear does with the command string in the guest)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fake_paramiko import FakeClient, FakeTransport, LocalChannel
from fake_sshd import public_line
from hypothesis import given, settings
from hypothesis import strategies as st

from memqual.host.core import ssh as ssh_module
from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.ssh import SSH, banner_ready


# -- banner_ready ----------------------------------------------------------
def serve(greeting: bytes | None, hang_up: bool = False) -> Iterator[int]:
    """A loopback server that sends ``greeting`` (or nothing) to every
    client and keeps the connection open (``hang_up``: closes it)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if greeting is not None:
                conn.sendall(greeting)
            if hang_up:
                conn.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.fixture
def ssh_server() -> Iterator[int]:
    yield from serve(b"SSH-2.0-dropbear_2022.83\r\n")


@pytest.fixture
def silent_server() -> Iterator[int]:
    yield from serve(None)


@pytest.fixture
def http_server() -> Iterator[int]:
    yield from serve(b"HTTP/1.0 400 Bad Request\r\n\r\n")


def test_banner_ready_when_the_server_says_ssh(ssh_server: int) -> None:
    assert banner_ready(ssh_server, timeout=2)


def test_not_ready_when_connected_but_silent(silent_server: int) -> None:
    # QEMU's slirp accepts the TCP connection before the guest listens.
    started = time.monotonic()
    assert not banner_ready(silent_server, timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2


def test_not_ready_for_another_protocol(http_server: int) -> None:
    assert not banner_ready(http_server, timeout=2)


def test_not_ready_when_nobody_listens() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        started = time.monotonic()
        assert not banner_ready(port, timeout=2)
        assert time.monotonic() - started < 1


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "id_ed25519"
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    return path


@pytest.fixture
def transport() -> FakeTransport:
    return FakeTransport()


@pytest.fixture
def ssh(key_file: Path, transport: FakeTransport, monkeypatch: pytest.MonkeyPatch) -> Iterator[SSH]:
    client = SSH(port=1, key_path=key_file)
    client._client = FakeClient(transport)
    monkeypatch.setattr(client, "_background_connection", lambda: client)  # one fake connection
    yield client
    for channel in transport.channels:
        channel.close()


NASTY = [
    "a b",
    "$(touch /tmp/pwned-memqual)",
    "`id`",
    "'",
    '"',
    ";",
    "&&",
    "|",
    "*",
    "~",
    "\\",
    "$HOME",
    "\n",
    "-e",
    "",
    "é",
]


def test_every_word_reaches_the_program_unchanged(ssh: SSH, transport: FakeTransport) -> None:
    result = ssh.run(["printf", "%s\\0", *NASTY])
    assert result.stdout.split("\0")[:-1] == NASTY
    assert not Path("/tmp/pwned-memqual").exists()


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=12),
        min_size=1,
        max_size=5,
    )
)
def test_quoting_round_trips_any_words(key_file: Path, words: list[str]) -> None:
    transport = FakeTransport()
    client = SSH(port=1, key_path=key_file)
    client._client = FakeClient(transport)
    try:
        result = client.run(["printf", "%s\\0", *words])
    finally:
        for channel in transport.channels:
            channel.close()
    # run() collects stdout by lines and ends it with a newline
    assert result.stdout == "".join(word + "\0" for word in words) + "\n"


def test_status_stdout_stderr(ssh: SSH) -> None:
    result = ssh.run(["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (result.status, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.duration_s >= 0


def test_check_raises_guest_error_naming_the_command(ssh: SSH) -> None:
    with pytest.raises(GuestError, match=r"guest command sh -c 'echo boom >&2; exit 7' exited 7: boom"):
        ssh.run(["sh", "-c", "echo boom >&2; exit 7"])


def test_a_command_past_its_deadline_is_a_timeout(ssh: SSH, transport: FakeTransport) -> None:
    started = time.monotonic()
    with pytest.raises(Timeout, match="still running after"):
        ssh.run(["sleep", "30"], timeout=0.3)
    assert time.monotonic() - started < 2
    assert transport.channels[-1]._proc is not None and transport.channels[-1]._proc.poll() is not None


def test_background_command_lines_as_they_come(ssh: SSH) -> None:
    command = ssh.start(["sh", "-c", "echo one; echo two; echo three"])
    assert list(command.lines(timeout=5)) == ["one", "two", "three"]
    assert command.wait(timeout=5).status == 0


def test_push_streams_a_file_with_its_mode(ssh: SSH, tmp_path: Path) -> None:
    source = tmp_path / "agent"
    source.write_bytes(bytes(range(256)) * 300)
    target = tmp_path / "in guest with spaces"
    ssh.push(source, str(target), mode=0o750)
    assert target.read_bytes() == source.read_bytes()
    assert target.stat().st_mode & 0o777 == 0o750


def test_a_server_that_hangs_up_after_its_banner_is_a_guest_error(key_file: Path) -> None:
    """What a guest's forward does while its sshd is not yet up behind a
    nested QEMU: paramiko raises a bare EOFError from the key exchange,
    which the boot's wait must see as "not yet", not as a failed test."""
    pinned = public_line(paramiko.Ed25519Key.from_private_key_file(str(key_file)))
    for port in serve(b"SSH-2.0-dropbear_2022.83\r\n", hang_up=True):
        # a reset where the client's key exchange reached the closed socket
        # first (a loaded host's timing): the same hang-up, as the kernel saw it
        with pytest.raises(GuestError, match="failed: (the server hung up|.*Connection reset by peer)"):
            SSH(port=port, key_path=key_file, host_key=pinned).connect(timeout=2.0)


def test_dead_transport_is_a_guest_error(key_file: Path) -> None:
    client = SSH(port=1, key_path=key_file)
    client._client = FakeClient(FakeTransport(active=False))
    with pytest.raises(GuestError, match="connection to the guest is gone"):
        client.run(["true"])
    client.close()
    with pytest.raises(GuestError, match="not connected"):
        client.run(["true"])


class DyingTransport(FakeTransport):
    """Active until a session is asked for; then the server hangs up (what
    paramiko raises when the guest's dropbear was killed under it)."""

    def open_session(self, timeout: float | None = None) -> LocalChannel:
        raise EOFError()


def test_a_connection_that_breaks_under_a_command_is_a_guest_error(
    key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = SSH(port=1, key_path=key_file)
    client._client = FakeClient(DyingTransport())
    monkeypatch.setattr(client, "_background_connection", lambda: client)
    with pytest.raises(GuestError, match="broke starting 'cat /proc/meminfo'.*EOFError") as info:
        client.start(["cat", "/proc/meminfo"])
    assert "\n" not in str(info.value)
    # run() opens a fresh connection once; when that fails too, both are said.
    with pytest.raises(GuestError, match="broke starting 'cat /proc/meminfo'.*EOFError.*fresh connection failed too"):
        client.run(["cat", "/proc/meminfo"])


class FrozenTransport(FakeTransport):
    """Active, but the server never answers a session request (a frozen
    guest): paramiko raises its timeout once ``timeout`` has passed."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float | None] = []

    def open_session(self, timeout: float | None = None) -> LocalChannel:
        self.asked.append(timeout)
        raise paramiko.SSHException("Timeout opening channel.")


def test_a_frozen_guest_costs_a_command_its_own_timeout_not_an_hour(key_file: Path, monkeypatch) -> None:
    client = SSH(port=1, key_path=key_file)
    frozen = FrozenTransport()
    client._client = FakeClient(frozen)
    monkeypatch.setattr(client, "_background_connection", lambda: client)
    with pytest.raises(GuestError, match=r"opened no session for 'kill 1' within 10 s \(is the guest frozen"):
        client.run(["kill", "1"], timeout=10, reconnect=False)
    assert frozen.asked == [10]
    with pytest.raises(GuestError, match="within 60 s"):
        client.start(["cat"])
    assert frozen.asked[-1] == 60


def test_a_background_connection_waits_its_own_deadline_not_what_the_boot_had_left(monkeypatch, key_file):
    """The boot's last connect may have had a second left of its deadline; a
    background command's connection to a guest that is up gets the full
    deadline a loaded host needs for the banner."""
    from memqual.host.core import ssh as ssh_module

    timeouts: list[float] = []
    monkeypatch.setattr(ssh_module.SSH, "connect", lambda self, timeout=10.0: timeouts.append(timeout))
    client = ssh_module.SSH(2222, key_file, "ssh-ed25519 AAAA")
    client._connect_timeout = 1.5
    client._client = object()  # connected, as far as the check goes
    client._background_connection()
    assert timeouts == [ssh_module.BACKGROUND_ATTEMPT_S]
    assert ssh_module.BACKGROUND_ATTEMPT_S > 10, "a TCG guest on a loaded host took over 10 s for its banner"


def test_a_background_connection_a_forward_dropped_is_tried_again_until_its_deadline(monkeypatch, key_file):
    """Under a host under test two forwards stand between this machine and
    the guest's SSH, and one may close a connection before the banner: the
    guest is up, so the connection is tried again; a host key that is not
    the guest's is never retried, and the last failure is what is said."""
    from memqual.host.core import ssh as ssh_module

    attempts: list[float] = []

    def dropped_once(self, timeout=10.0):
        attempts.append(timeout)
        if len(attempts) == 1:
            raise GuestError("SSH to the guest on 127.0.0.1:2222 failed: Error reading SSH protocol banner")

    monkeypatch.setattr(ssh_module.SSH, "connect", dropped_once)
    client = ssh_module.SSH(2222, key_file, "ssh-ed25519 AAAA")
    client._client = object()
    client._background_connection()
    assert len(attempts) == 2

    def impostor(self, timeout=10.0):
        attempts.append(timeout)
        raise ssh_module.HostKeyMismatch("not the guest")

    attempts.clear()
    monkeypatch.setattr(ssh_module.SSH, "connect", impostor)
    with pytest.raises(ssh_module.HostKeyMismatch):
        client._background_connection()
    assert len(attempts) == 1

    def always_dropped(self, timeout=10.0):
        raise GuestError("SSH to the guest on 127.0.0.1:2222 failed: Error reading SSH protocol banner")

    monkeypatch.setattr(ssh_module.SSH, "connect", always_dropped)
    monkeypatch.setattr(ssh_module, "BACKGROUND_CONNECT_S", 1.5)
    with pytest.raises(GuestError, match="protocol banner"):
        client._background_connection()


# -- what a guest prints, within bounds (host/core/bounded.py) --------------
def test_a_guest_command_that_floods_stdout_is_refused(ssh: SSH, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh_module, "GUEST_STDOUT_MAX", 1 << 20)
    with pytest.raises(GuestError, match=r"guest command sh -c .* printed more than 1 MiB: refused"):
        ssh.run(["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x"], timeout=30)


def test_a_guest_command_keeps_the_tail_of_its_stderr(ssh: SSH) -> None:
    # a line on stdout after each 10 kB of stderr keeps the fake channel
    # (which reads stderr only between stdout's chunks) from stalling
    script = "for i in $(seq 40); do head -c 50000 /dev/zero | tr '\\0' x >&2; echo $i; done; echo last >&2"
    result = ssh.run(["sh", "-c", script], timeout=30)
    assert result.stdout.endswith("39\n40\n")
    assert len(result.stderr) < ssh_module.GUEST_STDERR_KEPT + 100 and result.stderr.endswith("xlast\n")
    assert result.stderr.startswith(f"[{2_000_005 - ssh_module.GUEST_STDERR_KEPT} bytes left out]\n")


def test_a_frozen_guest_s_error_carries_what_its_machine_read_of_it(key_file: Path, monkeypatch) -> None:
    """A deadline that ran out in the guest asks its machine what the guest
    was doing (Machine.stuck_evidence) and carries the answer as a note, at
    most STUCK_NOTES_MAX times a connection; an error that is no deadline
    asks nothing."""
    from memqual.host.core import ssh as ssh_module

    client = SSH(port=1, key_path=key_file)
    client._client = FakeClient(FrozenTransport())
    asked: list[int] = []

    def evidence() -> str:
        asked.append(1)
        return "vCPU 0 halted at native_safe_halt+0xb"

    client.on_stuck = evidence
    for _ in range(ssh_module.STUCK_NOTES_MAX + 1):
        with pytest.raises(GuestError) as raised:
            client.run(["true"], timeout=5, reconnect=False)
    assert len(asked) == ssh_module.STUCK_NOTES_MAX
    assert not getattr(raised.value, "__notes__", None), "asked again after its limit"
    client._stuck_noted = 0
    with pytest.raises(GuestError) as raised:
        client.run(["true"], timeout=5, reconnect=False)
    assert raised.value.__notes__ == [ssh_module.STATE_NOTE + "vCPU 0 halted at native_safe_halt+0xb"]
    broken = GuestError("the SSH connection to the guest broke")
    client.note_if_stuck(broken)
    assert not getattr(broken, "__notes__", None)

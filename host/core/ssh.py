"""SSH into the guest with paramiko: commands with status and a timeout,
files streamed over an exec channel (dropbear has no SFTP), background
commands whose output is collected as it comes.

Only 127.0.0.1 is dialled and only the image's host key accepted; every
wait has a deadline; every background command has a connection of its own
(dropbear 2022.83 breaks a channel opened while another ends).  In full:
docs/architecture.md, "SSH into the guest".
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko

from memqual.host.core import bounded
from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.polling import poll
from memqual.images.keys import host_public_key

log = logging.getLogger("memqual.ssh")


@dataclasses.dataclass
class CommandResult:
    argv: list[str]
    status: int
    stdout: str
    stderr: str
    duration_s: float

    def check(self) -> CommandResult:
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


KILL_GRACE_S = 5.0  # for a signalled guest command to end before its channel is closed anyway
RECONNECT_TIMEOUT_S = 5.0  # a fresh connection to a guest whose SSH server still runs takes about 1 s
# A background command's own connection to a guest that is up: about 1 s
# here, but a TCG guest on a host with a load average of 10 took over 10 s
# to send its banner.  Not the boot's last connect timeout, which can be a
# second or two (what was left of the boot's deadline).  Attempts until
# the deadline: under a host under test a forward may drop one.
BACKGROUND_CONNECT_S = 45.0
BACKGROUND_ATTEMPT_S = 20.0
# What one guest command's stdout may hold: its lines are data (dmesg,
# /proc/iomem, an agent's samples: under 1 MiB), so more is refused, not
# cut.  Of its stderr, only a message's worth is kept.
GUEST_STDOUT_MAX = 64 << 20
GUEST_STDERR_KEPT = 1 << 20


def _wait_exit_status(channel: paramiko.Channel, deadline: float, argv: list[str]) -> int:
    """recv_exit_status() with a deadline (paramiko's own waits forever)."""
    # paramiko sets status_event when the status arrives: a pause on it ends
    # then; a channel without one is polled every 10 ms.
    event = getattr(channel, "status_event", None)
    poll(
        channel.exit_status_ready,
        max(0.0, deadline - time.monotonic()),
        0.5 if event is not None else 0.01,
        what=f"the exit status of {shlex.join(argv)}",
        sleep=event.wait if event is not None else time.sleep,
        on_timeout=lambda _: Timeout(f"guest command {shlex.join(argv)} gave no exit status before its deadline"),
    )
    return int(channel.recv_exit_status())


class BackgroundCommand:
    """A guest command running while the test goes on."""

    def __init__(
        self,
        channel: paramiko.Channel,
        argv: list[str],
        ssh: SSH | None = None,
        pidfile: str | None = None,
        connection: SSH | None = None,
    ) -> None:
        self._channel = channel
        self._ssh = ssh
        self._pidfile = pidfile
        self._connection = connection  # its own SSH connection, closed once the command is over
        self._release_lock = threading.Lock()
        self.argv = argv
        self._started = time.monotonic()
        self._stdout: list[str] = []
        self._stdout_bytes = 0
        self._stderr = bounded.Tail(GUEST_STDERR_KEPT)
        self._pending = bytearray()  # a line not yet ended

    def _pump(self, block_s: float) -> bool:
        """Read what is there; False once stdout reached its end.

        The end is the channel's EOF, never the exit status: the status can
        arrive while output is still buffered, and stopping then would drop
        the command's last lines."""
        self._channel.settimeout(block_s)
        self._drain_stderr()
        try:
            chunk = self._channel.recv(65536)
        except TimeoutError:
            return True
        if chunk:
            self._stdout_bytes += len(chunk)
            if self._stdout_bytes > GUEST_STDOUT_MAX:
                raise GuestError(
                    f"guest command {shlex.join(self.argv)} printed more than {bounded.mib(GUEST_STDOUT_MAX)}: refused"
                )
            # only the new chunk is searched: a line without end is not
            # split again on every chunk
            if b"\n" in chunk:
                *lines, rest = (bytes(self._pending) + chunk).split(b"\n")
                self._pending = bytearray(rest)
                self._stdout.extend(line.decode(errors="replace") for line in lines)
            else:
                self._pending += chunk
            return True
        if self._pending:
            self._stdout.append(self._pending.decode(errors="replace"))
            self._pending = bytearray()
        self._drain_stderr()
        return False

    def _drain_stderr(self) -> None:
        while self._channel.recv_stderr_ready():
            self._stderr.add(self._channel.recv_stderr(65536))

    def lines(self, timeout: float = 3600.0) -> Iterator[str]:
        """Stdout lines as they come, until the command ends or the deadline."""
        deadline = time.monotonic() + _finite(timeout)
        emitted = 0
        while True:
            while emitted < len(self._stdout):
                emitted += 1
                yield self._stdout[emitted - 1]
            if time.monotonic() > deadline:
                late = Timeout(f"guest command {shlex.join(self.argv)} still running after {timeout:.0f} s")
                if self._ssh is not None:
                    self._ssh.note_if_stuck(late)
                raise late
            if not self._pump(0.2) and emitted >= len(self._stdout):
                if self._connection is not None:
                    # The command is over: keep its exit status, drop its connection.
                    try:
                        _wait_exit_status(self._channel, time.monotonic() + 5.0, self.argv)
                    except Timeout:
                        pass
                    self._release()
                return

    def _release(self) -> None:
        """Close the command's own connection (once, from any thread)."""
        with self._release_lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def wait(self, timeout: float = 60.0) -> CommandResult:
        deadline = time.monotonic() + _finite(timeout)
        for _ in self.lines(timeout):
            pass
        # The exit status follows stdout's end at once; a few seconds more
        # than the command's own deadline cover a busy guest.
        try:
            status = _wait_exit_status(self._channel, max(deadline, time.monotonic()) + 5.0, self.argv)
        except Timeout as exc:
            if self._ssh is not None:
                self._ssh.note_if_stuck(exc)
            raise
        finally:
            self._release()
        self._drain_stderr()  # stderr may trail stdout's end
        return CommandResult(
            self.argv,
            status,
            "\n".join(self._stdout) + ("\n" if self._stdout else ""),
            self._stderr.text(),
            time.monotonic() - self._started,
        )

    def kill(self) -> None:
        """End the command: SIGTERM to it inside the guest (its pid was
        written by the wrapper ``SSH.start`` runs it under), a bounded wait
        for its end, then the channel is closed.  Another thread may be
        reading the output meanwhile, so this only waits, never reads."""
        try:
            if self._ssh is not None and self._pidfile is not None and not self._channel.exit_status_ready():
                self._ssh.run(
                    ["sh", "-c", 'kill -TERM "$(cat "$1")" 2>/dev/null; rm -f "$1"', "kill", self._pidfile],
                    timeout=10,
                    check=False,
                    reconnect=False,
                )
                # 10 ms: the reader (maybe another thread) drains the output meanwhile
                ended = poll(
                    lambda: self._channel.exit_status_ready() and getattr(self._channel, "eof_received", True),
                    KILL_GRACE_S,
                    0.01,
                    what=f"the end of {shlex.join(self.argv)}",
                    raise_on_timeout=False,
                )
                if not ended.met:
                    log.info("guest command %s still running after SIGTERM; closing its channel", shlex.join(self.argv))
        except GuestError as exc:
            log.info("could not signal guest command %s (%s); closing its channel", shlex.join(self.argv), exc)
        finally:
            self._channel.close()
            self._release()


def _finite(seconds: float) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a deadline must be a finite number of seconds >= 0, not {seconds!r}")
    return seconds


# How long a command waits for the guest's server to open its session:
# a command's own timeout (at least OPEN_TIMEOUT_MIN_S), a background
# command's OPEN_TIMEOUT_S.
OPEN_TIMEOUT_S = 60.0
OPEN_TIMEOUT_MIN_S = 5.0


class _NotStarted(GuestError):
    """No channel could be opened: the command certainly did not run."""


class _NoSession(_NotStarted):
    """The guest's server opened no session in time: a sign of a guest
    that stopped, like a command's deadline."""


# How many times one connection reads a stuck guest's state for its
# errors: the first deadlines say it; the rest would say it again.
STUCK_NOTES_MAX = 2
# How such a note begins.
STATE_NOTE = "the guest's state: "


class HostKeyMismatch(GuestError):
    """Whatever answered on the guest's port showed another host key."""


class SSH:
    def __init__(self, port: int, key_path: Path, host_key: str | None = None, slowdown: float = 1.0) -> None:
        """``host_key``: the guest's public host key ('ssh-ed25519 AAAA...');
        by default the one kept with the image's client key.  ``slowdown``
        stretches the wait for a second connection (a guest under a host
        under test answers through L1, which TCG emulates)."""
        self.port = port
        self._slowdown = slowdown
        self._key_path = Path(key_path)
        self._key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
        self._host_key = host_key
        self._client: paramiko.SSHClient | None = None
        self._connect_timeout = 10.0
        # What a guest that ran out of a deadline was doing (a line, with
        # its evidence kept elsewhere): its machine sets it
        # (Machine.stuck_evidence), and each such error carries it as a note.
        self.on_stuck: Callable[[], str] | None = None
        self._stuck_noted = 0

    def _pinned_key(self) -> paramiko.PKey:
        if self._host_key is None:
            self._host_key = host_public_key(self._key_path.parent)
        kind, _, blob = self._host_key.partition(" ")
        try:
            return paramiko.PKey.from_type_string(kind, base64.b64decode(blob.split()[0]))
        except Exception as exc:  # any parse failure means the kept key is unusable
            raise GuestError(
                f"the image's SSH host key is unreadable ({exc}): rebuild it ('memqual image build --force')"
            ) from exc

    def connect(self, timeout: float = 10.0) -> None:
        self._connect_timeout = timeout
        pinned = self._pinned_key()
        client = paramiko.SSHClient()
        # Only the image's own host key: paramiko looks the server's key up
        # under "[127.0.0.1]:PORT" and RejectPolicy refuses anything else.
        client.get_host_keys().add(f"[127.0.0.1]:{self.port}", pinned.get_name(), pinned)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                "127.0.0.1",
                port=self.port,
                username="root",
                pkey=self._key,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyMismatch(
                f"the SSH server on 127.0.0.1:{self.port} is not the guest: its host key "
                f"{exc.key.get_fingerprint().hex()} is not the image's; refusing to connect"
            ) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            # EOFError: the peer hung up inside the key exchange (a forward
            # whose guest sshd is not up yet), which paramiko does not wrap.
            client.close()
            if "not found in known_hosts" in str(exc):  # RejectPolicy: a key of another type
                raise HostKeyMismatch(
                    f"the SSH server on 127.0.0.1:{self.port} is not the guest ({exc}); refusing to connect"
                ) from exc
            raise GuestError(
                f"SSH to the guest on 127.0.0.1:{self.port} failed: {str(exc) or 'the server hung up'}"
            ) from exc
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

    def _open(self, argv: list[str], command: str, timeout: float) -> paramiko.Channel:
        if self._client is None:
            raise GuestError("SSH is not connected (the guest is not running?)")
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise _NotStarted("the SSH connection to the guest is gone (did the guest crash? see the console log)")
        broke = (
            f"the SSH connection to the guest broke starting {shlex.join(argv)!r}",
            "was the guest's SSH server killed?",
        )
        try:
            # paramiko waits an hour for a session by default: a frozen
            # guest's server never answers, and that wait is this command's.
            channel = transport.open_session(timeout=max(OPEN_TIMEOUT_MIN_S, timeout))
        except paramiko.SSHException as exc:
            if "Timeout" in str(exc):
                raise _NoSession(
                    f"the guest's SSH server opened no session for {shlex.join(argv)!r} within "
                    f"{max(OPEN_TIMEOUT_MIN_S, timeout):.0f} s (is the guest frozen? see the console log)"
                ) from exc
            raise _NotStarted(f"{broke[0]} ({type(exc).__name__}: {exc or 'connection closed'}); {broke[1]}") from exc
        except (EOFError, OSError) as exc:
            # The connection died under us: the guest's SSH server was
            # killed (an OOM kill at the balloon floor) or the guest is gone.
            raise _NotStarted(f"{broke[0]} ({type(exc).__name__}: {exc or 'connection closed'}); {broke[1]}") from exc
        try:
            channel.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # The exec request went out: the command may have run.
            channel.close()
            raise GuestError(f"{broke[0]} ({type(exc).__name__}: {exc or 'connection closed'}); {broke[1]}") from exc
        return channel

    def note_if_stuck(self, exc: BaseException) -> None:
        """Add to ``exc``, a deadline that ran out in the guest (a
        ``Timeout``, or a session never opened), what the guest was doing,
        as ``on_stuck`` reads it from outside; at most STUCK_NOTES_MAX times."""
        chain = [exc, exc.__cause__, exc.__context__]
        if self.on_stuck is None or not any(isinstance(e, (Timeout, _NoSession)) for e in chain):
            return
        if self._stuck_noted >= STUCK_NOTES_MAX:
            return
        self._stuck_noted += 1
        exc.add_note(f"{STATE_NOTE}{self.on_stuck()}")

    def _channel(
        self, argv: list[str], command: str | None = None, reconnect: bool = True, timeout: float = OPEN_TIMEOUT_S
    ) -> paramiko.Channel:
        # The guest runs the command through /bin/sh: every word is quoted,
        # so nothing a test passes is ever interpreted by the shell.
        command = command if command is not None else shlex.join(argv)
        try:
            return self._open(argv, command, timeout)
        except _NotStarted as exc:
            if not reconnect or self._client is None:
                raise
            # No channel was opened, so the command never started and
            # starting it on a fresh connection cannot run it twice.
            # Dropbear runs one server process per connection: when that
            # one died, the listener still answers.
            log.warning("%s; retrying on a fresh SSH connection", exc)
            first = exc
        self.close()
        try:
            self.connect(timeout=min(self._connect_timeout, RECONNECT_TIMEOUT_S))
        except GuestError as exc:
            raise GuestError(f"{first}; a fresh connection failed too ({exc})") from first
        return self._open(argv, command, timeout)

    def _background_connection(self) -> SSH:
        """A fresh connection to the same guest, for one background command."""
        if self._client is None:
            raise GuestError("SSH is not connected (the guest is not running?)")
        side = SSH(self.port, self._key_path, self._host_key, self._slowdown)
        # Under a host under test a connection crosses two user-mode
        # forwards (this machine to L1, L1 to the guest), and either may
        # close it before the guest's server answers: the guest is up (its
        # first connection works), so try again until the deadline.
        failures: list[GuestError] = []

        def connected() -> bool:
            try:
                side.connect(timeout=BACKGROUND_ATTEMPT_S)
            except HostKeyMismatch:
                raise
            except GuestError as exc:
                failures.append(exc)
                return False
            return True

        poll(
            connected,
            BACKGROUND_CONNECT_S * self._slowdown,
            1.0,
            what="a second SSH connection to the guest",
            on_timeout=lambda _: failures[-1] if failures else Timeout("no second SSH connection to the guest"),
        )
        return side

    def start(self, argv: list[str]) -> BackgroundCommand:
        """Run ``argv`` in the background, on its own SSH connection (see
        the module's docstring).  A small wrapper writes its pid to a fresh
        file first, so ``kill()`` can signal it inside the guest."""
        pidfile = f"/tmp/.memqual-bg-{secrets.token_hex(8)}"
        command = shlex.join(["sh", "-c", 'echo $$ > "$0" && exec "$@"', pidfile, *argv])
        side = self._background_connection()
        owned = side if side is not self else None
        try:
            channel = side._channel(argv, command, reconnect=False)
        except BaseException:
            if owned is not None:
                owned.close()
            raise
        return BackgroundCommand(channel, argv, ssh=self, pidfile=pidfile, connection=owned)

    def run(
        self,
        argv: list[str],
        timeout: float = 60.0,
        check: bool = True,
        input: bytes | None = None,
        reconnect: bool = True,
    ) -> CommandResult:
        started = time.monotonic()
        deadline = started + _finite(timeout)
        try:
            channel = self._channel(argv, reconnect=reconnect, timeout=timeout)
        except GuestError as exc:
            self.note_if_stuck(exc)
            raise
        try:
            if input is not None:
                # sendall blocks while the guest does not read: bounded by
                # the channel's timeout (socket.timeout when it expires).
                channel.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    channel.sendall(input)
                except TimeoutError as exc:
                    late = Timeout(f"guest command {shlex.join(argv)} did not take its input within {timeout:.0f} s")
                    self.note_if_stuck(late)
                    raise late from exc
                channel.shutdown_write()
            result = BackgroundCommand(channel, argv, ssh=self).wait(max(0.0, deadline - time.monotonic()))
        finally:
            channel.close()
        result.duration_s = time.monotonic() - started
        log.info("guest: %s -> %d (%.3f s)", shlex.join(argv), result.status, result.duration_s)
        return result.check() if check else result

    def push(self, local: Path, guest_path: str, mode: int = 0o755) -> None:
        """Stream a file into the guest over an exec channel (no SFTP)."""
        data = Path(local).read_bytes()
        self.run(["sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "push", guest_path, f"{mode:o}"], input=data)

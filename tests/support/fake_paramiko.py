"""Just enough of paramiko's client, transport and channel: a channel runs
its exec string with sh -c on the host."""

from __future__ import annotations

import os
import select
import subprocess


# -- commands through a channel that runs /bin/sh on the host ---------------
class LocalChannel:
    """Just enough of paramiko.Channel: runs the exec string with sh -c."""

    def __init__(self) -> None:
        self.command = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._timeout: float | None = None
        self._stderr = b""
        self._stderr_eof = False

    def exec_command(self, command: str) -> None:
        self.command = command
        self._proc = subprocess.Popen(
            ["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def recv(self, size: int) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], self._timeout)
        if not ready:
            raise TimeoutError()
        return os.read(self._proc.stdout.fileno(), size)

    def recv_stderr_ready(self) -> bool:
        assert self._proc is not None and self._proc.stderr is not None
        if not self._stderr and not self._stderr_eof:
            ready, _, _ = select.select([self._proc.stderr], [], [], 0)
            if ready:
                chunk = os.read(self._proc.stderr.fileno(), 65536)
                self._stderr_eof = not chunk
                self._stderr = chunk
        return bool(self._stderr)

    def recv_stderr(self, size: int) -> bytes:
        chunk, self._stderr = self._stderr, b""
        return chunk

    def exit_status_ready(self) -> bool:
        assert self._proc is not None
        return self._proc.poll() is not None

    def recv_exit_status(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

    def sendall(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(data)

    def shutdown_write(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.close()

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
                if stream is not None and not stream.closed:
                    stream.close()


class FakeTransport:
    def __init__(self, active: bool = True) -> None:
        self.active = active
        self.channels: list[LocalChannel] = []

    def is_active(self) -> bool:
        return self.active

    def open_session(self, timeout: float | None = None) -> LocalChannel:
        self.channels.append(LocalChannel())
        return self.channels[-1]


class FakeClient:
    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport

    def get_transport(self) -> FakeTransport:
        return self.transport

    def close(self) -> None:
        pass

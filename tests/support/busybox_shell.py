"""A stand-in for a host under test's shell (host/core/shell.py's Shell):
L1's commands run here, under this machine's busybox, as L1's busybox
image runs them (``sh``, ``timeout``, ``usleep`` are its applets), so a
script written for L1 runs for real against this machine's /proc.
Tests skip without /usr/bin/busybox."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from memqual.host.core.errors import Timeout
from memqual.host.core.ssh import CommandResult

BUSYBOX = shutil.which("busybox")
APPLETS = ("sh", "timeout", "usleep", "cat")


class BusyboxCommand:
    """A command started by ``BusyboxShell``: stdout line by line, its end, a kill."""

    def __init__(self, argv: list[str], path: str) -> None:
        self.argv = argv
        self._process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": path}
        )
        self._stdout: list[str] = []

    def lines(self, timeout: float = 60) -> Iterator[str]:
        assert self._process.stdout is not None
        # The first line comes at once in these tests: the deadline bounds the read's wait.
        deadline = time.monotonic() + timeout
        for line in self._process.stdout:
            self._stdout.append(line)
            yield line.rstrip("\n")
            if time.monotonic() > deadline:
                raise Timeout(f"{self.argv[:3]} still running after {timeout} s")

    def wait(self, timeout: float = 60) -> CommandResult:
        try:
            out, err = self._process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise Timeout(f"{self.argv[:3]} still running after {timeout} s") from exc
        return CommandResult(self.argv, self._process.returncode, "".join(self._stdout) + out, err, 0.0)

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.communicate()


class BusyboxShell:
    """Runs argv with busybox's applets first on PATH (linked into ``bin``)."""

    def __init__(self, bin_dir: Path) -> None:
        assert BUSYBOX is not None
        bin_dir.mkdir(exist_ok=True)
        for applet in APPLETS:
            (bin_dir / applet).symlink_to(BUSYBOX)
        self.path = str(bin_dir)
        self.started: list[BusyboxCommand] = []

    def start(self, argv: list[str]) -> BusyboxCommand:
        command = BusyboxCommand(argv, self.path)
        self.started.append(command)
        return command

    def run(
        self, argv: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None
    ) -> CommandResult:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={"PATH": self.path})
        return CommandResult(argv, done.returncode, done.stdout, done.stderr, 0.0)

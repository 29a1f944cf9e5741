"""The Shell Protocol (host/core/shell.py) on this machine: argv executed
without a shell of ours, as SSH's exec runs it in a host under test (L1).
For the drivers that read L1 (its KSM, its guest QEMU's RSS) tested
against this machine's own /proc and a fake sysfs tree."""

from __future__ import annotations

import dataclasses
import subprocess

from memqual.host.core.errors import GuestError
from memqual.host.core.shell import Background


@dataclasses.dataclass
class Result:
    argv: list[str]
    status: int
    stdout: str
    stderr: str


class LocalShell:
    """Runs each command to its end and keeps the argv it was given."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def run(self, argv: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None) -> Result:
        self.commands.append(argv)
        done = subprocess.run(argv, input=input, capture_output=True, timeout=timeout)
        result = Result(argv, done.returncode, done.stdout.decode(), done.stderr.decode())
        if check and result.status:
            raise GuestError(f"{argv} exited {result.status}: {result.stderr}")
        return result

    def start(self, argv: list[str]) -> Background:
        raise AssertionError("an L1 driver runs each command to its end")

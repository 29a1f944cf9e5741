"""One error hierarchy for memqual.

Every error a user can cause or meet is a MemqualError.  The CLI prints its
message as one line and exits with its ``exit_status``; tests turn
CapabilityMissing into a skip.  Root causes are chained (``raise ... from``)
so a traceback, when one is wanted (``MEMQUAL_DEBUG=1``), still shows them.
"""

from __future__ import annotations


class MemqualError(Exception):
    """Base of every memqual error.  The message says what to do."""

    exit_status = 2


class BadInput(MemqualError):
    """The user gave something unusable: a missing file, an invalid layout,
    a balloon target above guest RAM.  Exit status 2."""


class CapabilityMissing(MemqualError):
    """The host cannot do what a scenario needs (no KSM, no /dev/kvm, not
    root).  Tests skip with this message; the CLI exits 2."""


class LaunchError(MemqualError):
    """QEMU did not start or died early.  Carries the command line and the
    tail of QEMU's output so the user can reproduce it by hand."""

    def __init__(self, message: str, command: list[str] | None = None, output: str = "") -> None:
        self.command = command or []
        self.output = output
        super().__init__(message)

    def details(self) -> str:
        import shlex

        lines = [str(self)]
        if self.command:
            lines.append("command: " + shlex.join(self.command))
        if self.output:
            lines.append("output (tail):\n" + self.output)
        return "\n".join(lines)


class GuestError(MemqualError):
    """The guest misbehaved: SSH never answered, an agent failed, a command
    timed out."""


class Timeout(GuestError):
    """A wait with a deadline expired.  The message names what was awaited."""


class GuestStopped(GuestError):
    """A test failed and its guest no longer answers: the failure was the
    guest's stop.  The message says what its vCPUs were doing, read from
    outside (host/core/stuck.py)."""

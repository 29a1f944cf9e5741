"""What the scenarios use of a guest shell: the Protocols that SSH and its
BackgroundCommand (host/core/ssh.py) satisfy and the unit tests' fakes stand in
for.  No paramiko here, so that a subject can name the type without
loading the SSH client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class Background(Protocol):
    """A guest command running while the test goes on."""

    def lines(self, timeout: float = ...) -> Iterator[str]: ...
    def wait(self, timeout: float = ...) -> Any: ...
    def kill(self) -> None: ...


class Shell(Protocol):
    """Runs guest commands: in the background, or to their end."""

    def start(self, argv: list[str]) -> Background: ...
    def run(self, argv: list[str], timeout: float = ..., check: bool = ..., input: bytes | None = ...) -> Any: ...

"""What an Avocado job tells memqual while it runs: one JSON object a line,
written by the result-events plugin (host/run/avocado_events.py) into a file
memqual names, and read back here by ``memqual run``.

The events are typed: one dataclass per kind, each line carrying its kind
under ``"event"``.  This module must not import Avocado: ``memqual run``
reads the file without loading the framework.
"""

from __future__ import annotations

import dataclasses
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput

# The option of `avocado run` (and its key in Avocado's settings) that
# names the file; without it the plugin writes nothing.
OPTION = "--memqual-events"
SECTION = "memqual.events"
PLUGIN = "memqual-events"  # its name in pyproject.toml's entry points
KEY = "file"


@dataclasses.dataclass(frozen=True)
class JobStarted:
    """Avocado's pre_tests: the job exists and has its directory."""

    job_id: str
    job_dir: str
    total: int


@dataclasses.dataclass(frozen=True)
class TestStarted:
    uid: str  # Avocado's number of the test in the job ("3")
    name: str  # the test and its variant, "e2e/t.py:K.test_m;b1-A"
    total: int
    logdir: str


@dataclasses.dataclass(frozen=True)
class TestEnded:
    uid: str
    name: str
    total: int
    status: str  # PASS, FAIL, ERROR, SKIP, CANCEL, WARN, INTERRUPTED
    reason: str  # Avocado's fail_reason, "" when it gave none
    seconds: float
    logdir: str


@dataclasses.dataclass(frozen=True)
class TestLog:
    """One message a running test logged at INFO or above (its debug.log
    line, without Avocado's time and logger prefix)."""

    message: str


@dataclasses.dataclass(frozen=True)
class JobEnded:
    """Avocado's post_tests: the job ran (status PASS), failed or crashed."""

    status: str  # the job's, not a test's: PASS when it ran to its end
    interrupted: str  # why Avocado interrupted the job, "" if it did not
    passed: int
    errors: int
    failed: int
    skipped: int
    warned: int
    interrupts: int
    cancelled: int

    @property
    def summary(self) -> str:
        """Avocado's RESULTS line, which it prints only for a job that ran."""
        if self.status != "PASS":
            return ""
        return (
            f"PASS {self.passed} | ERROR {self.errors} | FAIL {self.failed} | SKIP {self.skipped} | "
            f"WARN {self.warned} | INTERRUPT {self.interrupts} | CANCEL {self.cancelled}"
        )


Event = JobStarted | TestStarted | TestEnded | TestLog | JobEnded
KINDS: dict[str, type[Event]] = {
    "job_started": JobStarted,
    "test_started": TestStarted,
    "test_ended": TestEnded,
    "test_log": TestLog,
    "job_ended": JobEnded,
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}


_TYPES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": (int, float)}


def to_line(event: Event) -> bytes:
    """One event as its line of the file."""
    return (json.dumps({"event": _KIND_OF[type(event)], **dataclasses.asdict(event)}) + "\n").encode()


def from_line(line: bytes) -> Event | None:
    """The event on one line; None for a line that is not one (a torn or
    foreign line must not end the reader)."""
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    cls = KINDS.get(str(data.pop("event", "")))
    if cls is None:
        return None
    # The fields' annotations are strings here (postponed evaluation).
    fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    if set(data) != set(fields):
        return None
    checked: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, _TYPES[fields[name]]):
            return None
        checked[name] = float(value) if fields[name] == "float" else value
    return cls(**checked)


class EventsReader:
    """Follows the events file while the job writes it: each ``read()``
    returns the events of the lines completed since the last one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[Event]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            os.lseek(fd, self._offset, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [event for line in lines if line.strip() and (event := from_line(line)) is not None]


def check_plugin() -> None:
    """BadInput unless this venv's Avocado loads memqual's plugins (their
    entry points come with ``pip install -e .``, which ./setup runs)."""
    if not any(e.name == PLUGIN for e in metadata.entry_points(group="avocado.plugins.result_events")):
        raise BadInput("memqual's Avocado plugin is not installed in this venv: run ./setup")


def create(directory: Path, stem: str) -> Path:
    """A new, empty events file of this user's only, in ``directory``;
    the plugin appends to it."""
    for number in range(1, 10_000):
        path = directory / f"{stem}-{number}.jsonl" if number > 1 else directory / f"{stem}.jsonl"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise FileExistsError(f"{directory}: no free name for {stem}.jsonl")

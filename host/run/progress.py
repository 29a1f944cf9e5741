"""The live view of a job: which test runs, for how long, and how far its
repeats are, from the job's events (host/run/jobevents.py).  Reads no
console text and starts no process.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from memqual.host.core.printable import printable
from memqual.host.run import jobevents

if TYPE_CHECKING:
    from rich.console import Console

# The running test's messages that tell how far its repeats are (the
# scenarios log "repeat 2/5 ..." or "window {...}").
_REPEAT = re.compile(r"\b(repeat|window|iteration|round)\w*\b", re.IGNORECASE)


class Progress:
    """Follows the job's events (host/run/jobevents.py): which test runs, since
    when, how many finished with which status, how many records exist so
    far, and the last "repeat" message of the running test."""

    def __init__(self, title: str, console: Console) -> None:
        self.title = title
        self.console = console
        self.start = time.monotonic()
        self.current: str | None = None
        self.current_start = self.start
        self.index = ""
        self.total = 0
        self.counts: dict[str, int] = {}
        self.job_dir: Path | None = None
        self.summary = ""
        self.ended = False  # the job's last event came
        self.repeat = ""
        self.finished: list[tuple[str, str, str, float]] = []

    def feed(self, event: jobevents.Event) -> str | None:
        """Digest one event; returns a line worth printing on a non-terminal.
        Its text (test names, fail reasons, log lines) came from the tests:
        control characters are shown, never sent to the terminal."""
        event = sanitized(event)
        if isinstance(event, jobevents.JobStarted):
            self.job_dir = Path(event.job_dir)
        elif isinstance(event, jobevents.TestStarted):
            self.index, self.total = event.uid, event.total
            self.current, self.current_start, self.repeat = event.name, time.monotonic(), ""
        elif isinstance(event, jobevents.TestEnded):
            self.counts[event.status] = self.counts.get(event.status, 0) + 1
            self.finished.append((event.name, event.status, event.reason, event.seconds))
            if self.current == event.name:
                self.current, self.repeat = None, ""
            # As Avocado's console has it: the reason on one line, cut at
            # 255 characters; a skipped test took no time.
            reason = event.reason if len(event.reason) <= 255 else event.reason[:255] + "..."
            return (
                f"[{self._clock(time.monotonic() - self.start)}] ({event.uid}/{event.total}) {event.name}: "
                + event.status
                + (": " + reason.replace("\n", "\\n") if reason else "")
                + (f" ({event.seconds:.1f} s)" if event.status != "SKIP" else "")
            )
        elif isinstance(event, jobevents.TestLog):
            if self.current is not None and _REPEAT.search(event.message):
                message = event.message.strip()
                self.repeat = message if len(message) <= 90 else message[:87] + "..."
        elif isinstance(event, jobevents.JobEnded):
            self.summary, self.ended = event.summary, True
        return None

    @staticmethod
    def _clock(seconds: float) -> str:
        minutes, secs = divmod(int(seconds), 60)
        return f"{minutes}:{secs:02d}"

    def _records(self) -> int:
        if self.job_dir is None or not self.job_dir.is_dir():
            return 0
        return sum(1 for _ in self.job_dir.rglob("memqual-*.json"))

    def render(self) -> Any:
        # lazy: rich (~70 ms) only for this output, not at every memqual start
        from rich.table import Table
        from rich.text import Text

        # Text, not markup: rich draws the display again with the options
        # of each console.print (markup=False for the progress lines).
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold cyan", no_wrap=True)
        grid.add_column(overflow="fold")
        elapsed = self._clock(time.monotonic() - self.start)
        grid.add_row(Text(self.title), Text(f"elapsed {elapsed}, {self._records()} records so far"))
        if self.current:
            grid.add_row(
                Text(f"({self.index}/{self.total})"),
                Text.assemble(self.current, "  ", (self._clock(time.monotonic() - self.current_start), "bold")),
            )
            if self.repeat:
                grid.add_row(Text(""), Text(self.repeat, style="dim"))
        elif not self.finished:
            grid.add_row(Text(""), Text("avocado is discovering tests...", style="dim"))
        if self.counts:
            grid.add_row(Text(""), Text(" ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))))
        return grid


def sanitized(event: jobevents.Event) -> jobevents.Event:
    """``event`` with its text fields as ``printable`` shows them (the job's
    folder and a test's folder kept as they are: they are read, not only
    shown)."""
    if not dataclasses.is_dataclass(event):
        return event
    changes = {
        f.name: printable(value)
        for f in dataclasses.fields(event)
        if f.name not in ("job_dir", "logdir")
        and isinstance(value := getattr(event, f.name), str)
        and value != printable(value)
    }
    if not changes:
        return event
    replaced: jobevents.Event = dataclasses.replace(cast(Any, event), **changes)
    return replaced

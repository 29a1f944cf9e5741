"""The guest's serial console: the line guest/rc.sh prints once the guest
is ready (init done, dropbear started), and a reader that watches a
growing console log for it."""

from __future__ import annotations

from pathlib import Path

READY_MARKER = b"memqual-ready"  # printed by guest/rc.sh


class ConsoleMarker:
    """Has a marker appeared in a growing console log?  Reads only what
    was appended since the last call; once seen, stays seen."""

    def __init__(self, path: Path, marker: bytes = READY_MARKER) -> None:
        self.path = path
        self.marker = marker
        self._offset = 0
        self._carry = b""  # the end of the last read, for a marker split across reads
        self._seen = False

    def seen(self) -> bool:
        if self._seen:
            return True
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return False
        self._offset += len(chunk)
        text = self._carry + chunk
        self._seen = self.marker in text
        self._carry = text[-(len(self.marker) - 1) :] if len(self.marker) > 1 else b""
        return self._seen

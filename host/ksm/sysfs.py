"""Reading and writing the host's KSM and THP knobs in sysfs.

The roots are parameters so tests drive a fake tree (the real ones are
memqual.host.core.environment.KSM_ROOT and THP_ROOT).  A "knob" is a file the
owner may write (mode has u+w): discovered, not listed, so the snapshot of a
newer kernel's knobs is complete without code changes.  Multiple-choice knobs
("[none] scan-time", "always [madvise] never") are read as their selected
word, which is also what they accept when written.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from pathlib import Path

# THP files a scenario may touch; the rest of THP stays out of the snapshot.
THP_KNOBS = ("enabled", "defrag")

# Order of writes.  advisor_mode comes first because switching it resets
# pages_to_scan to its default; run comes last so ksmd starts (or stays
# stopped) only once every other knob is in place.
_FIRST = ("advisor_mode",)
_LAST = ("run",)


def selected(text: str) -> str:
    """'always [madvise] never' -> 'madvise'; '100' -> '100'."""
    text = text.strip()
    if "[" in text and "]" in text:
        return text[text.index("[") + 1 : text.index("]")]
    return text


def write_order(names: list[str]) -> list[str]:
    first = [n for n in _FIRST if n in names]
    last = [n for n in _LAST if n in names]
    middle = sorted(n for n in names if n not in _FIRST and n not in _LAST)
    return first + middle + last


@dataclasses.dataclass(frozen=True)
class KsmCounters:
    """One reading of the global KSM counters plus ksmd's CPU time.

    Counters a kernel lacks (pages_skipped before 6.7, general_profit before
    6.1, pages_scanned before 6.5) are None."""

    taken_s: float  # time.monotonic() at the reading
    full_scans: int
    pages_shared: int
    pages_sharing: int
    pages_unshared: int
    pages_volatile: int
    pages_skipped: int | None
    pages_scanned: int | None
    general_profit: int | None
    ksmd_cpu_s: float | None  # None when ksmd's pid is not found

    def to_json(self) -> dict[str, float | int | None]:
        return dataclasses.asdict(self)


COUNTERS = (
    "full_scans",
    "pages_shared",
    "pages_sharing",
    "pages_unshared",
    "pages_volatile",
    "pages_skipped",
    "pages_scanned",
    "general_profit",
)


class Sysfs:
    """A directory of sysfs attribute files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def exists(self) -> bool:
        return self.root.is_dir()

    def has(self, name: str) -> bool:
        return (self.root / name).is_file()

    def read(self, name: str) -> str:
        return selected((self.root / name).read_text())

    def read_int(self, name: str) -> int:
        return int(self.read(name))

    def read_int_or_none(self, name: str) -> int | None:
        try:
            return self.read_int(name)
        except FileNotFoundError:
            return None

    def write(self, name: str, value: str | int) -> None:
        """Write one value; sysfs wants it in one write() call."""
        path = self.root / name
        data = f"{value}\n".encode()
        # O_TRUNC is what a shell's "echo 1 > knob" does: sysfs ignores it,
        # a fake tree (plain files) needs it when a value gets shorter.
        # O_NOFOLLOW: sysfs attributes are never symlinks; one is planted.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            os.write(fd, data)
        except OSError as exc:
            raise OSError(exc.errno, f"writing {value!r} to {path}: {os.strerror(exc.errno or errno.EIO)}") from exc
        finally:
            os.close(fd)

    def writable_names(self) -> list[str]:
        """Every file the owner may write: the knobs."""
        names = []
        for entry in sorted(self.root.iterdir()):
            try:
                mode = entry.stat().st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and mode & stat.S_IWUSR:
                names.append(entry.name)
        return names

    def knobs(self, names: tuple[str, ...] | list[str] | None = None) -> dict[str, str]:
        """Current value of the given knobs (default: every writable file)."""
        chosen = list(names) if names is not None else self.writable_names()
        return {n: self.read(n) for n in chosen if self.has(n)}

"""A deterministic cpio "newc" writer (and a small reader for tests).

The kernel unpacks newc archives as its initramfs.  Every entry gets mtime
0, uid/gid 0 and a fixed inode numbering, so the same inputs give the same
bytes and the same sha256: an image is identified by its hash.
"""

from __future__ import annotations

import dataclasses
import io
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

MAGIC = b"070701"
TRAILER = "TRAILER!!!"


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str  # path inside the archive, no leading slash
    mode: int  # full st_mode (type | permissions)
    data: bytes = b""  # file contents, or the target of a symlink
    rdev_major: int = 0
    rdev_minor: int = 0


def _pad4(length: int) -> bytes:
    return b"\0" * (-length % 4)


class CpioWriter:
    """Writes entries to a binary stream.  Directories must be added before
    what they contain (the kernel creates nothing implicitly)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._ino = 0
        self._names: set[str] = set()

    def add(self, entry: Entry) -> None:
        name = entry.name.lstrip("/")
        if not name or name in self._names or name == TRAILER:
            # TRAILER!!! would end the archive early for every reader
            raise ValueError(f"cpio: empty, duplicate or reserved entry name {entry.name!r}")
        self._names.add(name)
        self._ino += 1
        self._write_header(name, entry.mode, entry.data, self._ino, entry.rdev_major, entry.rdev_minor)

    def directory(self, name: str, mode: int = 0o755) -> None:
        self.add(Entry(name, stat.S_IFDIR | mode))

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.add(Entry(name, stat.S_IFREG | mode, data))

    def symlink(self, name: str, target: str) -> None:
        self.add(Entry(name, stat.S_IFLNK | 0o777, target.encode()))

    def device(self, name: str, char: bool, major: int, minor: int, mode: int = 0o600) -> None:
        kind = stat.S_IFCHR if char else stat.S_IFBLK
        self.add(Entry(name, kind | mode, b"", major, minor))

    def close(self) -> None:
        self._write_header(TRAILER, 0, b"", 0, 0, 0)
        # Pad the archive to a 512-byte block like GNU cpio does.
        position = self._stream.tell() if self._stream.seekable() else None
        if position is not None:
            self._stream.write(b"\0" * (-position % 512))

    def _write_header(self, name: str, mode: int, data: bytes, ino: int, rmaj: int, rmin: int) -> None:
        encoded = name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(mode) else 1
        fields = [ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmaj, rmin, len(encoded), 0]
        header = MAGIC + b"".join(b"%08X" % value for value in fields)
        self._stream.write(header + encoded + _pad4(len(header) + len(encoded)))
        self._stream.write(data + _pad4(len(data)))


def add_tree(writer: CpioWriter, root: Path, prefix: str = "") -> None:
    """Add a host directory tree (files, dirs, symlinks) in sorted order,
    with normalised permissions.  ``prefix`` is the path inside the archive."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        name = f"{prefix.strip('/')}/{rel}" if prefix.strip("/") else rel
        if path.is_symlink():
            writer.symlink(name, str(path.readlink()))
        elif path.is_dir():
            writer.directory(name)
        else:
            executable = path.stat().st_mode & 0o111
            writer.file(name, path.read_bytes(), 0o755 if executable else 0o644)


def read(data: bytes) -> Iterator[Entry]:
    """Parse a newc archive (used by the tests to check the writer)."""
    stream = io.BytesIO(data)
    while True:
        header = stream.read(110)
        if len(header) < 110 or header[:6] != MAGIC:
            raise ValueError("cpio: bad or truncated header")
        fields = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, rmaj, rmin, namesize = fields[1], fields[6], fields[9], fields[10], fields[11]
        name = stream.read(namesize)[:-1].decode()
        stream.read(-(110 + namesize) % 4)
        body = stream.read(filesize)
        stream.read(-filesize % 4)
        if name == TRAILER:
            return
        yield Entry(name, mode, body, rmaj, rmin)

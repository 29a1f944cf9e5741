"""The bounds on what memqual takes in from outside: an input file, a
compressed stream and a child process's output.  Each has one way here,
with a ceiling in bytes; past it the reader stops and says so in one
BadInput line, having held little more than the ceiling in memory.  A
child is also read against a deadline that holds while it prints nothing.
docs/architecture.md, "host/core/bounded.py", says why each is built so."""

from __future__ import annotations

import bz2
import collections
import dataclasses
import lzma
import os
import select
import stat
import struct
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

from memqual.host.core.errors import BadInput

# One read(2) of a child's pipe or one step of a decompressor: big enough
# that a fast writer costs few system calls, small enough that the ceiling
# is overshot by at most this much before it is noticed.
CHUNK = 1 << 16
DECOMPRESS_STEP = 1 << 20
# What a line of a child's output keeps: kbuild's longest lines (a gcc
# command line under V=1) are a few KiB; the rest of a longer one is counted
# and left out.
LINE_MAX = 8192
# What is kept of a child's stdout or stderr: its last bytes.  A build
# step's error is at its end; the longest output read whole (a .config,
# about 150 KiB) fits many times over.
TAIL_MAX = 4 << 20
# A decompressor's own working memory (liblzma's dictionary, zstd's
# window): the kernel's compressors use 32 MiB (xz) to 128 MiB (zstd -22).
DECODER_MEMORY_MAX = 1 << 28
LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"
LZ4_LEGACY_BLOCK = 8 << 20  # `lz4 -l` frames: 8 MiB blocks at most


def mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


# ------------------------------------------------------------ input files


def _open_regular(path: Path, what: str, remedy: str) -> int:
    """A descriptor of ``path``, checked to be a regular file from the
    descriptor itself (a FIFO is opened without blocking, then refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise BadInput(f"{path}: no such {what}: {remedy}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc.strerror}): {remedy}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BadInput(f"{path}: is a directory, not a {what}: {remedy}")
        raise BadInput(f"{path}: not a regular file, so no {what}: {remedy}")
    return fd


def _read_at_most(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    left = size
    while left > 0:
        piece = os.read(fd, min(left, 1 << 20))
        if not piece:
            break
        parts.append(piece)
        left -= len(piece)
    return b"".join(parts)


def read_file(path: str | os.PathLike[str], limit: int, what: str, remedy: str) -> bytes:
    """The bytes of ``path``, a ``what`` of at most ``limit`` bytes.  Its
    size is taken from the open descriptor before anything is read, and the
    read stops at ``limit`` + 1 bytes all the same (a file that grows, or
    one whose size the filesystem does not know, like /proc's)."""
    path = Path(path)
    fd = _open_regular(path, what, remedy)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise BadInput(f"{path}: {size} bytes, more than a {what} may have ({mib(limit)}): {remedy}")
        try:
            data = _read_at_most(fd, limit + 1)
        except OSError as exc:
            raise BadInput(f"{path}: cannot read the {what} ({exc.strerror}): {remedy}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise BadInput(f"{path}: more than a {what} may have ({mib(limit)}): {remedy}")
    return data


def read_head(path: str | os.PathLike[str], size: int, what: str, remedy: str) -> bytes:
    """The first ``size`` bytes of the regular file ``path`` (fewer if it is
    shorter): for a reader that looks only at a file's start."""
    path = Path(path)
    fd = _open_regular(path, what, remedy)
    try:
        return _read_at_most(fd, size)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc.strerror}): {remedy}") from None
    finally:
        os.close(fd)


# ------------------------------------------------------------ decompression


class Damaged(ValueError):
    """The compressed data is not a valid stream of its format."""


def _over(what: str, limit: int) -> BadInput:
    return BadInput(f"{what} unpacks to more than {mib(limit)}: refused (a decompression bomb, or not what it says)")


def _zlib(data: bytes, limit: int, what: str, wbits: int) -> bytes:
    decoder = zlib.decompressobj(wbits)
    out = bytearray()
    pending = data
    while not decoder.eof:
        piece = decoder.decompress(pending, min(DECOMPRESS_STEP, limit + 1 - len(out)))
        pending = decoder.unconsumed_tail
        out += piece
        if len(out) > limit:
            raise _over(what, limit)
        if not piece and not pending:
            raise Damaged("the stream ends before its end")
    return bytes(out)


def _library(decoder: bz2.BZ2Decompressor | lzma.LZMADecompressor, data: bytes, limit: int, what: str) -> bytes:
    """bz2's and lzma's decompressors: each keeps the input it has not used
    yet and is then asked again with no more."""
    out = bytearray()
    pending = data
    while not decoder.eof:
        if decoder.needs_input and not pending:
            raise Damaged("the stream ends before its end")
        out += decoder.decompress(pending, min(DECOMPRESS_STEP, limit + 1 - len(out)))
        pending = b""
        if len(out) > limit:
            raise _over(what, limit)
    return bytes(out)


def _zstd(data: bytes, limit: int, what: str) -> bytes:
    import zstandard

    # zstandard's decoder object gives all that a call's input unpacks to,
    # with no bound of its own (and its stream reader fails on the size
    # word after the frame), and a zstd block unpacks to at most 128 KiB
    # from at least 4 bytes: so it is fed room/2**18 bytes a call (32 to
    # 4096), whose output is at most an eighth of what room is left.
    decoder = zstandard.ZstdDecompressor(max_window_size=DECODER_MEMORY_MAX).decompressobj(read_across_frames=False)
    out = bytearray()
    pos = 0
    try:
        while not decoder.eof:
            if pos >= len(data):
                raise Damaged("the stream ends before its end")
            feed = max(32, min(4096, (limit + 1 - len(out)) >> 18))
            out += decoder.decompress(data[pos : pos + feed])
            pos += feed
            if len(out) > limit:
                raise _over(what, limit)
    except zstandard.ZstdError as exc:
        raise Damaged(f"zstd: {exc}") from exc
    return bytes(out)


def _lz4_legacy(data: bytes, limit: int, what: str) -> bytes:
    """The legacy LZ4 frame `lz4 -l` writes: a magic, then blocks each
    prefixed by its compressed size; the kernel's size word ends it."""
    import lz4.block

    if len(data) < 8:
        raise Damaged("lz4: too short")
    (want,) = struct.unpack_from("<I", data, len(data) - 4)
    (magic,) = struct.unpack("<I", LZ4_LEGACY_MAGIC)
    out = bytearray()
    pos = 4
    while len(out) < want and pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if size == magic:
            continue  # a concatenated frame starts again
        # a block unpacks into a buffer no larger than the room left: one
        # that does not fit is either damaged or past the ceiling
        room = limit + 1 - len(out)
        try:
            out += lz4.block.decompress(data[pos : pos + size], uncompressed_size=min(LZ4_LEGACY_BLOCK, room))
        except lz4.block.LZ4BlockError as exc:
            if room <= LZ4_LEGACY_BLOCK:
                raise _over(what, limit) from None
            raise Damaged(f"lz4: {exc}") from exc
        if len(out) > limit:
            raise _over(what, limit)
        pos += size
    return bytes(out)


DECOMPRESSORS: dict[str, Callable[[bytes, int, str], bytes]] = {
    # wbits 16+: a gzip member (the kernel appends its size after it)
    "gzip": lambda d, n, w: _zlib(d, n, w, 16 + zlib.MAX_WBITS),
    "zlib": lambda d, n, w: _zlib(d, n, w, zlib.MAX_WBITS),
    "bzip2": lambda d, n, w: _library(bz2.BZ2Decompressor(), d, n, w),
    # a decompressor object stops at the end of the stream instead of
    # failing on the size word after it
    "lzma": lambda d, n, w: _library(
        lzma.LZMADecompressor(format=lzma.FORMAT_ALONE, memlimit=DECODER_MEMORY_MAX), d, n, w
    ),
    "xz": lambda d, n, w: _library(lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=DECODER_MEMORY_MAX), d, n, w),
    "zstd": _zstd,
    "lz4": _lz4_legacy,
}


def decompress(data: bytes, fmt: str, limit: int, what: str) -> bytes:
    """``data``, compressed in ``fmt`` (a key of DECOMPRESSORS), unpacked
    step by step: more than ``limit`` bytes out is one BadInput line (naming
    ``what``) as soon as the step that passes it ends; a damaged stream is
    ``Damaged``.  What is held is at most ``limit`` plus one step."""
    try:
        return DECOMPRESSORS[fmt](data, limit, what)
    except (EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        raise Damaged(f"{fmt}: {exc}") from exc


# ------------------------------------------------------------ child processes


class Overdue(Exception):
    """A child process was still running at its deadline (silent or not).
    Raised with the child left running: its caller ends it (and its group)."""


@dataclasses.dataclass
class Tail:
    """The last ``limit`` bytes of a stream (whole chunks are dropped from
    its front, so nothing is copied as it grows), and how many came before."""

    limit: int
    chunks: collections.deque[bytes] = dataclasses.field(default_factory=collections.deque)
    size: int = 0
    dropped: int = 0

    def add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        while self.chunks and self.size - len(self.chunks[0]) >= self.limit:
            first = self.chunks.popleft()
            self.size -= len(first)
            self.dropped += len(first)

    def text(self) -> str:
        data = b"".join(self.chunks)
        extra = max(0, len(data) - self.limit)
        kept = data[extra:].decode(errors="replace")
        dropped = self.dropped + extra
        return f"[{dropped} bytes left out]\n{kept}" if dropped else kept


@dataclasses.dataclass
class Lines:
    """A byte stream cut into lines of at most ``line_max`` bytes each: an
    endless line holds ``line_max`` bytes, the rest of it only counted."""

    line_max: int = LINE_MAX
    partial: bytearray = dataclasses.field(default_factory=bytearray)
    cut: int = 0

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start : end if end >= 0 else len(chunk)]
            room = max(0, self.line_max - len(self.partial))
            self.partial += piece[:room]
            self.cut += max(0, len(piece) - room)
            if end < 0:
                return lines
            lines.append(self._take())
            start = end + 1

    def end(self) -> list[str]:
        return [self._take()] if self.partial or self.cut else []

    def _take(self) -> str:
        text = self.partial.decode(errors="replace")
        if self.cut:
            text += f" [{self.cut} bytes of this line left out]"
        self.partial, self.cut = bytearray(), 0
        return text


@dataclasses.dataclass
class Collected:
    """A child's exit status and the kept tail of each stream it printed
    (a marker line first when bytes were left out)."""

    returncode: int
    stdout: str
    stderr: str


def collect(
    proc: subprocess.Popen[bytes],
    deadline: float,
    *,
    input: bytes | None = None,
    on_line: Callable[[str], None] | None = None,
    keep: int = TAIL_MAX,
    line_max: int = LINE_MAX,
) -> Collected:
    """Everything ``proc`` prints on its pipes, read in chunks as it comes,
    until it ends or ``deadline`` (time.monotonic()) passes, whether or not
    it prints anything meanwhile (then Overdue).  ``input`` is written to
    its stdin pipe as it reads; ``on_line`` gets each stdout line, cut at
    ``line_max`` bytes; each stream keeps its last ``keep`` bytes."""
    poller = select.poll()
    tails = _watch_output(proc, poller, keep)
    out_fd = proc.stdout.fileno() if proc.stdout is not None else -1
    err_fd = proc.stderr.fileno() if proc.stderr is not None else -1
    feed = _watch_input(proc, poller, input)
    lines = Lines(line_max)
    open_fds = set(tails) | ({feed.fd} if feed is not None else set())
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Overdue
        for fd, _events in poller.poll(max(1, int(left * 1000) + 1)):
            if feed is not None and fd == feed.fd:
                ended = feed.send()
            else:
                ended = _read_chunk(fd, tails[fd], lines, on_line if fd == out_fd else None)
            if ended:
                poller.unregister(fd)
                open_fds.discard(fd)
    if on_line is not None:
        for line in lines.end():
            on_line(line)
    try:
        status = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise Overdue from None
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return Collected(
        status,
        tails[out_fd].text() if out_fd in tails else "",
        tails[err_fd].text() if err_fd in tails else "",
    )


def _watch_output(proc: subprocess.Popen[bytes], poller: select.poll, keep: int) -> dict[int, Tail]:
    """Each of the child's output pipes, non-blocking and polled, with the
    tail it keeps."""
    tails: dict[int, Tail] = {}
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            tails[fd] = Tail(keep)
            poller.register(fd, select.POLLIN)
    return tails


@dataclasses.dataclass
class InputFeed:
    """``data`` written to a child's non-blocking stdin pipe as it takes
    it, the pipe closed once all is sent."""

    stdin: IO[bytes]
    fd: int
    data: bytes
    sent: int = 0

    def send(self) -> bool:
        """One chunk more; True once the pipe is done with and closed."""
        try:
            self.sent += os.write(self.fd, self.data[self.sent : self.sent + CHUNK])
        except BlockingIOError:
            return False
        except BrokenPipeError:
            self.sent = len(self.data)  # the child stopped reading: the rest is not wanted
        if self.sent < len(self.data):
            return False
        self.stdin.close()
        return True


def _watch_input(proc: subprocess.Popen[bytes], poller: select.poll, data: bytes | None) -> InputFeed | None:
    """The feed of ``data`` to the child's stdin pipe, polled; with nothing
    to send the pipe is closed at once (None)."""
    if proc.stdin is None:
        return None
    if not data:
        proc.stdin.close()
        return None
    fd = proc.stdin.fileno()
    os.set_blocking(fd, False)
    poller.register(fd, select.POLLOUT)
    return InputFeed(proc.stdin, fd, data)


def _read_chunk(fd: int, tail: Tail, lines: Lines, on_line: Callable[[str], None] | None) -> bool:
    """One chunk of an output pipe into its tail, and into ``on_line`` line
    by line when given; True at the pipe's end."""
    try:
        chunk = os.read(fd, CHUNK)
    except BlockingIOError:
        return False
    if not chunk:
        return True
    tail.add(chunk)
    if on_line is not None:
        for line in lines.feed(chunk):
            on_line(line)
    return False

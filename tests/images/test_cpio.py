"""memqual.images.cpio: the newc writer round-trips through its reader and through
GNU cpio, and the same inputs give the same bytes."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memqual.images import cpio
from memqual.images.cpio import CpioWriter, Entry, add_tree


def archive(build: Callable[[CpioWriter], object]) -> bytes:
    buffer = io.BytesIO()
    writer = CpioWriter(buffer)
    build(writer)
    writer.close()
    return buffer.getvalue()


def sample(writer: CpioWriter) -> None:
    writer.directory("bin")
    writer.file("bin/busybox", b"\x7fELF" + bytes(range(256)) * 5, 0o755)
    writer.symlink("bin/sh", "/bin/busybox")
    writer.directory("dev")
    writer.device("dev/console", True, 5, 1)
    writer.device("dev/sda", False, 8, 0, 0o660)
    writer.directory("tmp", 0o1777)
    writer.file("etc-empty", b"")
    writer.file("odd", b"abc")  # a length that needs padding


def test_round_trip_through_the_reader() -> None:
    entries = {e.name: e for e in cpio.read(archive(sample))}
    assert list(entries) == ["bin", "bin/busybox", "bin/sh", "dev", "dev/console", "dev/sda", "tmp", "etc-empty", "odd"]
    assert entries["bin/busybox"].mode == stat.S_IFREG | 0o755
    assert entries["bin/busybox"].data == b"\x7fELF" + bytes(range(256)) * 5
    assert entries["bin/sh"].mode == stat.S_IFLNK | 0o777 and entries["bin/sh"].data == b"/bin/busybox"
    assert (entries["dev/console"].rdev_major, entries["dev/console"].rdev_minor) == (5, 1)
    assert stat.S_ISCHR(entries["dev/console"].mode) and stat.S_ISBLK(entries["dev/sda"].mode)
    assert entries["tmp"].mode == stat.S_IFDIR | 0o1777
    assert entries["odd"].data == b"abc" and entries["etc-empty"].data == b""


def test_fields_are_fixed_and_records_aligned() -> None:
    data = archive(sample)
    assert len(data) % 512 == 0
    position = 0
    while True:
        header = data[position : position + 110]
        assert header[:6] == b"070701" and position % 4 == 0
        fields = [int(header[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        _ino, _mode, uid, gid, _nlink, mtime, size = fields[:7]
        namesize = fields[11]
        assert (uid, gid, mtime) == (0, 0, 0)  # root-owned, epoch: reproducible
        name = data[position + 110 : position + 110 + namesize - 1]
        if name == b"TRAILER!!!":
            break
        position += 110 + namesize
        position += -position % 4
        position += size + (-size % 4)


def test_same_inputs_same_sha256() -> None:
    first = hashlib.sha256(archive(sample)).hexdigest()
    assert hashlib.sha256(archive(sample)).hexdigest() == first

    def changed(writer: CpioWriter) -> None:
        sample(writer)
        writer.file("extra", b"x")

    assert hashlib.sha256(archive(changed)).hexdigest() != first


@pytest.mark.skipif(shutil.which("cpio") is None, reason="GNU cpio is not installed (apt-get install cpio)")
def test_gnu_cpio_lists_and_extracts_it(tmp_path: Path) -> None:
    data = archive(sample)
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=data, capture_output=True, check=True).stdout
    assert listing.decode().split() == [
        "bin",
        "bin/busybox",
        "bin/sh",
        "dev",
        "dev/console",
        "dev/sda",
        "tmp",
        "etc-empty",
        "odd",
    ]
    verbose = subprocess.run(["cpio", "-tv", "--quiet"], input=data, capture_output=True, check=True).stdout.decode()
    assert "Jan  1  1970" in verbose
    out = tmp_path / "x"
    out.mkdir()
    # extract what an unprivileged run can create (no device nodes)
    subprocess.run(
        ["cpio", "-id", "--quiet", "--no-absolute-filenames", "bin", "bin/*", "odd", "etc-empty"],
        input=data,
        cwd=out,
        check=True,
        capture_output=True,
    )
    assert (out / "odd").read_bytes() == b"abc"
    assert os.readlink(out / "bin/sh") == "/bin/busybox"
    assert (out / "bin/busybox").stat().st_mode & 0o777 == 0o755


def test_duplicate_and_empty_names_are_refused() -> None:
    writer = CpioWriter(io.BytesIO())
    writer.directory("etc")
    with pytest.raises(ValueError, match="duplicate"):
        writer.file("/etc", b"")  # the leading slash is stripped: same name
    with pytest.raises(ValueError, match="empty"):
        writer.file("/", b"")
    with pytest.raises(ValueError, match="reserved"):
        writer.file("TRAILER!!!", b"")  # would end the archive early


def test_truncated_archive_is_an_error() -> None:
    data = archive(sample)
    with pytest.raises(ValueError, match="truncated"):
        list(cpio.read(data[:200]))


def test_add_tree_is_sorted_normalised_and_prefixed(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "b").mkdir(parents=True)
    (root / "b" / "tool").write_bytes(b"#!/bin/sh\n")
    (root / "b" / "tool").chmod(0o700)
    (root / "a.txt").write_bytes(b"hello")
    (root / "a.txt").chmod(0o600)
    (root / "link").symlink_to("b/tool")

    def lib(writer: CpioWriter) -> None:
        writer.directory("lib")
        add_tree(writer, root, "lib")

    data = archive(lib)
    entries = {e.name: e for e in cpio.read(data)}
    assert list(entries) == ["lib", "lib/a.txt", "lib/b", "lib/b/tool", "lib/link"]
    assert entries["lib/a.txt"].mode == stat.S_IFREG | 0o644  # permissions normalised
    assert entries["lib/b/tool"].mode == stat.S_IFREG | 0o755
    assert entries["lib/link"].data == b"b/tool"
    # the host's file times and owners do not leak into the archive
    os.utime(root / "a.txt", (1_000_000, 1_000_000))
    assert archive(lib) == data


names = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/"), min_size=1, max_size=20
).filter(lambda name: name != cpio.TRAILER)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(names, st.binary(max_size=300), min_size=1, max_size=8))
def test_any_files_round_trip(files: dict[str, bytes]) -> None:
    def build(writer: CpioWriter) -> None:
        for name, content in files.items():
            writer.file(name, content)

    entries = list(cpio.read(archive(build)))
    assert [(e.name, e.data) for e in entries] == list(files.items())
    assert all(isinstance(e, Entry) and e.mode == stat.S_IFREG | 0o644 for e in entries)

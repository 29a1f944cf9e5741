"""images/kernel.py within bounds: a decompression bomb in every format
the kernel offers stops at the ceiling in one line, a malformed ELF note is
one line, and neither the release nor the payload reads past its need."""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from kernel_payloads import bzimage, elf_with_pvh_note, lz4_legacy

from memqual.host.core.errors import BadInput
from memqual.images import kernel

CEILING = 256 << 10  # the test's: the real one is 256 MiB
BOMB = 8 << 20  # what the payloads below unpack to

# liblzma's dictionary is its decoder's memory (bounded.DECODER_MEMORY_MAX),
# counted by tracemalloc: 1 MiB here, so that the peak shows the output.
LZMA_DICT = 1 << 20
COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda d: gzip.compress(d, 9),
    "bzip2": lambda d: bz2.compress(d, 9),
    "lzma": lambda d: lzma.compress(
        d, format=lzma.FORMAT_ALONE, filters=[{"id": lzma.FILTER_LZMA1, "dict_size": LZMA_DICT}]
    ),
    "xz": lambda d: lzma.compress(
        d, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": LZMA_DICT}]
    ),
    "zstd": lambda d: zstandard.ZstdCompressor(level=3).compress(d),
    "lz4": lz4_legacy,
}


@pytest.mark.parametrize("name", sorted(COMPRESS))
def test_a_decompression_bomb_stops_at_the_ceiling(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "VMLINUX_MAX", CEILING)
    packed = COMPRESS[name](bytes(BOMB)) + struct.pack("<I", BOMB)
    assert len(packed) < BOMB // 100  # small in, large out
    path = tmp_path / "bzImage"
    path.write_bytes(bzimage(packed))
    tracemalloc.start()
    try:
        with pytest.raises(BadInput, match=rf"\({name}\) unpacks to more than 0.25 MiB: refused") as caught:
            kernel.extract_vmlinux(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(caught.value)
    # the ceiling, a step of the decompressor and the file: never the bomb
    assert peak < BOMB // 2


@pytest.mark.parametrize("name", sorted(COMPRESS))
def test_a_vmlinux_under_the_ceiling_still_comes_out(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel, "VMLINUX_MAX", CEILING)
    elf = elf_with_pvh_note() + bytes(CEILING - 8192)
    path = tmp_path / "bzImage"
    path.write_bytes(bzimage(COMPRESS[name](elf) + struct.pack("<I", len(elf))))
    assert kernel.extract_vmlinux(path) == elf


def _note_elf(**bad: int) -> bytes:
    """The test ELF with one field of its program header or note changed."""
    elf = bytearray(elf_with_pvh_note())
    phoff = 64
    fields = {"e_phnum": (0x36 + 2, "<H"), "e_phoff": (0x20, "<Q"), "p_offset": (phoff + 8, "<Q")}
    fields |= {"p_filesz": (phoff + 32, "<Q"), "namesz": (64 + 56, "<I")}
    for name, value in bad.items():
        offset, form = fields[name]
        struct.pack_into(form, elf, offset, value)
    return bytes(elf)


@pytest.mark.parametrize(
    "bad",
    [
        {"e_phoff": 1 << 40},
        {"e_phnum": 4000},
        {"p_offset": 1 << 40},
        {"p_filesz": 1 << 40},
        {"namesz": 0xFFFFFFF0},
    ],
    ids=lambda bad: next(iter(bad)),
)
def test_a_malformed_elf_note_is_one_line(bad: dict[str, int]) -> None:
    with pytest.raises(BadInput, match="a malformed ELF vmlinux") as caught:
        kernel.has_pvh_entry(_note_elf(**bad), "bzImage")
    assert "\n" not in str(caught.value)


def test_a_malformed_elf_in_a_bzimage_is_one_line(tmp_path: Path) -> None:
    elf = _note_elf(p_filesz=1 << 40)
    path = tmp_path / "bzImage"
    path.write_bytes(bzimage(gzip.compress(elf) + struct.pack("<I", len(elf))))
    with pytest.raises(BadInput, match=r"bzImage: a malformed ELF vmlinux \(a note segment at 120"):
        kernel.extract_vmlinux(path)


def test_read_release_reads_only_the_header(tmp_path: Path) -> None:
    setup = bytearray(0x400)
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x20E, 0x100)  # the release string at 0x300
    setup[0x300:0x310] = b"6.18.0-test (x)\0"
    path = tmp_path / "bzImage"
    with path.open("wb") as out:
        out.write(setup)
        out.truncate(64 << 20)  # sparse: a bzImage of 64 MiB
    tracemalloc.start()
    try:
        assert kernel.read_release(path) == "6.18.0-test"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_an_oversize_bzimage_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "BZIMAGE_MAX", 1 << 20)
    path = tmp_path / "bzImage"
    with path.open("wb") as out:
        out.truncate(2 << 20)
    with pytest.raises(BadInput, match="more than a kernel may have"):
        kernel.extract_vmlinux(path)

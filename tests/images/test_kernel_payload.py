"""images/kernel.py: the vmlinux taken out of a bzImage, whatever the
kernel's compressor, and a damaged or foreign payload refused without a
traceback (the bzImage then boots as it is)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
from pathlib import Path

import pytest
import zstandard
from kernel_payloads import bzimage, elf_with_pvh_note, lz4_legacy

from memqual.images import kernel

COMPRESS = {
    "gzip": lambda d: gzip.compress(d),
    "bzip2": lambda d: bz2.compress(d),
    "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
    "xz": lambda d: lzma.compress(d, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32),
    "zstd": lambda d: zstandard.ZstdCompressor(level=19).compress(d),
    "lz4": lz4_legacy,
}


@pytest.mark.parametrize("name", sorted(COMPRESS))
def test_every_kernel_compressor_gives_the_vmlinux(tmp_path: Path, name: str) -> None:
    elf = elf_with_pvh_note()
    # The kernel's build appends the uncompressed size to the payload.
    packed = COMPRESS[name](elf) + struct.pack("<I", len(elf))
    assert kernel.compression(packed) == name
    path = tmp_path / "bzImage"
    path.write_bytes(bzimage(packed))
    assert kernel.extract_vmlinux(path) == elf


def test_a_kernel_without_pvh_boots_as_abzimage(tmp_path: Path) -> None:
    elf = elf_with_pvh_note(pvh=False)
    path = tmp_path / "bzImage"
    path.write_bytes(bzimage(gzip.compress(elf) + struct.pack("<I", len(elf))))
    assert kernel.extract_vmlinux(path) is None


@pytest.mark.parametrize("name", sorted(COMPRESS))
def test_a_damaged_payload_is_none_not_a_traceback(tmp_path: Path, name: str) -> None:
    packed = bytearray(COMPRESS[name](elf_with_pvh_note()))
    # Keep the magic, ruin what follows: a false match of a format.
    for i in range(8, min(len(packed), 200)):
        packed[i] ^= 0x5A
    path = tmp_path / "bzImage"
    path.write_bytes(bzimage(bytes(packed) + b"\0\0\0\0"))
    assert kernel.extract_vmlinux(path) is None


def test_lzo_and_unknown_payloads_and_old_headers_boot_thebzimage(tmp_path: Path) -> None:
    path = tmp_path / "bzImage"
    path.write_bytes(bzimage(b"\x89LZO\0" + b"\1" * 100))
    assert kernel.extract_vmlinux(path) is None
    path.write_bytes(bzimage(b"not a compressed kernel"))
    assert kernel.extract_vmlinux(path) is None
    # Before protocol 2.08 the header does not say where the payload is.
    path.write_bytes(bzimage(gzip.compress(elf_with_pvh_note()), protocol=0x207))
    assert kernel.extract_vmlinux(path) is None
    path.write_bytes(b"MZ" + b"\0" * 100)
    assert kernel.extract_vmlinux(path) is None

"""images/kernel.py: the vmlinux taken out of a bzImage, whatever the
kernel's compressor, and a damaged or foreign payload refused without a
traceback (the bzImage then boots as it is)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
from pathlib import Path

import lz4.block
import pytest
import zstandard

from memqual.images import kernel


def _elf_with_pvh_note(pvh: bool = True) -> bytes:
    """A minimal ELF64 with one PT_NOTE: the Xen PHYS32_ENTRY note QEMU's
    PVH boot looks for (or another note)."""
    name = b"Xen\0"
    desc = struct.pack("<I", 0x1000000)
    note_type = kernel.XEN_ELFNOTE_PHYS32_ENTRY if pvh else 1
    note = struct.pack("<III", len(name), len(desc), note_type) + name + desc
    ehdr_size, phdr_size = 64, 56
    ehdr = bytearray(ehdr_size)
    ehdr[:4] = kernel.ELF_MAGIC
    ehdr[4] = 2  # ELFCLASS64
    struct.pack_into("<Q", ehdr, 0x20, ehdr_size)  # e_phoff
    struct.pack_into("<HH", ehdr, 0x36, phdr_size, 1)  # e_phentsize, e_phnum
    note_off = ehdr_size + phdr_size
    phdr = struct.pack("<IIQQQQQQ", 4, 0, note_off, 0, 0, len(note), len(note), 4)
    return bytes(ehdr) + phdr + note + b"\0" * 4096


def _bzimage(packed: bytes, protocol: int = 0x20F, setup_sects: int = 1) -> bytes:
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, protocol)
    decompressor = b"\x90" * 300 + b"\x1f\x8b\x08" + b"\x90" * 97  # a stray gzip magic in the code
    struct.pack_into("<II", setup, 0x248, len(decompressor), len(packed))
    return bytes(setup) + decompressor + packed + b"\0" * 64


def _lz4_legacy(data: bytes) -> bytes:
    out = bytearray(kernel.LZ4_LEGACY_MAGIC)
    for start in range(0, len(data), kernel.LZ4_LEGACY_BLOCK):
        block = lz4.block.compress(data[start : start + kernel.LZ4_LEGACY_BLOCK], store_size=False)
        out += struct.pack("<I", len(block)) + block
    return bytes(out)


COMPRESS = {
    "gzip": lambda d: gzip.compress(d),
    "bzip2": lambda d: bz2.compress(d),
    "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
    "xz": lambda d: lzma.compress(d, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32),
    "zstd": lambda d: zstandard.ZstdCompressor(level=19).compress(d),
    "lz4": _lz4_legacy,
}


@pytest.mark.parametrize("name", sorted(COMPRESS))
def test_every_kernel_compressor_gives_the_vmlinux(tmp_path: Path, name: str) -> None:
    elf = _elf_with_pvh_note()
    # The kernel's build appends the uncompressed size to the payload.
    packed = COMPRESS[name](elf) + struct.pack("<I", len(elf))
    assert kernel.compression(packed) == name
    path = tmp_path / "bzImage"
    path.write_bytes(_bzimage(packed))
    assert kernel.extract_vmlinux(path) == elf


def test_a_kernel_without_pvh_boots_as_a_bzimage(tmp_path: Path) -> None:
    elf = _elf_with_pvh_note(pvh=False)
    path = tmp_path / "bzImage"
    path.write_bytes(_bzimage(gzip.compress(elf) + struct.pack("<I", len(elf))))
    assert kernel.extract_vmlinux(path) is None


@pytest.mark.parametrize("name", sorted(COMPRESS))
def test_a_damaged_payload_is_none_not_a_traceback(tmp_path: Path, name: str) -> None:
    packed = bytearray(COMPRESS[name](_elf_with_pvh_note()))
    # Keep the magic, ruin what follows: a false match of a format.
    for i in range(8, min(len(packed), 200)):
        packed[i] ^= 0x5A
    path = tmp_path / "bzImage"
    path.write_bytes(_bzimage(bytes(packed) + b"\0\0\0\0"))
    assert kernel.extract_vmlinux(path) is None


def test_lzo_and_unknown_payloads_and_old_headers_boot_the_bzimage(tmp_path: Path) -> None:
    path = tmp_path / "bzImage"
    path.write_bytes(_bzimage(b"\x89LZO\0" + b"\1" * 100))
    assert kernel.extract_vmlinux(path) is None
    path.write_bytes(_bzimage(b"not a compressed kernel"))
    assert kernel.extract_vmlinux(path) is None
    # Before protocol 2.08 the header does not say where the payload is.
    path.write_bytes(_bzimage(gzip.compress(_elf_with_pvh_note()), protocol=0x207))
    assert kernel.extract_vmlinux(path) is None
    path.write_bytes(b"MZ" + b"\0" * 100)
    assert kernel.extract_vmlinux(path) is None

"""A bzImage around a payload, the ELF vmlinux inside it (one PT_NOTE,
with or without the PVH entry note) and the kernel's legacy LZ4 frames:
what tests of images/kernel.py unpack."""

from __future__ import annotations

import struct

import lz4.block

from memqual.images import kernel


def elf_with_pvh_note(pvh: bool = True) -> bytes:
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


def bzimage(packed: bytes, protocol: int = 0x20F, setup_sects: int = 1) -> bytes:
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, protocol)
    decompressor = b"\x90" * 300 + b"\x1f\x8b\x08" + b"\x90" * 97  # a stray gzip magic in the code
    struct.pack_into("<II", setup, 0x248, len(decompressor), len(packed))
    return bytes(setup) + decompressor + packed + b"\0" * 64


def lz4_legacy(data: bytes) -> bytes:
    out = bytearray(kernel.LZ4_LEGACY_MAGIC)
    for start in range(0, len(data), kernel.LZ4_LEGACY_BLOCK):
        block = lz4.block.compress(data[start : start + kernel.LZ4_LEGACY_BLOCK], store_size=False)
        out += struct.pack("<I", len(block)) + block
    return bytes(out)

"""Kernel files: the release string of a bzImage and the uncompressed
vmlinux inside it.

Why extract: under TCG most of a cold boot is the XZ decompressor running
emulated.  Debian's kernel has CONFIG_PVH=y, so the ELF vmlinux boots
directly through its PVH entry (``-kernel vmlinux``), skipping the
decompressor (about 7 s -> under 4 s here).  Every compressor the kernel
offers (gzip, bzip2, LZMA, XZ, LZ4, zstd) is read here except LZO, whose
kernels boot as bzImages.
"""

from __future__ import annotations

import bz2
import lzma
import re
import struct
import zlib
from pathlib import Path

from memqual.host.core.errors import BadInput

ELF_MAGIC = b"\x7fELF"
XEN_ELFNOTE_PHYS32_ENTRY = 18  # the PVH entry point note
# Boot protocol 2.08 added payload_offset/payload_length to the setup header.
PAYLOAD_PROTOCOL = 0x208
LZ4_LEGACY_BLOCK = 8 << 20  # the kernel's `lz4 -l` frames: 8 MiB blocks
# The kernel's release (UTS_RELEASE, what `uname -r` prints) is
# $(VERSION).$(PATCHLEVEL).$(SUBLEVEL)$(EXTRAVERSION)$(LOCALVERSION) and
# kbuild refuses one longer than __NEW_UTS_LEN (64).  memqual turns it into
# the path lib/modules/RELEASE, so only what a release is made of in
# practice passes: it starts with the version's numbers, then letters,
# digits and . _ + ~ - only (no '/', space or control character), and never
# holds '..'.
UTS_RELEASE_MAX = 64
RELEASE_FORM = re.compile(r"[0-9]+\.[0-9]+[0-9A-Za-z._+~-]*")


def read_release(bzimage: Path) -> str:
    """The kernel release (``uname -r``) from the bzImage setup header."""
    data = bzimage.read_bytes()[:0x10000]
    if len(data) < 0x210 or data[0x202:0x206] != b"HdrS":
        raise BadInput(f"{bzimage}: not a bzImage (no HdrS setup header); pass a bzImage from arch/x86/boot")
    (offset,) = struct.unpack_from("<H", data, 0x20E)
    raw = data[offset + 0x200 : offset + 0x200 + 256]
    # The header holds UTS_RELEASE, a space, then the build's user and date.
    release = raw.split(b"\0", 1)[0].split(b" ", 1)[0]
    return check_release(release.decode("ascii", errors="replace"), str(bzimage))


def check_release(release: str, where: str) -> str:
    """``release`` when it has the kernel's release form (see RELEASE_FORM);
    anything else, which would become a path outside lib/modules, is one
    BadInput line naming ``where`` it came from."""
    if len(release) > UTS_RELEASE_MAX or ".." in release or not RELEASE_FORM.fullmatch(release):
        raise BadInput(
            f"{where}: kernel release {release[:80]!r} is not a kernel release "
            f"(digits.digits then [0-9A-Za-z._+~-], at most {UTS_RELEASE_MAX} characters, no '..'): "
            "pass a kernel built by kbuild"
        )
    return release


def payload(blob: bytes) -> bytes | None:
    """The compressed kernel inside a bzImage, located by its setup header
    (never by searching for a magic, which can match by chance inside the
    decompressor's code); None for a header older than protocol 2.08."""
    if len(blob) < 0x250 or blob[0x202:0x206] != b"HdrS":
        return None
    (protocol,) = struct.unpack_from("<H", blob, 0x206)
    if protocol < PAYLOAD_PROTOCOL:
        return None
    setup_sects = blob[0x1F1] or 4
    offset, length = struct.unpack_from("<II", blob, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if length == 0 or start + length > len(blob):
        return None
    return blob[start : start + length]


def compression(data: bytes) -> str | None:
    """Which of the kernel's compressors (CONFIG_KERNEL_*) made ``data``."""
    for name, magic in COMPRESSORS:
        if data.startswith(magic):
            return name
    return None


def decompress(data: bytes) -> bytes | None:
    """The payload decompressed, or None when it is damaged or its format
    has no decompressor here (the bzImage then boots as it is)."""
    name = compression(data)
    if name is None:
        return None
    try:
        return _DECOMPRESS[name](data)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError):
        return None


def extract_vmlinux(bzimage: Path) -> bytes | None:
    """The ELF vmlinux compressed inside ``bzimage``, or None when it cannot
    be had or has no PVH entry (then the bzImage is booted as it is)."""
    blob = bzimage.read_bytes()
    packed = payload(blob)
    if packed is None:
        return None
    elf = decompress(packed)
    if elf and elf.startswith(ELF_MAGIC) and has_pvh_entry(elf):
        return elf
    return None


def _gunzip(data: bytes) -> bytes:
    # wbits 16+: a gzip member; the kernel appends its size after it.
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)


def _bunzip2(data: bytes) -> bytes:
    return bz2.BZ2Decompressor().decompress(data)


def _unlzma(data: bytes) -> bytes:
    # The stream is followed by the size word: a decompressor object stops
    # at the end of the stream instead of failing on trailing bytes.
    return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(data)


def _unxz(data: bytes) -> bytes:
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)


def _unzstd(data: bytes) -> bytes:
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd: {exc}") from exc


def _unlz4(data: bytes) -> bytes:
    """The legacy LZ4 frame `lz4 -l` writes: a magic, then blocks each
    prefixed by its compressed size; the kernel's size word ends it."""
    import lz4.block

    (want,) = struct.unpack_from("<I", data, len(data) - 4)
    out = bytearray()
    pos = 4
    while len(out) < want and pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if size == struct.unpack("<I", LZ4_LEGACY_MAGIC)[0]:
            continue  # a concatenated frame starts again
        try:
            out += lz4.block.decompress(data[pos : pos + size], uncompressed_size=LZ4_LEGACY_BLOCK)
        except lz4.block.LZ4BlockError as exc:
            raise ValueError(f"lz4: {exc}") from exc
        pos += size
    return bytes(out)


def _unlzo(data: bytes) -> bytes | None:
    """LZO needs liblzo2, which no pinned Python package ships: such a
    kernel boots as a bzImage, through its own decompressor."""
    del data
    return None


LZ4_LEGACY_MAGIC = b"\x02\x21\x4c\x18"
COMPRESSORS = (
    ("gzip", b"\x1f\x8b"),
    ("bzip2", b"BZh"),
    ("lzma", b"\x5d\x00\x00"),
    ("xz", b"\xfd7zXZ\x00"),
    ("lzo", b"\x89LZO"),
    ("lz4", LZ4_LEGACY_MAGIC),
    ("zstd", b"\x28\xb5\x2f\xfd"),
)
_DECOMPRESS = {
    "gzip": _gunzip,
    "bzip2": _bunzip2,
    "lzma": _unlzma,
    "xz": _unxz,
    "lzo": _unlzo,
    "lz4": _unlz4,
    "zstd": _unzstd,
}


def has_pvh_entry(elf: bytes) -> bool:
    """True if the ELF has a Xen PHYS32_ENTRY note (what QEMU boots via PVH)."""
    if elf[4] != 2:  # ELFCLASS64 only
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False

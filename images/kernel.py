"""Kernel files: the release string of a bzImage and the uncompressed
vmlinux inside it.  Why extract: under TCG most of a cold boot is the XZ decompressor running
emulated.  Debian's kernel has CONFIG_PVH=y, so the ELF vmlinux boots
directly through its PVH entry (``-kernel vmlinux``), skipping the
decompressor (about 7 s -> under 4 s here).  Every compressor the kernel
offers (gzip, bzip2, LZMA, XZ, LZ4, zstd) is read here except LZO, whose
kernels boot as bzImages.  A kernel from a user or a patched build is read
within bounds (host/core/bounded.py: at most VMLINUX_MAX unpacked) and its
ELF's offsets are checked before they are used."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput

ELF_MAGIC = b"\x7fELF"
XEN_ELFNOTE_PHYS32_ENTRY = 18  # the PVH entry point note
# Boot protocol 2.08 added payload_offset/payload_length to the setup header.
PAYLOAD_PROTOCOL = 0x208
# A vmlinux is 30 to 70 MiB (an allyesconfig's, with its symbols, more):
# what a payload unpacks to beyond this is refused, not held.
VMLINUX_MAX = 256 << 20
# A bzImage is its setup, its decompressor and the compressed vmlinux.
BZIMAGE_MAX = 128 << 20
# The setup header, and the release string it points to, lie in the
# bzImage's first 64 KiB.
HEADER_READ = 0x10000
NOT_A_BZIMAGE = "pass a bzImage from arch/x86/boot"
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
    data = bounded.read_head(bzimage, HEADER_READ, "kernel", NOT_A_BZIMAGE)
    if len(data) < 0x210 or data[0x202:0x206] != b"HdrS":
        raise BadInput(f"{bzimage}: not a bzImage (no HdrS setup header); {NOT_A_BZIMAGE}")
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


def decompress(data: bytes, what: str = "the kernel's payload") -> bytes | None:
    """The payload decompressed, or None when it is damaged or its format
    has no decompressor here (the bzImage then boots as it is).  More than
    VMLINUX_MAX bytes out is one BadInput line, as soon as it is passed."""
    name = compression(data)
    if name is None or name == "lzo":
        # LZO needs liblzo2, which no pinned Python package ships: such a
        # kernel boots as a bzImage, through its own decompressor.
        return None
    try:
        return bounded.decompress(data, name, VMLINUX_MAX, f"{what} ({name})")
    except bounded.Damaged:
        return None


def extract_vmlinux(bzimage: Path) -> bytes | None:
    """The ELF vmlinux compressed inside ``bzimage``, or None when it cannot
    be had or has no PVH entry (then the bzImage is booted as it is)."""
    blob = bounded.read_file(bzimage, BZIMAGE_MAX, "kernel", NOT_A_BZIMAGE)
    packed = payload(blob)
    if packed is None:
        return None
    elf = decompress(packed, f"{bzimage}: the compressed kernel")
    if elf and elf.startswith(ELF_MAGIC) and has_pvh_entry(elf, str(bzimage)):
        return elf
    return None


LZ4_LEGACY_MAGIC = bounded.LZ4_LEGACY_MAGIC
LZ4_LEGACY_BLOCK = bounded.LZ4_LEGACY_BLOCK
COMPRESSORS = (
    ("gzip", b"\x1f\x8b"),
    ("bzip2", b"BZh"),
    ("lzma", b"\x5d\x00\x00"),
    ("xz", b"\xfd7zXZ\x00"),
    ("lzo", b"\x89LZO"),
    ("lz4", LZ4_LEGACY_MAGIC),
    ("zstd", b"\x28\xb5\x2f\xfd"),
)
ELF64_HEADER = 64
ELF64_PHDR = 56
NOTE_HEADER = 12


def has_pvh_entry(elf: bytes, where: str = "the vmlinux") -> bool:
    """True if the ELF has a Xen PHYS32_ENTRY note (what QEMU boots via
    PVH).  Every offset and size the ELF gives is checked against its
    length first: one that points outside it is one BadInput line."""

    def malformed(why: str) -> BadInput:
        return BadInput(f"{where}: a malformed ELF vmlinux ({why}): pass a kernel built by kbuild")

    if len(elf) < ELF64_HEADER:
        raise malformed(f"{len(elf)} bytes, shorter than its header")
    if elf[4] != 2:  # ELFCLASS64 only
        return False
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    if phnum and (phentsize < ELF64_PHDR or phoff + phnum * phentsize > len(elf)):
        raise malformed(f"program headers at {phoff}, {phnum} of {phentsize} bytes, outside its {len(elf)} bytes")
    for i in range(phnum):
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        end = p_offset + p_filesz
        if end > len(elf):
            raise malformed(f"a note segment at {p_offset} of {p_filesz} bytes, outside its {len(elf)} bytes")
        pos = p_offset
        while pos + NOTE_HEADER <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            size = NOTE_HEADER + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
            if pos + size > end:
                raise malformed(f"a note at {pos} of {size} bytes, beyond its segment's end at {end}")
            name = elf[pos + NOTE_HEADER : pos + NOTE_HEADER + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += size
    return False

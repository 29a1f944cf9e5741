"""A tiny stand-in for a user's kernel build (``--kernel BZIMAGE --modules
DIR``): a file with a bzImage setup header that names a release, and a
lib/modules/RELEASE tree whose modules.builtin says the guest drivers are
built in.  Enough for the image builder; it never boots."""

from __future__ import annotations

import struct
from pathlib import Path

RELEASE = "6.1.0-memqual-fake"
BUILTIN = (
    "kernel/drivers/virtio/virtio_mmio.ko",
    "kernel/drivers/virtio/virtio_pci.ko",
    "kernel/drivers/net/virtio_net.ko",
    "kernel/drivers/virtio/virtio_balloon.ko",
)


def bzimage_bytes(release: str = RELEASE, salt: bytes = b"") -> bytes:
    """Setup header: 'HdrS' at 0x202, the version string's offset (minus
    0x200) at 0x20E; ``salt`` changes the bytes, not the release."""
    data = bytearray(0x1000)
    data[0x202:0x206] = b"HdrS"
    offset = 0x300
    struct.pack_into("<H", data, 0x20E, offset)
    version = f"{release} (memqual@test) #1 SMP".encode() + b"\0"
    data[offset + 0x200 : offset + 0x200 + len(version)] = version
    return bytes(data) + salt


def make(root: Path, release: str = RELEASE) -> tuple[Path, Path]:
    """Write bzImage and lib/modules/RELEASE under ``root``; returns both."""
    bzimage = root / "bzImage"
    root.mkdir(parents=True, exist_ok=True)
    bzimage.write_bytes(bzimage_bytes(release))
    modules = root / "lib" / "modules" / release
    (modules / "kernel/extra").mkdir(parents=True, exist_ok=True)
    (modules / "modules.builtin").write_text("\n".join(BUILTIN) + "\n")
    (modules / "modules.dep").write_text("kernel/extra/dummy.ko:\n")
    (modules / "modules.order").write_text("kernel/extra/dummy.ko\n")
    (modules / "kernel/extra/dummy.ko").write_bytes(b"\0" * 64)
    return bzimage, modules

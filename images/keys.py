"""SSH keys, generated per image and kept only in the cache (mode 0600).

The client key is ed25519 (generated with ``cryptography``, loaded by
paramiko); the guest's dropbear host key is made by ``dropbearkey``.  Both
go into a small second cpio appended to the initramfs, so the base
initramfs stays reproducible (same inputs, same sha256)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from host.errors import CapabilityMissing
from images.cpio import CpioWriter


def generate(directory: Path) -> tuple[Path, bytes]:
    """Write the client private key and the keys cpio into ``directory``.
    Returns (client key path, keys cpio bytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    private = Ed25519PrivateKey.generate()
    key_path = directory / "id_ed25519"
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(
            private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)

    dropbearkey = shutil.which("dropbearkey") or "/usr/bin/dropbearkey"
    if not Path(dropbearkey).exists():
        raise CapabilityMissing("dropbearkey not found: run ./setup (installs dropbear-bin)")
    host_key = directory / "dropbear_ed25519_host_key"
    host_key.unlink(missing_ok=True)
    subprocess.run([dropbearkey, "-t", "ed25519", "-f", str(host_key)], check=True, capture_output=True)
    os.chmod(host_key, 0o600)

    buffer = io.BytesIO()
    writer = CpioWriter(buffer)
    writer.directory("root/.ssh", 0o700)
    writer.file("root/.ssh/authorized_keys", public + b" memqual\n", 0o600)
    writer.directory("etc/dropbear", 0o700)
    writer.file("etc/dropbear/dropbear_ed25519_host_key", host_key.read_bytes(), 0o600)
    writer.close()
    return key_path, buffer.getvalue()

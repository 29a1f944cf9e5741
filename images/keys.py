"""SSH keys, generated per image and kept only in the cache (mode 0600).

The client key is ed25519 (generated with ``cryptography``, loaded by
paramiko); the guest's dropbear host key is made by ``dropbearkey``.  Both
go into a small second cpio appended to the initramfs, so the base
initramfs stays reproducible (same inputs, same sha256).

The host key's public half is kept beside the client key
(``host_key.pub``): the host side accepts that key and no other, so a
process that grabbed the forwarded port cannot pose as the guest."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from memqual.host.core.errors import CapabilityMissing, GuestError
from memqual.host.core.paths import write_private_atomic
from memqual.images.cpio import CpioWriter

HOST_KEY = "dropbear_ed25519_host_key"
HOST_KEY_PUB = "host_key.pub"


def _dropbearkey() -> str:
    exe = shutil.which("dropbearkey") or "/usr/bin/dropbearkey"
    if not Path(exe).exists():
        raise CapabilityMissing("dropbearkey not found: run ./setup (installs dropbear-bin)")
    return exe


def _public_line(host_key: Path) -> str:
    """'ssh-ed25519 AAAA...' of a dropbear host key file."""
    proc = subprocess.run([_dropbearkey(), "-y", "-f", str(host_key)], capture_output=True, text=True, timeout=30)
    for line in proc.stdout.splitlines():
        if line.startswith("ssh-"):
            return " ".join(line.split()[:2])
    raise GuestError(f"dropbearkey -y gave no public key for {host_key}: {proc.stderr.strip()[-200:]}")


def host_public_key(ssh_dir: Path) -> str:
    """The guest's SSH host key ('ssh-ed25519 AAAA...') of the image whose
    keys are in ``ssh_dir``.  Images built before the key was kept get it
    derived from the host key file once."""
    pub = ssh_dir / HOST_KEY_PUB
    try:
        text = pub.read_text().strip()
    except FileNotFoundError:
        private = ssh_dir / HOST_KEY
        if not private.exists():
            raise GuestError(
                f"no SSH host key for the image in {ssh_dir.parent}: rebuild it ('memqual image build --force')"
            ) from None
        text = _public_line(private)
        write_private_atomic(pub, (text + "\n").encode(), 0o644)
    return text


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

    host_key = directory / HOST_KEY
    host_key.unlink(missing_ok=True)
    subprocess.run([_dropbearkey(), "-t", "ed25519", "-f", str(host_key)], check=True, capture_output=True, timeout=60)
    os.chmod(host_key, 0o600)
    (directory / HOST_KEY_PUB).write_text(_public_line(host_key) + "\n")

    buffer = io.BytesIO()
    writer = CpioWriter(buffer)
    writer.directory("root/.ssh", 0o700)
    writer.file("root/.ssh/authorized_keys", public + b" memqual\n", 0o600)
    writer.directory("etc/dropbear", 0o700)
    writer.file("etc/dropbear/dropbear_ed25519_host_key", host_key.read_bytes(), 0o600)
    writer.close()
    return key_path, buffer.getvalue()

"""Guest agents: every guest/<name>.c is a program built static with the
host gcc and streamed into the guest over SSH when a test needs it.

They are not baked into the initramfs on purpose: changing an agent must
not change the image (and so invalidate every saved warm-start snapshot).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from host.errors import BadInput, CapabilityMissing
from host.paths import REPO_ROOT, cache_dir

GUEST_DIR = REPO_ROOT / "guest"
CFLAGS = ["-static", "-O2", "-Wall", "-Wextra", "-D_GNU_SOURCE"]


def available() -> list[str]:
    return sorted(p.stem for p in GUEST_DIR.glob("*.c"))


def build_agent(name: str) -> Path:
    """The static binary of guest/<name>.c, built once per source hash."""
    source = GUEST_DIR / f"{name}.c"
    if not source.exists():
        raise BadInput(f"no guest agent {name!r}: expected {source} (agents: {', '.join(available())})")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise CapabilityMissing("gcc not found: run ./setup (installs gcc) to build guest agents")
    # The headers the agents share (guest/*.h) are part of every agent.
    material = source.read_bytes() + " ".join(CFLAGS).encode()
    for header in sorted(GUEST_DIR.glob("*.h")):
        material += header.name.encode() + header.read_bytes()
    digest = hashlib.sha256(material).hexdigest()[:16]
    out_dir = cache_dir() / "agents"
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / f"{name}-{digest}"
    if binary.exists():
        return binary
    tmp = binary.with_name(binary.name + f".tmp{os.getpid()}")
    proc = subprocess.run([gcc, *CFLAGS, "-o", str(tmp), str(source)], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BadInput(f"building guest agent {name} failed: {proc.stderr.strip().splitlines()[0:1]}")
    os.replace(tmp, binary)  # atomic: parallel builders never see half a file
    return binary

"""Guest agents: every guest/<name>.c is a program built static with the
host gcc and streamed into the guest over SSH when a test needs it.

They are not baked into the initramfs on purpose: changing an agent must
not change the image (and so invalidate every saved warm-start snapshot).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.paths import cache_dir, shipped, write_private_atomic

log = logging.getLogger("memqual.agents")

GUEST_DIR = shipped("guest")
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
    sums = binary.with_name(binary.name + ".sha256")
    try:
        if sums.read_text().strip() == _sha256(binary):
            return binary
        log.warning("guest agent %s does not match its recorded sha256: building it again", binary)
    except OSError:
        pass  # not built yet, or built by an older memqual without a sum: build it
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([gcc, *CFLAGS, "-o", tmp, str(source)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise BadInput(f"building guest agent {name} failed: {proc.stderr.strip().splitlines()[0:1]}")
        os.chmod(tmp, 0o755)
        write_private_atomic(sums, (_sha256(Path(tmp)) + "\n").encode(), 0o644)
        os.replace(tmp, binary)  # atomic: parallel builders never see half a file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return binary


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

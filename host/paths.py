"""Where memqual keeps things: the cache (images, snapshots) and short
temporary directories for UNIX sockets (Avocado's work dirs exceed the
108-byte AF_UNIX limit)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """The user's cache directory for memqual (``$MEMQUAL_CACHE`` overrides)."""
    override = os.environ.get("MEMQUAL_CACHE")
    if override:
        base = Path(override)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memqual"
    base.mkdir(parents=True, exist_ok=True)
    return base


def short_tempdir(prefix: str = "mq") -> Path:
    """A fresh private directory with a short path, for sockets: in /tmp,
    or in ``$MEMQUAL_SOCKET_DIR`` (keep it short: a socket path must stay
    under 108 bytes).  Not $TMPDIR, which runners set to long paths."""
    return Path(tempfile.mkdtemp(prefix=prefix + "-", dir=os.environ.get("MEMQUAL_SOCKET_DIR", "/tmp")))

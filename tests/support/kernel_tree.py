"""A kernel tree `memqual kernel build` kept unpacked on this machine, for
the tests that check the scenario rows' kernel and host paths exist."""

from __future__ import annotations

from pathlib import Path


def unpacked_tree() -> Path | None:
    """The first kept base tree of linux-source-6.1, or None."""
    parent = Path("/var/tmp/memqual-kbuild")
    try:
        return next((p / "linux" for p in sorted(parent.glob("base-*")) if (p / "linux/Kconfig").is_file()), None)
    except OSError:
        return None

"""Whether this host can build a memqual image: the tests that build one
are marked ``needs_host_tools`` and skip, naming what to install, where it
cannot."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memqual.images import build as build_module


def _missing() -> list[str]:
    """The host tools an image build needs that this host lacks."""
    missing = [str(p) for p in (build_module.BUSYBOX, build_module.DROPBEAR) if not p.exists()]
    if not shutil.which("dropbearkey"):
        missing.append("dropbearkey")
    if not shutil.which("depmod") and not Path("/usr/sbin/depmod").exists():
        missing.append("depmod")
    return missing


MISSING = _missing()
needs_host_tools = pytest.mark.skipif(
    bool(MISSING),
    reason=f"no {', '.join(MISSING)}: busybox-static, dropbear-bin and kmod are needed to build an image (run ./setup)",
)

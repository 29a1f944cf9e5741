"""A Debian kernel as the A/B and the bisect name it: ``VERSION`` or
``VERSION:extra kernel command line``, checked before anything runs."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from memqual.host.core.errors import BadInput

# What may follow "VERSION:" -- kernel parameters, nothing a shell or QEMU's
# option parser would read differently (the line reaches QEMU as one argv
# element through -append).
CMDLINE_WORDS = re.compile(r"[A-Za-z0-9_.,=+/:@ -]*")


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One kernel of a series: a Debian kernel and its extra command line."""

    version: str
    cmdline_extra: str = ""

    @property
    def name(self) -> str:
        return f"{self.version}:{self.cmdline_extra}" if self.cmdline_extra else self.version

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "cmdline_extra": self.cmdline_extra}


def parse_kernel(text: str) -> KernelSpec:
    """ "VERSION" or "VERSION:extra kernel command line".  A Debian kernel
    release or package name has no colon, so the first one separates."""
    version, _, extra = text.strip().partition(":")
    version, extra = version.strip(), " ".join(extra.split())
    if not version:
        raise BadInput(f"kernel {text!r}: give a Debian kernel version (memqual image kernels lists them)")
    if not CMDLINE_WORDS.fullmatch(extra):
        raise BadInput(
            f"kernel {text!r}: the command line after ':' may hold letters, digits, spaces and _ . , = + / : @ - only"
        )
    return KernelSpec(version, extra)

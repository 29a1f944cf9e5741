"""The line under a page's title that says where a run's figures come
from: the accelerator and why, the host kernel, QEMU, the clock in words a
reader needs, the guest's CPU and kernel (``EnvironmentLine``, from a
results file's environment), as a typed value the templates
(host/report/templates/macros.html.j2) lay out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class EnvironmentLine:
    """Where a run's figures come from, in one line under a page's title:
    the accelerator (in bold) and why, then host kernel, QEMU and guest
    kernel."""

    accel: str = ""
    accel_reason: str = ""
    rest: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.accel or self.rest)

    @property
    def text(self) -> str:
        accel = self.accel + (f" ({self.accel_reason})" if self.accel_reason else "")
        return " · ".join(bit for bit in (accel, *self.rest) if bit)


def clock_words(label: str, vcpus: Any = None) -> str:
    """The clock of a results file's guests, in words a reader needs: on
    icount a guest-timed figure counts guest instructions, not time."""
    if label.startswith("icount"):
        shift = label.partition(":")[2] or "?"
        turns = f", {vcpus} vCPUs taking turns in one thread" if isinstance(vcpus, int) and vcpus > 1 else ""
        return (
            f"clock {label}: guest-timed figures count guest instructions (2^{shift} ns each{turns}); "
            "host-timed ones are wall time"
        )
    if label.startswith("auto"):
        shift = label.partition(":")[2] or "?"
        return (
            f"clock {label}: each scenario on the clock that decides its primaries, icount (guest instructions, "
            f"2^{shift} ns each) or wall time; every metric's row names its own"
        )
    return f"clock {label}: wall time"


def environment_line(env: Mapping[str, Any]) -> EnvironmentLine:
    """The line of a results file's environment."""
    rest = []
    if env.get("host_kernel"):
        rest.append(f"host kernel {env['host_kernel']}")
    if env.get("qemu"):
        qemu = str(env["qemu"]).split(" (")[0]
        origin = str(env.get("qemu_origin") or "").split(" (cache ")[0]
        named = qemu if qemu.lower().startswith("qemu") else f"QEMU {qemu}"
        rest.append(named + (f" ({origin})" if origin else ""))
    if env.get("clock"):
        rest.append(clock_words(str(env["clock"]), env.get("vcpus")))
    if env.get("guest_cpu"):
        # QEMU's CPU model as the guest saw it: it changes between QEMU versions.
        rest.append(f"guest CPU {env['guest_cpu']}")
    if env.get("guest_kernel") or env.get("guest_kernel_sha256"):
        sha = str(env.get("guest_kernel_sha256") or "")[:12]
        rest.append(f"guest kernel {env.get('guest_kernel') or ''}" + (f" (sha256 {sha}...)" if sha else ""))
    return EnvironmentLine(
        str(env["accel"]).upper() if env.get("accel") else "",
        str(env.get("accel_reason") or "") if env.get("accel") else "",
        tuple(rest),
    )

"""What the balloon scenarios' procedures share: the guest they drive,
their sizes, their failure, and the guest's readings they compare.

The procedures: timing.py (inflate and deflate timed), correctness.py (odd
targets, driver unload, hot-unplug), floor.py (the floor, deflate-on-oom),
reporting.py (free page reporting), stats_interval.py (guest statistics).
e2e/test_balloon.py boots the guests, calls them, records and asserts;
docs/balloon.md says why each is built the way it is.
"""

from __future__ import annotations

from typing import Any, Protocol

from memqual.host.balloon.agent import agent_stat
from memqual.host.balloon.device import PAGE
from memqual.host.core.errors import GuestError
from memqual.host.core.shell import Shell

MIB = 1 << 20
AGENT = "balloon_agent"
# Every balloon guest is a pc: device_del/device_add needs PCI hotplug, and
# one machine type keeps the timings comparable across scenarios.
MACHINE = "pc"
GUEST_MIB = 1024
MARGIN_MIB = 64  # left above the floor so the guest can still exec and fault


class Guest(Protocol):
    """A booted guest with a balloon: host/core/machine.py's Machine, or a fake."""

    @property
    def pid(self) -> int: ...
    @property
    def ssh(self) -> Shell: ...
    def qmp(self, command: str, **arguments: Any) -> Any: ...


class ScenarioFailed(GuestError):
    """What a procedure cannot go on after: a move that did not reach its
    target, an agent's bad status."""


def guest_stat(ssh: Shell, agent: str) -> dict[str, int]:
    """The guest's balloon and memory counters, from the agent's ``stat``."""
    return agent_stat(ssh.run([agent, "stat"], timeout=60).stdout)


def total_moved_kib(first: dict[str, int], now: dict[str, int]) -> int:
    """How far the guest's MemTotal is from ``first``'s (KiB); within a
    page (4 KiB) is "gave back everything"."""
    return abs(now["mem_total_kib"] - first["mem_total_kib"])


def gave_back_everything(first: dict[str, int], now: dict[str, int]) -> bool:
    return total_moved_kib(first, now) <= PAGE // 1024


def oom_kills(ssh: Shell) -> list[str]:
    """The guest kernel's OOM kills, from its log."""
    return [line for line in ssh.run(["dmesg"]).stdout.splitlines() if "Killed process" in line]

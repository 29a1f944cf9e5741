"""What the KSM scenarios' measurement procedures share: the Protocols
they drive host KSM (``KsmHost``) and a guest (``Guest``) through, their
failure (``ScenarioFailed``), their common sizes and settings.

The procedures (merge.py, volatile.py, guest_ksm.py, sharing.py) measure
and return typed results whose ``records`` the scenario writes; they judge
nothing.  e2e/test_ksm.py boots the guests, calls them, records and
asserts; docs/ksm.md, "host/ksm/scenarios.py", says more."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from memqual.host.core.errors import GuestError
from memqual.host.core.record import Measurement
from memqual.host.core.shell import Shell
from memqual.host.ksm.procfs import ProcessKsm
from memqual.host.ksm.sysfs import KsmCounters

GUEST_MIB = 1024
# ksmd fast enough that 3 full scans of a 1 GiB guest take seconds under
# TCG; the kernel default (100 pages / 20 ms) would take minutes.
MERGE_PAGES_TO_SCAN = 20000
MERGE_SLEEP_MS = 10
# The scan knobs as each scenario sets them on the host and as its records'
# settings say, from one place.
MERGE_KNOBS: dict[str, int | str] = {"pages_to_scan": MERGE_PAGES_TO_SCAN, "sleep_millisecs": MERGE_SLEEP_MS}
SCAN_TIMEOUT_S = 120.0  # per wait for full scans: generous for a busy host


class KsmFiles(Protocol):
    """What the scenarios read of host KSM's sysfs directory directly."""

    def read_int(self, name: str) -> int: ...
    def read_int_or_none(self, name: str) -> int | None: ...
    def has(self, name: str) -> bool: ...


class KsmHost(Protocol):
    """Host KSM as the scenarios drive it: ``KsmController``, or a
    scripted fake in tests."""

    @property
    def fs(self) -> KsmFiles: ...
    def set(self, **knobs: int | str) -> None: ...
    def set_thp(self, **knobs: str) -> None: ...
    def unmerge(self) -> None: ...
    def counters(self) -> KsmCounters: ...
    def process(self, pid: int) -> ProcessKsm: ...
    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = ...) -> KsmCounters: ...
    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]: ...
    def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = ...) -> None: ...


class Guest(Protocol):
    """A booted guest: host/core/machine.py's Machine, or a fake."""

    @property
    def pid(self) -> int: ...
    @property
    def ssh(self) -> Shell: ...
    @property
    def started_warm(self) -> bool: ...
    @property
    def boot_to_ssh_s(self) -> float: ...
    def deploy(self, agent: str) -> str: ...


class ScenarioFailed(GuestError):
    """What the scenario fails on, found while it still runs: ksmd too slow
    for a deadline, pages that did not merge, the agent's bad status."""


def base_settings(**extra: object) -> dict[str, object]:
    """A KSM record's settings: the guest's size and what the scenario adds."""
    return {"guest_mib": GUEST_MIB, **extra}


def merged_fraction(
    scenario: str,
    fraction: float,
    settings: dict[str, object],
    extra: dict[str, object],
    variant: dict[str, object] | None = None,
) -> Measurement:
    """The share of the agent's pages that merged: host KSM's and the
    guest's own scenarios record it alike."""
    return Measurement(
        scenario=scenario,
        metric="merged_fraction",
        unit="1",
        better="higher",
        samples=[fraction],
        variant=variant or {},
        settings=settings,
        extra=extra,
    )

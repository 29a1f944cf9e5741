"""The guest-side KSM scenario (4 of e2e/test_ksm.py): the guest kernel's
own ksmd merges the agent's MADV_MERGEABLE pages."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from memqual.host.core.polling import poll
from memqual.host.core.record import Measurement
from memqual.host.core.shell import Shell
from memqual.host.ksm.agent import StressAgent, StressArgs
from memqual.host.ksm.scenarios import (
    SCAN_TIMEOUT_S,
    Guest,
    ScenarioFailed,
    base_settings,
    merged_fraction,
)

GUEST_KSM_MIB = 64
GUEST_KSM_ROOT = "/sys/kernel/mm/ksm"
GUEST_KSM_KNOBS = {"pages_to_scan": 5000, "sleep_millisecs": 10}
GUEST_KSM_POLL_S = 0.2  # poll period; each read is an SSH round trip


class GuestKsm:
    """The guest kernel's own KSM knobs and counters, over SSH."""

    def __init__(self, ssh: Shell, root: str = GUEST_KSM_ROOT) -> None:
        self.ssh, self.root = ssh, root

    def writable(self) -> bool:
        return bool(self.ssh.run(["test", "-w", f"{self.root}/run"], check=False).status == 0)

    def write(self, name: str, value: int) -> None:
        self.ssh.run(["sh", "-c", 'echo "$1" > "$2"', "knob", str(value), f"{self.root}/{name}"])

    def read(self, name: str) -> int:
        return int(self.ssh.run(["cat", f"{self.root}/{name}"]).stdout)

    def merging_pages(self, pid: int) -> int:
        return int(self.ssh.run(["cat", f"/proc/{pid}/ksm_merging_pages"]).stdout)


@dataclasses.dataclass(frozen=True)
class GuestKsmRun:
    pages: int
    merged: int
    pages_sharing: int
    seconds_for_3_scans: float
    after_unmerge: int
    verify: dict[str, str]
    agent_status: int
    guest_kernel: str

    @property
    def bad_pages(self) -> int:
        return int(self.verify["bad_pages"])

    def record(self) -> Measurement:
        return merged_fraction(
            "ksm.guest_merge",
            self.merged / self.pages,
            base_settings(agent_mib=GUEST_KSM_MIB, **GUEST_KSM_KNOBS, full_scans=3),
            {
                "merged_pages": self.merged,
                "pages_sharing": self.pages_sharing,
                "seconds_for_3_scans": self.seconds_for_3_scans,
                "after_unmerge": self.after_unmerge,
                "guest_kernel": self.guest_kernel,
            },
        )


def run_guest_ksm(
    vm: Guest, path: str, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
) -> GuestKsmRun:
    """The guest's ksmd merges the agent's MADV_MERGEABLE pages within 3
    full scans, then run=2 unmerges them; ``path`` is the deployed agent."""
    pages = GUEST_KSM_MIB * 256
    guest = GuestKsm(vm.ssh)
    for name, value in GUEST_KSM_KNOBS.items():
        guest.write(name, value)
    guest.write("run", 1)
    args = StressArgs(
        mib=GUEST_KSM_MIB, byte=0x3C, mergeable=True, phases=["fill", "hold:300", "verify"], timeout_s=400
    )
    with StressAgent(vm.ssh, path, args) as agent:
        pid = agent.pid
        agent.wait_event("fill_done", 120)
        t0 = clock()
        target = guest.read("full_scans") + 3
        poll(
            lambda: guest.read("full_scans") >= target,
            SCAN_TIMEOUT_S,
            GUEST_KSM_POLL_S,
            what="the guest's 3 full scans",
            clock=clock,
            sleep=sleep,
            on_timeout=lambda _: ScenarioFailed(
                f"the guest's ksmd did not finish 3 full scans in {SCAN_TIMEOUT_S:.0f} s"
            ),
        )
        seconds = clock() - t0
        merged = guest.merging_pages(pid)
        sharing = guest.read("pages_sharing")
        guest.write("run", 2)
        after_unmerge = guest.merging_pages(pid)
        agent.advance()
        verify = agent.wait_event("verify_done", 120)
        status = agent.finish(30)
    kernel = str(vm.ssh.run(["uname", "-r"]).stdout).strip()
    return GuestKsmRun(pages, merged, sharing, seconds, after_unmerge, verify, status, kernel)

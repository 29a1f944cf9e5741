"""The balloon's floor and deflate-on-oom scenarios (scenarios 3 and 5 of
e2e/test_balloon.py): the lowest the guest lets the balloon go, with its
per-CPU lists drained before each probe, and what the balloon gives back
when the guest needs memory at that floor.  They measure and return what
they saw; the e2e test asserts (docs/balloon.md says why deflate-on-oom is
on in both)."""

from __future__ import annotations

import dataclasses

from memqual.host.balloon.agent import agent_records
from memqual.host.balloon.device import PAGE, BalloonController, Floor, find_floor
from memqual.host.balloon.percpu import Drain, drain_percpu_lists
from memqual.host.balloon.scenarios import (
    GUEST_MIB,
    MACHINE,
    MARGIN_MIB,
    MIB,
    Guest,
    gave_back_everything,
    guest_stat,
    oom_kills,
)
from memqual.host.balloon.timed_move import DEADLINE_S, STALL_S
from memqual.host.core import clock
from memqual.host.core.record import Measurement

PRESSURE_MIB = 300  # what the agent allocates at the floor, 16 MiB a step
PRESSURE_STEP_MIB = 16
PRESSURE_HOLD_S = 90


@dataclasses.dataclass
class FloorRun:
    """The floor, the drains before its probes, and the guest after it."""

    floor: Floor
    ram_bytes: int
    drains: list[Drain]
    answered: str  # the guest's answer to ``echo alive`` at floor + margin
    oom_kills: list[str]
    deflated: bool  # the balloon went back to RAM
    gave_back_everything: bool  # MemTotal back to the page after it

    def record(self) -> Measurement:
        floor = self.floor
        return Measurement(
            scenario="balloon.floor",
            metric="floor_mib",
            unit="MiB",
            better="lower",
            samples=[floor.floor_bytes / MIB],
            settings={
                "guest_mib": GUEST_MIB,
                "machine": MACHINE,
                "stall_s": STALL_S,
                "deflate_on_oom": True,
                "percpu_drained": True,
            },
            extra={
                "safe_mib": floor.safe_bytes / MIB,
                "probe_s": floor.probe.seconds,
                "probes_mib": [p / MIB for p in floor.probes],
                "given_back_mib": [g / MIB for g in floor.given_back],
            },
        )


def run_floor(guest: Guest, ctl: BalloonController, agent: str) -> FloorRun:
    """Probe the floor (host/balloon/device.find_floor) with the guest's
    per-CPU free-page lists emptied before each probe, then deflate."""
    ram = ctl.ram_bytes()
    first = guest_stat(guest.ssh, agent)
    drains: list[Drain] = []
    floor = find_floor(
        ctl,
        margin_bytes=MARGIN_MIB * MIB,
        stall_s=STALL_S,
        before_probe=lambda: drains.append(drain_percpu_lists(guest.ssh)),
    )
    answered = guest.ssh.run(["echo", "alive"]).stdout.strip()
    kills = oom_kills(guest.ssh)
    deflated = ctl.reach(ram, deadline_s=clock.deadline_s(DEADLINE_S)).reached
    return FloorRun(
        floor, ram, drains, answered, kills, deflated, gave_back_everything(first, guest_stat(guest.ssh, agent))
    )


@dataclasses.dataclass
class DeflateOnOom:
    """The guest under pressure with the balloon at floor + margin."""

    floor: Floor
    status: int  # the pressure agent's exit status
    output: str  # its output's tail and its stderr, for a failure message
    allocated_mib: int  # the most it allocated
    deflated_pages: int  # balloon_deflate's growth by the agent's last progress line
    highest_actual_bytes: int  # the balloon's highest actual while it ran
    deflated: bool  # back to RAM afterwards
    oom_kills: list[str]

    def record(self) -> Measurement:
        return Measurement(
            scenario="balloon.deflate_on_oom",
            metric="deflated_mib",
            unit="MiB",
            better="higher",
            samples=[self.deflated_pages * PAGE / MIB],
            settings={"guest_mib": GUEST_MIB, "pressure_mib": PRESSURE_MIB, "machine": MACHINE},
            extra={
                "floor_mib": self.floor.floor_bytes / MIB,
                "safe_mib": self.floor.safe_bytes / MIB,
                "highest_actual_mib": self.highest_actual_bytes / MIB,
            },
        )


def run_deflate_on_oom(guest: Guest, ctl: BalloonController, agent: str) -> DeflateOnOom:
    """Find the floor (the balloon left at floor + margin), then let the
    agent allocate PRESSURE_MIB while the host watches the balloon's actual;
    with deflate-on-oom the balloon, not a process, pays."""
    floor = find_floor(ctl, margin_bytes=MARGIN_MIB * MIB, stall_s=STALL_S)
    start = guest_stat(guest.ssh, agent)
    pressure = guest.ssh.start([agent, "pressure", str(PRESSURE_MIB), str(PRESSURE_STEP_MIB), str(PRESSURE_HOLD_S)])
    highest = ctl.actual()
    for _line in pressure.lines(timeout=120):  # one line a step
        highest = max(highest, ctl.actual())
    result = pressure.wait(timeout=30)
    allocated = agent_records(result.stdout, "allocated")
    # The agent's own last progress line: once it frees, the driver
    # re-inflates to the target, so later guest readings mix both ways.
    progress = agent_records(result.stdout, "progress")
    deflated = int(progress[-1]["balloon_deflate"]) - start["balloon_deflate"] if progress else 0
    return DeflateOnOom(
        floor=floor,
        status=result.status,
        output=f"{result.stdout[-300:]} {result.stderr}",
        allocated_mib=int(allocated[-1]["mib"]) if allocated else 0,
        deflated_pages=deflated,
        highest_actual_bytes=highest,
        deflated=ctl.reach(ctl.ram_bytes(), deadline_s=clock.deadline_s(DEADLINE_S)).reached,
        oom_kills=oom_kills(guest.ssh),
    )

"""The balloon's correctness scenario (scenario 3 of e2e/test_balloon.py):
odd targets as memqual and QEMU answer them, the driver unloaded with the
balloon inflated, and the device hot-unplugged and plugged again.  It
measures and returns what it saw; the e2e test asserts (docs/balloon.md)."""

from __future__ import annotations

import dataclasses

from memqual.host.balloon.agent import agent_records
from memqual.host.balloon.device import PAGE, BalloonController, BalloonResult, QemuAnswer, wait_actual, wait_no_balloon
from memqual.host.balloon.scenarios import (
    GUEST_MIB,
    MACHINE,
    Guest,
    ScenarioFailed,
    gave_back_everything,
    guest_stat,
)
from memqual.host.balloon.timed_move import DEADLINE_S
from memqual.host.core import clock
from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement

DEVICE_ID = "balloon0"


@dataclasses.dataclass
class Correctness:
    """What the scenario saw, step by step."""

    memqual_refused: dict[str, bool]  # odd target -> refused before QEMU
    qemu_answers: dict[str, QemuAnswer]  # odd target -> QEMU's own answer
    clamped: BalloonResult  # asked for twice the RAM, unchecked
    ram_bytes: int
    total_back_after_clamp: bool  # MemTotal back to the page
    unload_status: str  # the agent's rmmod
    unload_s: float  # until the balloon's actual was back at RAM
    total_back_after_unload: bool
    reloaded: bool
    device_del_s: float
    still_bound: list[str]  # virtio devices bound to the driver after device_del
    readd: BalloonResult  # the first inflate after device_add

    def record(self) -> Measurement:
        answers = {target: answer.error for target, answer in self.qemu_answers.items()}
        answers["2*ram"] = "accepted, clamped to RAM (balloon fully deflated)"
        return Measurement(
            scenario="balloon.unload",
            metric="return_s",
            unit="s",
            better="lower",
            samples=[self.unload_s],
            settings={"guest_mib": GUEST_MIB, "machine": MACHINE, "deflate_on_oom": True},
            extra={"qemu_answers": answers, "device_del_s": self.device_del_s, "readd_inflate_s": self.readd.seconds},
        )


def reach(ctl: BalloonController, target_bytes: int) -> BalloonResult:
    """A move the scenario needs before it can go on."""
    result = ctl.reach(target_bytes, deadline_s=clock.deadline_s(DEADLINE_S))
    if not result.reached:
        raise ScenarioFailed(f"the balloon stopped at {result.actual_bytes} bytes, asked for {target_bytes}")
    return result


def refused_by_memqual(ctl: BalloonController, target_bytes: int) -> bool:
    try:
        ctl.set_target(target_bytes)
    except BadInput:
        return True
    return False


def run_correctness(guest: Guest, ctl: BalloonController, agent: str) -> Correctness:
    """Odd targets (0, one page below 0, one page above RAM, twice RAM
    unchecked), then the driver unloaded at half RAM and loaded again, then
    device_del and device_add with the driver loaded."""
    ram = ctl.ram_bytes()
    first = guest_stat(guest.ssh, agent)
    refused = {}
    answers = {}
    for bad in (0, -PAGE):
        refused[str(bad)] = refused_by_memqual(ctl, bad)
        answers[str(bad)] = ctl.qemu_balloon(bad)
    refused["ram+page"] = refused_by_memqual(ctl, ram + PAGE)
    reach(ctl, ram // 2)
    clamped = ctl.reach(2 * ram, deadline_s=clock.deadline_s(DEADLINE_S), checked=False)
    back_after_clamp = gave_back_everything(first, guest_stat(guest.ssh, agent))

    # Unloading the driver with the balloon inflated returns the memory.
    reach(ctl, ram // 2)
    unload = agent_records(guest.ssh.run([agent, "unload"], timeout=60).stdout, "unload")[0]
    if unload["status"] != "0":
        raise ScenarioFailed(f"the driver did not unload: {unload}")
    _, unload_s = wait_actual(ctl, lambda actual: actual == ram, deadline_s=30)
    back_after_unload = gave_back_everything(first, guest_stat(guest.ssh, agent))
    ctl.set_target(ram)  # or the reloaded driver inflates to the old target again
    reloaded = agent_records(guest.ssh.run([agent, "load"]).stdout, "load")[0]["module_loaded"] == "1"
    if not reloaded:
        raise ScenarioFailed("the driver did not load again")
    reach(ctl, ram // 2)
    reach(ctl, ram)

    # device_del / device_add with the driver loaded.
    guest.qmp("device_del", id=DEVICE_ID)
    gone_s = wait_no_balloon(ctl, deadline_s=30)
    bound = guest.ssh.run(["ls", "/sys/bus/virtio/drivers/virtio_balloon"]).stdout.split()
    guest.qmp("device_add", driver="virtio-balloon-pci", id=DEVICE_ID)
    readd = ctl.reach(ram // 2, deadline_s=clock.deadline_s(DEADLINE_S))  # only a bound driver moves it
    if readd.reached:
        reach(ctl, ram)
    return Correctness(
        memqual_refused=refused,
        qemu_answers=answers,
        clamped=clamped,
        ram_bytes=ram,
        total_back_after_clamp=back_after_clamp,
        unload_status=unload["status"],
        unload_s=unload_s,
        total_back_after_unload=back_after_unload,
        reloaded=reloaded,
        device_del_s=gone_s,
        still_bound=[b for b in bound if b.startswith("virtio")],
        readd=readd,
    )

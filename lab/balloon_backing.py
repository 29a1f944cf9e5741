"""What L1 backs decides a guest's inflate on L1's clock:
``python -m memqual.lab.balloon_backing [--host-kernel K] [--seed N] [--cycles C] [--hold MIB]``.

Boots one guest under a host under test (icount:0, THP off in L1, as the
timing test does), then C times: touch and free HOLD MiB in the guest
(default 256, the timing test's), inflate to the timing test's size at
the guest's mark, deflate; each inflate's guest-timed seconds beside the
page faults L1 took inside it (/proc/vmstat around it, in L1 and the
guest).  docs/host-under-test.md, "The moves at the guest's mark"."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

from memqual.host.balloon.device import BalloonController
from memqual.host.balloon.l1_moves import L1Moves
from memqual.host.balloon.scenarios import MARGIN_MIB, guest_stat
from memqual.host.balloon.timed_move import BalloonMover
from memqual.host.balloon.timing import HOST_UNDER_TEST_KNOBS, safe_inflate_bytes
from memqual.host.core import nested, settings
from memqual.host.core.kernelspec import KernelSpec
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import BalloonDevice, MachineConfig
from memqual.host.core.shell import Shell
from memqual.images.build import KernelSource, build

MIB = 1 << 20
GUEST_MIB = 1024


@dataclasses.dataclass(frozen=True)
class Cycle:
    inflate_s: float | None
    deflate_s: float | None
    l1_faults: int
    guest_faults: int


def vmstat(shell: Shell) -> dict[str, int]:
    out = {}
    for line in shell.run(["cat", "/proc/vmstat"], timeout=60).stdout.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[name] = int(value)
    return out


def run(kernel: str, seed: int, cycles: int, hold_mib: int, log_dir: Path) -> list[Cycle]:
    os.environ[settings.CLOCK] = "icount:0"
    os.environ[settings.BOOT_SEED] = str(seed)
    host = nested.HostUnderTest(KernelSpec(kernel)).with_boot_knobs(*HOST_UNDER_TEST_KNOBS)
    config = MachineConfig(memory_mib=GUEST_MIB, machine="pc", balloon=BalloonDevice())
    image = build(KernelSource(None, None))
    out = []
    with Machine(config, image=image, log_dir=log_dir, boot_timeout=480, host=host) as vm:
        agent = vm.deploy("balloon_agent")
        ctl = BalloonController(vm, device_id="balloon0")
        mover = BalloonMover(ctl, vm.ssh, agent, by_events=True, at_mark=L1Moves(vm.host_ssh))
        size = safe_inflate_bytes(guest_stat(vm.ssh, agent)["mem_available_kib"], MARGIN_MIB) // MIB * MIB
        ram = ctl.ram_bytes()
        for _ in range(cycles):
            vm.ssh.run([agent, "hold", str(hold_mib), "0"], timeout=300)
            guest0, l1_0 = vmstat(vm.ssh), vmstat(vm.host_ssh)
            inflate = mover.move(ram - size, stall_s=3.0)
            guest1, l1_1 = vmstat(vm.ssh), vmstat(vm.host_ssh)
            deflate = mover.move(ram)
            out.append(
                Cycle(
                    inflate.guest.seconds if inflate.guest else None,
                    deflate.guest.seconds if deflate.guest else None,
                    l1_1["pgfault"] - l1_0["pgfault"],
                    guest1["pgfault"] - guest0["pgfault"],
                )
            )
            print(json.dumps(dataclasses.asdict(out[-1])), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memqual.lab.balloon_backing", description=__doc__)
    parser.add_argument("--host-kernel", default="6.1.0-57-amd64")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--hold", type=int, default=256, metavar="MIB", help="touched and freed before each cycle")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="balloon-backing-") as logs:
        run(args.host_kernel, args.seed, args.cycles, args.hold, Path(logs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the outer QEMU deliver an injected interrupt twice?
``python -m memqual.lab.svm_redelivery [--qemu Q] [--boots N] [--rounds R] [--shift S] [--pv-eoi] [--cold]``.

Each boot: a guest under a host under test on icount:S, its balloon
inflated by 768 MiB and deflated R times, ``query-balloon`` every 10 ms
from this machine (each answer an interrupt of L1).  ``--pv-eoi`` gives
the guest paravirtual EOI back, which memqual turns off because of the
bug (nested.GUEST_CPU).  A boot whose guest stops is read from outside
(host/core/stuck.py).  docs/host-under-test.md, "What it found"."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from memqual.host.balloon.device import BalloonController
from memqual.host.core import nested, qemu_binary, settings, trust
from memqual.host.core.errors import MemqualError
from memqual.host.core.kernelspec import KernelSpec
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import BalloonDevice, MachineConfig
from memqual.images.build import KernelSource, build

MIB = 1 << 20
GUEST_MIB = 1024
INFLATE_MIB = 768
MOVE_DEADLINE_S = 120.0  # a move takes about 30 s of wall time at shift 2 here
# paravirtual EOI on: the CPU memqual's guests ran with before the bug was found
PV_EOI_CPU = "host"


@dataclasses.dataclass(frozen=True)
class Boot:
    seed: int
    rounds_done: int
    stopped: str  # what the stopped guest was doing; "" when every round completed
    wall_s: float
    boot_to_ssh_s: float  # the guest's SSH after L1's start, wall

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def one_boot(kernel: str, seed: int, rounds: int, shift: int, pv_eoi: bool, log_dir: Path, cold: bool) -> Boot:
    os.environ[settings.CLOCK] = f"icount:{shift}"
    os.environ[settings.BOOT_SEED] = str(seed)
    host = nested.HostUnderTest(
        KernelSpec(kernel), guest_cpu=PV_EOI_CPU if pv_eoi else "", max_shift=max(shift, nested.MAX_SHIFT)
    )
    config = MachineConfig(memory_mib=GUEST_MIB, machine="pc", balloon=BalloonDevice(), warm=not cold)
    begun = time.monotonic()
    done = 0
    stopped = ""
    to_ssh = 0.0
    try:
        with Machine(config, image=build(KernelSource(None, None)), log_dir=log_dir, boot_timeout=600, host=host) as vm:
            to_ssh = vm.boot_to_ssh_s
            ctl = BalloonController(vm, device_id="balloon0")
            ram = ctl.ram_bytes()
            try:
                for _ in range(rounds):
                    ctl.reach(ram - INFLATE_MIB * MIB, deadline_s=MOVE_DEADLINE_S, stall_s=30.0)
                    ctl.reach(ram, deadline_s=MOVE_DEADLINE_S, stall_s=30.0)
                    vm.ssh.run(["true"], timeout=60)
                    done += 1
            except MemqualError as exc:
                stopped = f"{vm.stuck_evidence()} (after: {exc})"
    except MemqualError as exc:  # the boot itself: said, and the next boot runs
        stopped = f"did not boot: {exc}"
    return Boot(seed, done, stopped, round(time.monotonic() - begun, 1), round(to_ssh, 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memqual.lab.svm_redelivery", description=__doc__)
    parser.add_argument("--qemu", help="a QEMU version, path or memqual qemu build name (default: the system's)")
    parser.add_argument("--host-kernel", default="6.1.0-57-amd64")
    parser.add_argument("--boots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shift", type=int, default=2, help="L1's icount shift (memqual's own cap is 0)")
    parser.add_argument("--pv-eoi", action="store_true", help="paravirtual EOI on in the guest (the old trigger)")
    parser.add_argument("--seed", type=int, default=1, help="the first boot's seed; boot i gets seed + i")
    parser.add_argument("--cold", action="store_true", help="boot L1 and its guest, no saved snapshot")
    parser.add_argument("--logs", type=Path, help="keep consoles and stuck-N.txt here (default: a temporary folder)")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except MemqualError as exc:
        print(f"svm_redelivery: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    choice = qemu_binary.choose(args.qemu)
    print(f"outer QEMU: {choice.binary} ({choice.origin})", flush=True)
    boots = []
    with tempfile.TemporaryDirectory(prefix="svm-redelivery-") as scratch:
        for i in range(args.boots):
            # --logs: a folder nobody else can write, as root writes into it
            parent = trust.work_dir(args.logs, "--logs") if args.logs else Path(scratch)
            log_dir = parent / f"boot-{i + 1}"
            log_dir.mkdir(exist_ok=True)
            boot = one_boot(args.host_kernel, args.seed + i, args.rounds, args.shift, args.pv_eoi, log_dir, args.cold)
            boots.append(boot)
            print(json.dumps(boot.to_json()), flush=True)
    stopped = sum(1 for b in boots if b.stopped)
    print(f"{stopped} of {len(boots)} boots stopped; {sum(b.rounds_done for b in boots)} rounds completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

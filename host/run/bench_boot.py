"""Boot timings: the same guest booted N times in a row, each boot's time to
SSH and to a first real command, summarised (median, range, IQR) with the
environment and the host's load.  ``python -m memqual.host.cli.bench_boot``
is its command; docs/results/ quotes its figures.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

from memqual.host.core import clock, descriptive, probe
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig
from memqual.images import build as images_build

FIRST_COMMAND = ["uname", "-r"]


@dataclasses.dataclass(frozen=True)
class Boot:
    boot_to_ssh_s: float
    launch_to_first_command_s: float
    warm: bool


def one_boot(config: MachineConfig, image: Any, timeout: float) -> Boot:
    started = time.monotonic()
    with Machine(config, image=image, boot_timeout=timeout) as vm:
        vm.ssh.run(FIRST_COMMAND, timeout=60)
        first_command = time.monotonic() - started
        return Boot(vm.boot_to_ssh_s, first_command, vm.started_warm)


def summary(samples: list[float]) -> dict[str, float]:
    s = descriptive.summarize(samples)
    return {
        "median": round(s.median, 3),
        "min": round(s.minimum, 3),
        "max": round(s.maximum, 3),
        "range": round(s.maximum - s.minimum, 3),
        "iqr": round(s.iqr, 3),
    }


def run(boots: int, config: MachineConfig, timeout: float, progress: bool) -> dict[str, Any]:
    image = images_build.build()
    load_before = os.getloadavg()[0]
    the_clock = clock.parse(config.clock) if config.clock else clock.current()
    accel, reason = clock.resolve_accel(the_clock, config.accel) or probe.resolve_accel(config.accel)
    # Machine would resolve 'auto' again per launch (a cached answer, but it
    # looks the image up): give it the answer.
    config = dataclasses.replace(config, accel=accel, clock=the_clock.label)
    if config.warm:
        one_boot(config, image, timeout)  # untimed: makes sure the snapshot exists
    results: list[Boot] = []
    for index in range(boots):
        result = one_boot(config, image, timeout)
        results.append(result)
        if progress:
            print(
                f"boot {index + 1}/{boots}: SSH after {result.boot_to_ssh_s:.2f} s, first command after "
                f"{result.launch_to_first_command_s:.2f} s ({'warm' if result.warm else 'cold'})",
                file=sys.stderr,
            )
    environment = (
        probe.environment().with_accel(accel, reason).with_clock(the_clock.label, config.cpus).with_guest(image)
    )
    return {
        "boots": boots,
        "mode": "warm" if config.warm else "cold",
        "warm_starts": sum(r.warm for r in results),
        "machine": config.machine,
        "memory_mib": config.memory_mib,
        "cpus": config.cpus,
        # memqual.host.core.environment's keys: accel, accel_reason, guest_kernel, qemu, host_kernel...
        **environment.to_json(),
        # On a shared 2-core machine other work slows TCG down: say how busy it was.
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "boot_to_ssh_s": summary([r.boot_to_ssh_s for r in results]),
        "launch_to_first_command_s": summary([r.launch_to_first_command_s for r in results]),
        "samples": [dataclasses.asdict(r) for r in results],
    }

"""A and B interleaved inside one Avocado job: the blocks of a two-kernel run.

Each scenario test runs once per arm per block, as Avocado variants in
'variants-per-test' order, so one test runs A1 B1 B2 A2 A3 B3 ... before the
next test starts: the two members of a pair are minutes apart, never a job
apart, and a drift of the shared host between blocks falls on both arms.

Why it is built so: docs/architecture.md, "Module notes", host/run/blocks.py.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from memqual.host.core.record import Measurement

# Tests with these tags check behaviour (boot, panic, cleanup, isolation,
# warm start, lab hosts) and measure nothing an A/B compares: they run once
# per arm (block 1), every other test runs in every block.
ONCE_PER_ARM_TAGS = ("boot", "hosts")
# The ab profile's (host/core/profiles.py): the checks of the guest kernel itself
# (e2e/test_boot.py), and the scenarios' checks that record no primary
# (tag ``ab-checks``: the balloon's odd targets, unload and hot-unplug, its
# statistics and deflate-on-OOM, the controls of free page reporting and
# KSM merging), which pass or fail but give a block nothing to decide on;
# not memqual's own machinery (cleanup, warm start, the lab hosts), which a
# guest kernel does not change and which costs minutes an arm.
AB_CHECKS_TAG = "ab-checks"
AB_ONCE_PER_ARM_TAGS = ("kernel-checks", AB_CHECKS_TAG)
VARIANT_ID = re.compile(r"[;_]b(\d+)-([AB])$")


@dataclasses.dataclass(frozen=True)
class VariantParams:
    """What one Avocado variant tells GuestTest (e2e/base.py) about its arm:
    the run's ``Arm`` (host/run/config.py) as the strings a JSON variants
    file holds (empty: the default kernel, the QEMU the job inherits, this
    machine as the host).  Not an arm of its own: only ``Arm.variant_params``
    makes one."""

    arm: str  # "A" or "B"
    kernel: str
    modules: str = ""
    kernel_build: str = ""
    cmdline_extra: str = ""
    qemu: str = ""  # the arm's qemu-system-x86_64 ($MEMQUAL_QEMU in its tests)
    # the arm's host under test (host/core/nested.py): KERNEL[:CMDLINE] and
    # its KVM's parameters, space-separated; empty: this machine
    host_kernel: str = ""
    host_kernel_params: str = ""


# What one Avocado job of blocks costs beyond its test runs' own times
# (Avocado's time of each, which already holds the test module's import,
# the lock wait and the guest's cold boot), from the job logs' timestamps
# (a four-job A/B of 10 to 44 test runs a job, and jobs of 4 runs):
# - once a job (JOB_OVERHEAD_S): memqual starts avocado and the job is
#   set up (0.4-0.6 s), the first runner starts later than the others
#   (0.2-0.3 s), the job ends and is read (0.1-0.2 s), memqual's own look
#   and plan between two jobs (0.2-1.2 s);
# - each test run (RUN_OVERHEAD_S): Avocado's task polling (0.1 s) and the
#   next runner's own process start (0.3 s), then the test's end reaching
#   the job: 0.1-0.3 s since the guests' protocol chatter stays out of the
#   runner's pipe (e2e/base.py WIRE_LOG), 2.1 s a balloon test before.
#   0.5-0.8 s a run in all here, more while other runs share the 2 CPUs.
JOB_OVERHEAD_S = 1.5
RUN_OVERHEAD_S = 0.7


def job_overhead_s(test_runs: int) -> float:
    """About how much longer than its test runs' own times (Avocado's)
    one job of ``test_runs`` test runs takes (each test of a block runs
    twice: A and B)."""
    if test_runs < 0:
        raise ValueError(f"test_runs {test_runs} < 0")
    return JOB_OVERHEAD_S + RUN_OVERHEAD_S * test_runs


# A once-per-arm check's own time (Avocado's), about: 9 checks an arm of
# the ab profile took 209.5 s in all over 18 runs here (11.6 s a run, 3.5-29
# s each, beside other work), 10.4 s a run on a quiet host earlier.
CHECK_RUN_S = 12.0
# On the icount clock every vCPU runs in one host thread: the same job of
# 9 checks an arm (18 runs) took 10 min 16 s at load 2.5-8 here, 34 s a
# run (docs/ab-calibration.md, "What icount costs in wall time here").
CHECK_RUN_ICOUNT_S = 34.0


def checks_reserve_s(tests: int, icount: bool = False) -> float:
    """About how long the once-per-arm job of ``tests`` checks takes (each
    runs once an arm) on the wall or the icount clock: what --until-decided
    keeps of its budget for them when they run after the looks.  Nothing
    when there are none."""
    if tests < 0:
        raise ValueError(f"tests {tests} < 0")
    per_run = CHECK_RUN_ICOUNT_S if icount else CHECK_RUN_S
    return 0.0 if tests == 0 else 2 * tests * per_run + job_overhead_s(2 * tests)


def block_order(first: int, count: int) -> list[tuple[int, str]]:
    """(block, arm) in run order: odd blocks A then B, even blocks B then A
    (ABBA), so neither arm is always the one that runs second."""
    order: list[tuple[int, str]] = []
    for block in range(first, first + count):
        order += [(block, arm) for arm in (("A", "B") if block % 2 else ("B", "A"))]
    return order


def variant_id(block: int, arm: str) -> str:
    return f"b{block}-{arm}"


def variants(order: list[tuple[int, str]], arms: dict[str, VariantParams]) -> list[dict[str, Any]]:
    """Avocado's JSON variants (the format ``avocado variants
    --json-variants-dump`` writes), one per (block, arm) in ``order``."""
    out = []
    for block, arm in order:
        vid = variant_id(block, arm)
        node = "/run/" + vid
        p = arms[arm]
        params = {
            "arm": arm,
            "block": block,
            "kernel": p.kernel,
            "modules": p.modules,
            "kernel_build": p.kernel_build,
            "cmdline_extra": p.cmdline_extra,
            "qemu": p.qemu,
            "host_kernel": p.host_kernel,
            "host_kernel_params": p.host_kernel_params,
        }
        out.append(
            {
                "paths": ["/run/*"],
                "variant_id": vid,
                "variant": [[node, [[node, key, value] for key, value in params.items()]]],
            }
        )
    return out


def arm_and_block(name: str) -> tuple[str, int] | None:
    """(arm, block) from a test's name (``...;b2-A``) or its results
    directory's name (``...test_x_b2-A``); None outside a blocked run."""
    m = VARIANT_ID.search(name)
    return (m.group(2), int(m.group(1))) if m else None


def test_reference(name: str) -> str:
    """A test's name without its variant, anchored: an Avocado reference
    that names that one test (``file.py:Class.test_x`` alone would also
    select ``test_x_more``)."""
    return name.split(";", 1)[0] + "$"


def row_reference(name: str) -> str:
    """A test's name (``e2e/test_x.py:Class.test_y``, with or without its
    variant) as the scenario rows name it (``test_x:Class.test_y``)."""
    path, _, rest = name.split(";", 1)[0].partition(":")
    return f"{Path(path).stem}:{rest}"


# What one guest of a test that shares the host on icount takes of it: its
# RAM (1 GiB, the balloon's), TCG's translated code (QEMU reserves up to 1
# GiB and fills a fraction) and QEMU's own, with room to spare.
SHARED_GUEST_MIB = 3072
SLOTS_BY = f"one a host CPU, as many as MemAvailable has {SHARED_GUEST_MIB // 1024} GiB for"


def beside_others_slots(cpus: int, available_mib: int) -> int:
    """How many tests that share the host on icount run at a time: one a
    host CPU (each guest's vCPUs take turns in one host thread), as many
    as the memory has room for, at least one."""
    if cpus < 1 or available_mib < 0:
        raise ValueError(f"cpus {cpus}, available {available_mib} MiB")
    return max(1, min(cpus, available_mib // SHARED_GUEST_MIB))


def host_slots(meminfo: Path = Path("/proc/meminfo")) -> int:
    """``beside_others_slots`` of this host: the CPUs memqual may run on and
    its MemAvailable (one slot when it cannot be read)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return 1
    found = re.search(r"^MemAvailable:\s+(\d+) kB$", text, re.MULTILINE)
    if found is None:
        return 1
    return beside_others_slots(len(os.sched_getaffinity(0)), int(found.group(1)) // 1024)


def record_test_dir(path: Path) -> Path | None:
    """The test's results directory a record file lies in
    (``test-results/<N-name>/data/memqual-*.json``)."""
    for parent in path.parents:
        if parent.parent.name == "test-results":
            return parent
    return None


def stamp(measurement: Measurement, arm: str, block: int) -> None:
    """Fill in a record's arm and blocks (every replicate came from this
    variant's guest or guests) where the test did not."""
    if not measurement.arm:
        measurement.arm = arm
    if not measurement.blocks:
        measurement.blocks = [block] * len(measurement.replicates)

"""How a bisect runs its probes: the QEMU and the clock it keeps across a --resume, and
the real round runner (one Avocado job of a step's blocks).  The search and
its decisions are run.py's and decide.py's; the options are
host/cli/bisect.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core import clock
from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json
from memqual.host.core.paths import REPO_ROOT, write_private_atomic
from memqual.host.core.qemu_binary import choose_for_clock
from memqual.host.run import ab_run, block_jobs, blocks
from memqual.host.run import config as run_config
from memqual.host.run.bisect import axis, series
from memqual.host.run.host_checks import host_run_clock

if TYPE_CHECKING:
    from rich.console import Console

    from memqual.host.core.qemu_binary import QemuChoice

QEMU_FILE = "qemu.json"  # in a bisect's folder: the --qemu it runs


def bisect_clock(asked: str | None, directory: Path, resuming: bool, on_hosts: bool = False) -> clock.Clock:
    """The clock of a bisect (memqual.host.core.clock; default wall, the
    clock its calibration was measured on; ``on_hosts``, its guests on
    hosts under test: icount, L1's instructions, at the shift L1 runs,
    host_checks.host_run_clock), made this process's ($MEMQUAL_CLOCK).
    ``bisect_qemu`` notes it in DIR/qemu.json beside the QEMU; a resumed
    bisect runs the noted one (a bisect from before clocks ran on wall):
    K1 and the probes must not be timed on two clocks."""
    if resuming:
        path = directory / QEMU_FILE
        noted = read_json(path, "bisect QEMU file", "start a new bisect") if path.exists() else {}
        label = noted.get("clock", clock.WALL) if isinstance(noted, dict) else None
        if not isinstance(label, str):
            raise BadInput(f"{path}: no bisect QEMU file (its clock is no string): start a new bisect")
        kept = clock.parse(label)
        if asked is not None and asked_clock(asked, on_hosts) != kept:
            raise BadInput(f"--resume {directory}: it ran on the {kept.label} clock; leave --clock out")
        chosen = kept
    else:
        chosen = asked_clock(asked, on_hosts)
    clock.put(chosen)
    return chosen


def asked_clock(asked: str | None, on_hosts: bool) -> clock.Clock:
    """--clock as given, else the default: on hosts under test icount (L1's
    instructions are the clock, so the host's work for the guest counts in
    what the guest times), at the shift L1 runs; else wall."""
    if not on_hosts:
        return clock.parse(asked) if asked else clock.WALL_CLOCK
    return host_run_clock(clock.parse(asked) if asked else clock.icount(clock.DEFAULT_SHIFT))


def bisect_qemu(spec: str | None, directory: Path, resuming: bool, vcpus: int = 2) -> QemuChoice | None:
    """The QEMU of a bisect (a QemuChoice, None: the environment's), made
    this process's ($MEMQUAL_QEMU, which its jobs inherit).  A new bisect
    notes its ``--qemu`` in DIR/qemu.json; a resumed one runs the noted one,
    since K1 and the probes must not run on two QEMUs.  ``vcpus``: what
    its guests need (a host under test runs one on icount, nested.host_vcpus)."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built

    path = directory / QEMU_FILE
    if resuming:
        noted = read_json(path, "bisect QEMU file", "start a new bisect") if path.exists() else {}
        kept = noted.get("spec") if isinstance(noted, dict) else None
        if not isinstance(kept, (str, type(None))):
            raise BadInput(f"{path}: no bisect QEMU file (its spec is no string): start a new bisect")
        if spec is not None and spec != kept:
            ran = f"--qemu {kept}" if kept else "the environment's QEMU"
            raise BadInput(f"--resume {directory}: it ran with {ran}; leave --qemu out")
        spec = kept
    # On icount the scenarios' 2-vCPU guests need a QEMU that runs them.
    the_clock = clock.current()
    fix = f"pass --qemu {clock.ICOUNT_SMP_QEMU} or --clock wall"
    choice = choose_for_clock(spec, the_clock, vcpus, fix)[0] if spec or the_clock.strictest().icount else None
    if not resuming:
        directory.mkdir(parents=True, exist_ok=True)
        noted = {"spec": spec, "clock": the_clock.label, **(run_config.qemu_json(choice) or {})}
        write_private_atomic(path, (json.dumps(noted, indent=2) + "\n").encode(), 0o644)
    return choice


def avocado_runner(settings: Any, console: Console, qemu: Any = None) -> Any:
    """The real RoundRunner: the avocado job(s) of a step's blocks, each test
    running every (block, arm) variant (host/run/block_jobs.py), its
    records stamped with arm and block (ab_run.BlockedRun); ``qemu`` (a
    QemuChoice) is the QEMU of both arms."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import sha256_file

    the_axis: axis.Axis = settings.axis
    # A host series' kernels are its hosts': no guest kernel of it to fetch.
    files = series.Kernels(list(settings.kernels) if the_axis.kind == axis.GUEST else [])
    host_name = axis.HostNames(the_axis.host_params)
    sums: dict[str, str] = {}
    tests = Path(settings.tests) if settings.tests else REPO_ROOT / "e2e"

    def guest_of(label: str, spec: series.KernelSpec) -> run_config.GuestKernel:
        bzimage, modules = files[spec.version]
        if spec.version not in sums:
            sums[spec.version] = sha256_file(bzimage)
        return run_config.GuestKernel(
            label, bzimage.resolve(), modules.resolve(), sums[spec.version], spec.cmdline_extra
        )

    def run_step(
        specs: dict[str, Any], first: int, count: int, directory: Path
    ) -> tuple[list[Any], str, int, str | None]:
        arms = axis.step_arms(the_axis, specs, guest_of, host_name, qemu)
        config = run_config.RunConfig(
            output=directory,
            profile=settings.profile,
            only=settings.only,
            tests=tests,
            kernels=tuple(a.kernel for a in arms.values() if a.kernel is not None),
            hosts=axis.step_hosts(arms),
            parallel=1,
            rounds=first + count - 1,
            clock=clock.current(),
        )
        order = [(block, arm) for block, arm in blocks.block_order(first, count) if arm in arms]
        params = {label: a.variant_params() for label, a in arms.items()}
        # On icount a bisected metric its guests count runs A beside B.
        done = block_jobs.run_block_jobs(config, block_jobs.BlockRequest(params, order), 1, console)
        state = ab_run.BlockedRun()
        for each in done:
            state.take(each.outcome, slots=each.slots)
        summary = "; ".join(each.outcome.summary for each in done if each.outcome.summary)
        first_dir = next((each.outcome.job_dir for each in done if each.outcome.job_dir), None)
        status = max(each.outcome.exit_status for each in done)
        return state.records, summary, status, str(first_dir) if first_dir else None

    return run_step

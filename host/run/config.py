"""What one ``memqual run`` is asked to do (RunConfig, its kernels and arms) and what
each Avocado job did (JobOutcome): plain values, no process, no argparse.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core.clock import WALL_CLOCK, Clock
from memqual.host.core.errors import BadInput
from memqual.host.core.nested import HostUnderTest
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.profiles import AB, QUICK
from memqual.host.run.blocks import VariantParams

if TYPE_CHECKING:  # imported where used: a run loads the reporting only at its end
    from memqual.host.core.qemu_binary import QemuChoice
    from memqual.host.run.host_scope import HostPatchRun
    from memqual.host.run.patch_scope import PatchRun, TestScope


# avocado's exit status bits (avocado.core.exit_codes)
AVOCADO_TESTS_FAIL = 1
AVOCADO_JOB_FAIL = 2
UNTIL_DECIDED_BUDGET_MIN = 120.0


@dataclasses.dataclass(frozen=True)
class GuestKernel:
    label: str  # "A" or "B" (empty for a single kernel)
    bzimage: Path
    modules: Path | None
    sha256: str
    cmdline_extra: str = ""  # appended to the guest's kernel command line (a bisect's series)
    kernel_build: Path | None = None  # the tree it was built in (the balloon driver variant's)


# An arm of an A/B is one thing through the run: an ``Arm``, its kernel,
# QEMU and host as the run resolved them.  Two other types name arms and are
# not arms: ``ArmPairing``, the command line's word on which of its kernels
# and QEMUs each arm takes (indexes, checked before anything is resolved or
# built), and ``blocks.VariantParams``, an Arm written as the strings an
# Avocado variant carries to GuestTest (``Arm.variant_params``).


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of an A/B: its kernel (None: the default image's) and its
    QEMU (None: the one the job inherits, $MEMQUAL_QEMU or the system's)."""

    label: str  # "A" or "B"
    kernel: GuestKernel | None
    qemu: QemuChoice | None
    host: HostUnderTest | None = None  # the guests' host under test; None: this machine

    def variant_params(self) -> VariantParams:
        """This arm as its Avocado variants tell GuestTest: its kernel's
        files (none: the default image), its QEMU's binary (none: the job's)
        and its host under test (none: this machine)."""
        k, qemu, host = self.kernel, self.qemu, self.host
        return VariantParams(
            arm=self.label,
            kernel=str(k.bzimage) if k is not None else "",
            modules=str(k.modules or "") if k is not None else "",
            kernel_build=str(k.kernel_build or "") if k is not None else "",
            cmdline_extra=k.cmdline_extra if k is not None else "",
            qemu=str(qemu.binary) if qemu is not None else "",
            host_kernel=host.kernel.name if host is not None else "",
            host_kernel_params=" ".join(host.params) if host is not None else "",
        )


# Which kernel and which QEMU each arm takes, by their index in the command
# line's order (None: the default one).
ArmPairing = tuple[tuple[int | None, int | None], ...]


def arm_pairing(kernels: int, qemus: int, hosts: int = 0) -> ArmPairing:
    """How ``kernels`` kernels and ``qemus`` QEMUs make the arms of a run:
    one of each or none, one arm; two of one axis, A and B differ on that
    axis and share the other's one (or default); two of each, paired in
    order (A = kernel 1 + QEMU 1, B = kernel 2 + QEMU 2).  Two ``hosts``
    (host kernels under test) make two arms too, the first host A's; the
    hosts are paired by arm (``run_arms``), not in these pairs.  Anything
    else is BadInput: no run compares more than two arms."""
    if kernels > 2 or qemus > 2 or hosts > 2:
        what = "--guest-kernel/--debian-kernel" if kernels > 2 else "--qemu" if qemus > 2 else "--host-kernel"
        raise BadInput(f"{what} given {max(kernels, qemus, hosts)} times: an A/B has two arms; give it at most twice")
    if kernels < 0 or qemus < 0 or hosts < 0:
        raise BadInput("a negative count of kernels, QEMUs or hosts")
    if max(kernels, qemus, hosts) < 2:
        return ((0 if kernels else None, 0 if qemus else None),)
    kernel = (0, 1) if kernels == 2 else ((0, 0) if kernels else (None, None))
    qemu = (0, 1) if qemus == 2 else ((0, 0) if qemus else (None, None))
    return ((kernel[0], qemu[0]), (kernel[1], qemu[1]))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    output: Path
    profile: str = "quick"
    only: tuple[str, ...] = ()
    tests: Path = REPO_ROOT / "e2e"
    kernels: tuple[GuestKernel, ...] = ()
    # The --qemu of each arm, resolved (fetched) by main: one for every
    # arm, or two for A and B (``pairing`` pairs them with the kernels).
    qemus: tuple[QemuChoice, ...] = ()
    # The host kernels under test (--host-kernel): none (this machine), one
    # for both arms, or A's and B's.
    hosts: tuple[HostUnderTest, ...] = ()
    parallel: int = 1
    rounds: int = 1  # avocado jobs per kernel; A and B alternate between rounds
    until_decided: bool = False  # two arms: add rounds until every metric is decided (host/judge/until_decided.py)
    budget_min: float = UNTIL_DECIDED_BUDGET_MIN  # wall time of the whole run with until_decided
    avocado_global_args: tuple[str, ...] = ()  # before "run": --config FILE (the lab hosts' spawner, host/run/hosts/)
    environment: tuple[tuple[str, str], ...] = ()  # set in the job's environment last (the lab hosts' TMPDIR)
    # A blocked A/B job (host/run/blocks.py): its variants file, the
    # tests it names (empty: config.tests) and which tests it selects:
    # "once" the once-per-arm tests, "blocks" the others, "" all.
    variants_file: Path | None = None
    references: tuple[str, ...] = ()
    selection: str = ""
    # The clock the guests' timings are read with (host/core/clock.py), one
    # for both arms; the command puts it in $MEMQUAL_CLOCK for the jobs.
    clock: Clock = WALL_CLOCK
    # The A/B's decisions: smallest relative change that counts and the
    # family-wise error level (None: memqual.host.judge.comparison's defaults).
    threshold: float | None = None
    alpha: float | None = None
    # Which of ``kernels`` and ``qemus`` each arm has, by index, as the
    # command checked them (``arm_pairing``): two pairs make an A/B.
    pairing: ArmPairing = ((None, None),)
    # A blocked run's tests, when a patch's scope limits them (None: every
    # test the profile and --only select).
    scope: TestScope | None = None
    # memqual run --patch: the kernels it built A and B from, the patches
    # and its scope (None: the kernels were given).
    patch: PatchRun | None = None
    # memqual run --host-patch: the host kernels it built A and B from, the
    # patches and its scope (None: no host patch).
    host_patch: HostPatchRun | None = None


@dataclasses.dataclass
class TestOutcome:
    id: str
    status: str
    reason: str
    time: float | None


@dataclasses.dataclass
class JobOutcome:
    """What one avocado job did."""

    command: list[str]
    exit_status: int
    job_dir: Path | None
    summary: str
    tests: list[TestOutcome]
    counts: dict[str, int]
    # Each test's results directory name -> its name, from the same
    # results.json as ``tests``: which test wrote a record.
    test_names: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def completed(self) -> bool:
        return self.exit_status == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "exit_status": self.exit_status,
            "job_dir": str(self.job_dir) if self.job_dir else None,
            "summary": self.summary,
            "counts": self.counts,
        }


def schedule(kernels: tuple[GuestKernel | None, ...], rounds: int) -> list[tuple[int, GuestKernel | None]]:
    """(round, kernel) in the order to run them: A B, then B A, then A B...
    (ABBA) so that a drift of the shared host -- load rising, caches
    warming, a thermal limit -- falls on both kernels alike instead of on
    whichever ran second."""
    order: list[tuple[int, GuestKernel | None]] = []
    for index in range(rounds):
        ordered = kernels if index % 2 == 0 else tuple(reversed(kernels))
        order += [(index + 1, kernel) for kernel in ordered]
    return order


def run_arms(config: RunConfig) -> tuple[Arm, ...]:
    """The two arms of an A/B (``config.pairing`` pairs the kernels and
    the QEMUs), or () when the run has one arm."""
    if len(config.pairing) != 2:
        return ()
    arms = []
    for index, (label, (k, q)) in enumerate(zip("AB", config.pairing, strict=True)):
        kernel = dataclasses.replace(config.kernels[k], label=label) if k is not None else None
        host = config.hosts[index if len(config.hosts) == 2 else 0] if config.hosts else None
        arms.append(Arm(label, kernel, config.qemus[q] if q is not None else None, host))
    return tuple(arms)


def qemu_json(qemu: QemuChoice | None) -> dict[str, str] | None:
    """An arm's QEMU as results.json and comparison.json name it."""
    if qemu is None:
        return None
    return {"version": qemu.version, "origin": qemu.origin, "binary": str(qemu.binary)}


def job_profile(asked: str | None, arms: int) -> str:
    """The profile a run uses: the one asked for, else an A/B's sizing for
    two arms (host/core/profiles.py) and quick for one."""
    return asked or (AB if arms == 2 else QUICK)

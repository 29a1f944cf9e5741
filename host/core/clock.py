"""The clock a guest's timings are read with: the host's wall time, or QEMU's
instruction counter (icount).

Why it is built so: docs/architecture.md, "Module notes", host/core/clock.py.
"""

from __future__ import annotations

import dataclasses
import re

from memqual.host.core import settings
from memqual.host.core.environment import shared_fact
from memqual.host.core.errors import BadInput

WALL = "wall"
ICOUNT = "icount"
# A run's plan, not a clock a guest runs on: each scenario's test
# on the clock its primaries' measured block spreads decide them on in
# fewer blocks (host/judge/clock_plan.py), icount at the plan's shift.  A
# test resolves it before its first guest (e2e/base.py); its records name
# the clock it resolved to.
AUTO = "auto"
# 16 ns a guest instruction: the shift measured to repeat to 0.007 % across
# boots (ENVIRONMENT.md); a guest second is then about 62 million
# instructions, so guest-side deadlines of seconds stay meaningful.
DEFAULT_SHIFT = 4
MAX_SHIFT = 10  # QEMU's own limit (MAX_ICOUNT_SHIFT)
# The oldest QEMU known to run more than one vCPU under icount, and the one
# memqual fetches from Debian's archive when the system's is older.
ICOUNT_SMP_MIN_QEMU = (10, 0)
ICOUNT_SMP_QEMU = "10.0.2"
# Under icount the guest's TSC ticks once a nanosecond of virtual time
# (QEMU's cpu_get_ticks is the virtual clock), whatever the shift.
ICOUNT_TSC_KHZ = 1_000_000
# Under icount a cold boot is paced by its inputs alone, and two of them
# come from the host unless fixed: the RTC (the host's time at start, which
# the kernel mixes into its entropy and keeps as its boot time) and RDRAND
# (the host's random bytes; QEMU's -seed makes them a generator's).  Fixed,
# three cold boots of Debian's 6.1 inflated their balloon in 31.14-31.24
# guest s; the host's: 27.6-31.4 (docs/ab-calibration.md, "Boots that
# repeat").  The seed alone did not steady it: the RTC still differed.
ICOUNT_RTC_BASE = "2026-01-01T00:00:00"
DEFAULT_BOOT_SEED = 1


@dataclasses.dataclass(frozen=True)
class Clock:
    """``kind`` wall or icount; ``shift`` only with icount."""

    kind: str = WALL
    shift: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in (WALL, ICOUNT, AUTO):
            raise BadInput(f"clock {self.kind!r} unknown: give wall, icount[:SHIFT] or auto[:SHIFT]")
        if self.kind == WALL and self.shift is not None:
            raise BadInput("the wall clock has no shift: give wall or icount[:SHIFT]")
        if self.kind != WALL and (self.shift is None or not 0 <= self.shift <= MAX_SHIFT):
            raise BadInput(f"icount shift {self.shift!r}: give a whole number from 0 to {MAX_SHIFT}")

    @property
    def icount(self) -> bool:
        """Do this clock's guests run under icount?  Never for ``auto``,
        which is resolved to wall or icount before a guest starts."""
        return self.kind == ICOUNT

    @property
    def auto(self) -> bool:
        return self.kind == AUTO

    def strictest(self) -> Clock:
        """The clock the most demanding guest of a run on this clock runs
        on: ``auto``'s icount (which wants QEMU 10 for two vCPUs and TCG),
        else this clock."""
        return Clock(ICOUNT, self.shift) if self.auto else self

    def resolved(self, on_icount: bool) -> Clock:
        """``auto`` made a guest's clock: its icount, or the wall clock;
        any other clock is already one."""
        if not self.auto:
            return self
        return Clock(ICOUNT, self.shift) if on_icount else WALL_CLOCK

    @property
    def label(self) -> str:
        """``wall``, ``icount:SHIFT`` or ``auto:SHIFT``: how records,
        results.json and pages name it, and what ``parse`` reads back."""
        return WALL if self.kind == WALL else f"{self.kind}:{self.shift}"

    def accel_option(self, accel: str) -> str:
        """QEMU's ``-accel`` value: icount needs single-threaded TCG."""
        return f"{accel},thread=single" if self.icount and accel == "tcg" else accel

    def qemu_args(self, seed: int = DEFAULT_BOOT_SEED) -> list[str]:
        """QEMU's arguments for this clock.  Under icount also the boot's
        inputs, fixed (``ICOUNT_RTC_BASE``, ``seed``): the guest's RNG is
        then a generator's, which its SSH's ephemeral keys come from too;
        memqual's SSH is on 127.0.0.1 only, with a host side that stays
        random (docs/ab-runs.md, "The clock")."""
        if not self.icount:
            return []
        return [
            "-icount",
            f"shift={self.shift},sleep=off",
            "-rtc",
            f"base={ICOUNT_RTC_BASE},clock=vm",
            "-seed",
            str(seed),
        ]

    def reads(self) -> str:
        """What a guest-timed figure counts on this clock, in words."""
        if self.auto:
            return (
                f"read on each scenario's own clock, the one its primaries are decided on in fewer blocks: guest "
                f"instructions x {2 ** (self.shift or 0)} ns (icount shift {self.shift}) or wall time; every record "
                "names its own"
            )
        if self.icount:
            return (
                f"guest instructions x {2 ** (self.shift or 0)} ns (icount shift {self.shift}): "
                "host-side work costs the guest nothing on this clock"
            )
        return "wall time (the host's load is in it)"

    def describe(self) -> str:
        text = f"{self.label}: guest-timed figures are {self.reads()}"
        if self.icount or self.auto:
            which = "every icount guest" if self.auto else "every guest"
            text += f"; {which} boots with its RTC at {ICOUNT_RTC_BASE} and RDRAND seeded by its A/B block"
        return text


WALL_CLOCK = Clock()

# How much longer a guest's work takes in wall time under icount than the
# same work under multi-threaded TCG on this kind of host: every vCPU and
# the instruction counting in one host thread.  Measured here
# (docs/ab-calibration.md, "What icount costs in wall time here"): the A/B's
# 768 MiB inflate took 3.6 s under multi-threaded TCG at load 1.2-1.8, and
# 20-50 s under icount at load 6-16 (one missed its 120 s deadline at load
# 13-16 after 480 MiB); a boot to SSH 6-8 s against 9-49 s.
ICOUNT_WALL_FACTOR = 10


def deadline_s(seconds: float, the_clock: Clock | None = None) -> float:
    """A wall-time deadline for guest work, sized in ``seconds`` for the
    wall clock, on this run's clock: the same on the wall clock, and
    ``ICOUNT_WALL_FACTOR`` times longer under icount, where the guest runs
    that much slower -- still a deadline (a guest that stops moving is
    caught by its caller's stall window, whatever the clock)."""
    found = the_clock if the_clock is not None else current()
    return seconds * ICOUNT_WALL_FACTOR if found.icount else seconds


def icount(shift: int = DEFAULT_SHIFT) -> Clock:
    return Clock(ICOUNT, shift)


def parse(text: str) -> Clock:
    """``wall``, ``icount[:SHIFT]`` or ``auto[:SHIFT]``; anything else is
    BadInput."""
    value = text.strip().lower()
    if value == WALL:
        return WALL_CLOCK
    match = re.fullmatch(r"(icount|auto)(?::(\d{1,2}))?", value)
    if not match:
        raise BadInput(
            f"--clock {text!r}: give wall, icount[:SHIFT] or auto[:SHIFT] "
            f"(SHIFT 0-{MAX_SHIFT}, default {DEFAULT_SHIFT})"
        )
    return Clock(match.group(1), int(match.group(2)) if match.group(2) else DEFAULT_SHIFT)


def current() -> Clock:
    """This process's clock: ``$MEMQUAL_CLOCK``, else the wall clock."""
    value = settings.clock()
    if not value:
        return WALL_CLOCK
    try:
        return parse(value)
    except BadInput:
        raise BadInput(f"{settings.CLOCK}={value!r}: give wall, icount[:SHIFT] or auto[:SHIFT]") from None


def put(clock: Clock) -> None:
    """Make ``clock`` this process's and its children's."""
    settings.put(settings.CLOCK, clock.label)


@dataclasses.dataclass(frozen=True)
class Default:
    """The clock a run gets when not told, and why, in words a run's header
    prints."""

    clock: Clock
    why: str


def default(arms: int, accel: str) -> Default:
    """The clock a run of ``arms`` arms uses when not told, on ``accel``
    (``tcg`` or ``kvm``: a host under test runs under TCG).

    Two arms under TCG: ``auto`` at DEFAULT_SHIFT, each scenario on the
    clock that decides its primaries in fewer blocks (host/judge/clock_plan.py).
    On the wall clock a balloon-only A/B under TCG had after 17.7 minutes
    decided 2 of 5 primaries, inflate, deflate and the request size at
    intervals like [0.26, 4.7] over 2 blocks; on icount, with boots from
    fixed inputs, those decide in a few blocks, while the floor, free page
    reporting, KSM and hugetlbfs spread less and cost less on the wall
    clock, which ``auto`` keeps them on (docs/ab-calibration.md, "6.1
    against 6.12 on a quiet host").  Under KVM the wall clock: icount
    needs TCG.  One arm (``./qualify``, the claims) is about time: wall."""
    if arms != 2:
        return Default(WALL_CLOCK, "the default of a one-arm run")
    if accel == "kvm":
        return Default(WALL_CLOCK, "the default of a two-arm run under KVM, where icount cannot run")
    return Default(
        Clock(AUTO, DEFAULT_SHIFT),
        "the default of a two-arm run under TCG: each scenario on the clock whose measured block spread decides "
        "its primaries in fewer blocks",
    )


def resolve_accel(clock: Clock, requested: str) -> tuple[str, str] | None:
    """The accelerator an icount guest runs under, with why; None on the
    wall clock (the host's probe decides).  KVM asked for under icount is
    refused in one line."""
    if clock.auto and requested == "kvm":
        raise BadInput(
            f"--clock {clock.label} runs some scenarios under icount, which needs TCG: use --accel tcg or --clock wall"
        )
    if not clock.icount:
        return None
    if requested == "kvm":
        raise BadInput(
            f"--clock {clock.label} needs TCG (QEMU's instruction counter does not run under KVM): "
            "use --accel tcg or --clock wall"
        )
    return "tcg", f"TCG, single-threaded, because the clock is {clock.label}"


def version_tuple(version: str) -> tuple[int, ...]:
    """ "10.0.2" -> (10, 0, 2); "7.2.22" -> (7, 2, 22); what does not parse
    is (0,), older than every release."""
    parts = re.findall(r"\d+", version.split("+")[0].split("~")[0])
    return tuple(int(p) for p in parts[:3]) or (0,)


def runs_vcpus(clock: Clock, vcpus: int, qemu_version: str) -> bool:
    """Can this QEMU run a guest of ``vcpus`` vCPUs on this clock?"""
    strict = clock.strictest()
    return not (strict.icount and vcpus > 1 and version_tuple(qemu_version)[:2] < ICOUNT_SMP_MIN_QEMU)


def check_vcpus(clock: Clock, vcpus: int, qemu_version: str, fix: str = "") -> None:
    """One line (BadInput) when this QEMU cannot run the guest on this
    clock; ``fix`` says what to pass instead (default: a newer QEMU or the
    wall clock)."""
    if not runs_vcpus(clock, vcpus, qemu_version):
        need = ".".join(str(n) for n in ICOUNT_SMP_MIN_QEMU)
        raise BadInput(
            f"--clock {clock.label} with {vcpus} vCPUs needs QEMU {need} or later (QEMU {qemu_version} never "
            f"brings up a second vCPU under icount): " + (fix or f"pass --qemu {ICOUNT_SMP_QEMU} or --clock wall")
        )


def check_same(labels: dict[str, str]) -> str:
    """The one clock of several sources (an A/B's arms, compare's two
    files), given as ``{source: clock label}``; one line when they differ.
    A source that does not say (a record from before clocks) is wall."""
    return shared_fact(
        labels,
        WALL,
        differ="the figures were read with different clocks",
        advice="a ratio across clocks means nothing; measure both with the same --clock",
    )

"""A KSM measurement as data: knob writes and readings at full scans'
ends, the guest's mark and its QEMU's figures, in the order they happen.

On a host under test every command memqual sends lands in L1 at a moment
this machine's pace sets, so L1 runs a whole ``Schedule`` as one command
(``WholeSchedule``, host/ksm/l1_ksm.py), started by the guest's mark.
This machine's KsmController keeps driving step by step: it decides
between steps (a disturbed window is measured again).  Why and the
figures: docs/host-under-test.md, "One command a measurement".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from memqual.host.core.knobs import KNOB_NAME
from memqual.host.core.l1_marks import Mark
from memqual.host.ksm.sysfs import KsmCounters


@dataclasses.dataclass(frozen=True)
class SetKnob:
    """Write a KSM knob, at once when ksmd is stopped, else right after the
    scan end the step before read (every step but the first follows one)."""

    name: str
    value: int

    def __post_init__(self) -> None:
        if not KNOB_NAME.fullmatch(self.name):
            raise ValueError(f"not a sysfs attribute name: {self.name!r}")


@dataclasses.dataclass(frozen=True)
class ScanEnds:
    """A reading at each of the next ``count`` full-scan ends."""

    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"a schedule reads at 1 or more scan ends, not {self.count}")


@dataclasses.dataclass(frozen=True)
class OwnPages:
    """The pages KSM tracks for the guest's QEMU (its ksm_rmap_items)."""


@dataclasses.dataclass(frozen=True)
class AwaitMark:
    """Wait until the guest marks a moment of its work (host/core/qemu.py
    MARK_PORT): what follows starts there, on the guest's work's clock."""


@dataclasses.dataclass(frozen=True)
class AnonHuge:
    """The guest QEMU's AnonHugePages (kB): did THP back its RAM?"""


@dataclasses.dataclass(frozen=True)
class Now:
    """The host's clock (seconds since its boot) at this point: where a
    measurement times from a knob's write rather than a scan end."""


Step = SetKnob | ScanEnds | OwnPages | AwaitMark | AnonHuge | Now
STEP_TYPES = (SetKnob, ScanEnds, OwnPages, AwaitMark, AnonHuge, Now)


@dataclasses.dataclass(frozen=True)
class Schedule:
    steps: tuple[Step, ...]

    @property
    def scans(self) -> int:
        """The full scans the schedule waits for: what bounds its time."""
        return sum(s.count for s in self.steps if isinstance(s, ScanEnds))

    def __post_init__(self) -> None:
        # Knobs written before the first reading land while ksmd may still
        # be stopped; every later step follows a reading at a scan end, so
        # a knob written then lands in ksmd's sleep after that scan.
        if all(isinstance(s, SetKnob) for s in self.steps):
            raise ValueError("a schedule reads something: knobs alone are a plain write")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a schedule read: per ``ScanEnds`` step its readings, per
    ``OwnPages`` step its count (None where the kernel has no ksm_stat),
    each in the schedule's order."""

    scan_ends: tuple[tuple[KsmCounters, ...], ...]
    own_pages: tuple[int | None, ...]
    marks: tuple[Mark, ...] = ()
    anon_huge_kib: tuple[int | None, ...] = ()
    now_s: tuple[float, ...] = ()

    def check(self, schedule: Schedule) -> None:
        """ValueError unless this is every reading ``schedule`` asks for."""
        wanted = [s.count for s in schedule.steps if isinstance(s, ScanEnds)]
        got = [len(r) for r in self.scan_ends]

        def count(kind: type) -> int:
            return sum(1 for s in schedule.steps if isinstance(s, kind))

        others = (len(self.own_pages), len(self.marks), len(self.anon_huge_kib), len(self.now_s))
        if got != wanted or others != (count(OwnPages), count(AwaitMark), count(AnonHuge), count(Now)):
            raise ValueError(f"a schedule's outcome has readings {got} and counts {others}, not {wanted}")


@runtime_checkable
class WholeSchedule(Protocol):
    """A KSM that runs a whole ``Schedule`` as one command."""

    def run_schedule(self, schedule: Schedule, timeout_s: float) -> Outcome: ...

    def cancel_mark(self) -> None:
        """End a running schedule's wait for the guest's mark: the guest
        will not mark (its agent failed)."""


def steps_of(parts: Sequence[Step | Sequence[Step]]) -> Schedule:
    """A schedule from steps and lists of steps, flattened in order."""
    steps: list[Step] = []
    for part in parts:
        if isinstance(part, STEP_TYPES):
            steps.append(part)
        else:
            steps.extend(part)
    return Schedule(tuple(steps))

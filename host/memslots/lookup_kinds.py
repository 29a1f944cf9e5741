"""How often each kind of memslot lookup happens in a real guest under KVM.

Seed 002 ranks the kinds: complete misses (MMIO), then RAM hits, then other
hits.  ``TraceSession`` turns ``kvm:kvm_mmio`` and ``kvm:kvm_page_fault`` on
in tracefs and back to what they were; ``count(text, layout)`` sorts the
trace by the guest layout's slots.  e2e/test_memslots_kvm.py runs the
guest.  docs/memslots-kvm.md, "host/memslots/lookup_kinds.py"."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import Any

from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.record import Measurement
from memqual.host.memslots.layout import Layout
from memqual.host.memslots.workloads import SMALL_SLOT_PAGES

SCENARIO = "memslots.lookup_kinds"
METRIC = "events_per_s"
KINDS = ("miss", "ram_hit", "other_hit", "fault_no_slot")
EVENTS = ("kvm/kvm_mmio", "kvm/kvm_page_fault")
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))

_MMIO = re.compile(r"\bkvm_mmio: mmio (?:read|write|unsatisfied-read)\b")
_FAULT = re.compile(r"\bkvm_page_fault: .*?address (?:0x)?([0-9a-fA-F]+)")


@dataclasses.dataclass(frozen=True)
class Counts:
    """Lookups of each kind over ``seconds`` of the workload."""

    by_kind: dict[str, int]
    seconds: float

    def per_second(self, kind: str) -> float:
        return self.by_kind.get(kind, 0) / self.seconds if self.seconds > 0 else 0.0

    def order(self) -> list[str]:
        """The three kinds seed 002 ranks, most frequent first."""
        ranked = ("miss", "ram_hit", "other_hit")
        return sorted(ranked, key=lambda k: -self.by_kind.get(k, 0))


def count(trace_text: str, layout: Layout, seconds: float) -> Counts:
    """Classify every kvm_mmio and kvm_page_fault line of a tracefs trace."""
    kinds: Counter[str] = Counter({k: 0 for k in KINDS})
    for line in trace_text.splitlines():
        if _MMIO.search(line):
            kinds["miss"] += 1
            continue
        match = _FAULT.search(line)
        if not match:
            continue
        slot = layout.find(int(match.group(1), 16) >> 12)
        if slot is None:
            kinds["fault_no_slot"] += 1
        elif slot.npages > SMALL_SLOT_PAGES:
            kinds["ram_hit"] += 1
        else:
            kinds["other_hit"] += 1
    return Counts(dict(kinds), seconds)


def tracefs_root() -> Path:
    """The tracefs mount with the kvm events, or CapabilityMissing saying why."""
    for root in TRACEFS:
        if all((root / "events" / e / "enable").is_file() for e in EVENTS):
            return root
    raise CapabilityMissing(
        "no tracefs with the kvm:kvm_mmio and kvm:kvm_page_fault events "
        "(mount tracefs on /sys/kernel/tracing and load the kvm module)"
    )


class TraceSession:
    """The two events on, the buffer emptied; restored on leaving."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or tracefs_root()
        self._saved: dict[Path, str] = {}

    def __enter__(self) -> TraceSession:
        try:
            for event in EVENTS:
                knob = self.root / "events" / event / "enable"
                self._saved[knob] = knob.read_text().strip()
                knob.write_text("1")
            (self.root / "trace").write_text("")  # an empty write clears the buffer
        except BaseException:
            self._restore()
            raise
        return self

    def read(self) -> str:
        return (self.root / "trace").read_text(errors="replace")

    def _restore(self) -> None:
        for knob, value in self._saved.items():
            knob.write_text(value or "0")
        self._saved.clear()

    def __exit__(self, *exc: Any) -> None:
        self._restore()


def records(per_boot: list[Counts], settings: dict[str, Any]) -> list[Measurement]:
    """One record a kind: events per second of the workload, one replicate
    per fresh guest."""
    return [
        Measurement(
            scenario=SCENARIO,
            metric=METRIC,
            unit="1/s",
            better="lower",
            samples=[],
            replicates=[[c.per_second(kind)] for c in per_boot],
            variant={"kind": kind},
            settings=dict(settings),
            extra={"counts": [c.by_kind.get(kind, 0) for c in per_boot], "seconds": [c.seconds for c in per_boot]},
        )
        for kind in KINDS
    ]

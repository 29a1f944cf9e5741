"""Memslot searches by kind, counted by the host under test's kernel
(images/kvm-memslots/0001's counters and per-slot ``memslot_slots``): L1
resets them, the guest works, L1 reads them.  A miss found no slot, a RAM
hit found a slot over the guest's System RAM (its /proc/iomem), an other
hit any other slot (ROMs, VGA memory).  docs/memslots-kvm.md, "A guest's
page faults in the host under test".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memqual.host.core.errors import CapabilityMissing, GuestError
from memqual.host.core.shell import Shell
from memqual.host.memslots.l1_lookup import Counters

PARAMETERS = "/sys/module/kvm/parameters"
COUNTERS = ("memslot_lookups", "memslot_nodes", "memslot_misses", "memslot_miss_nodes")
SLOTS = "memslot_slots"
# Constant scripts (no input reaches them): the counters as "NAME VALUE"
# lines, then the slot list after a "slots" line; and the reset of all.
READ_SCRIPT = (
    f"cd {PARAMETERS} && for f in {' '.join(COUNTERS)} memslot_search; do "
    'printf "%s %s\\n" "$f" "$(cat "$f")"; done && echo slots && cat ' + SLOTS
)
RESET_SCRIPT = f'cd {PARAMETERS} && for f in {" ".join(COUNTERS)} {SLOTS}; do echo 0 > "$f"; done'
COUNTED_SCRIPT = f"test -e {PARAMETERS}/{SLOTS}"


def require_counters(shell: Shell, host: str) -> None:
    """A CapabilityMissing naming the remedy where the host kernel does not
    count its memslot searches by slot (no memqual kvm-memslots patches):
    sysfs has no such parameter to reset or read."""
    if shell.run(["sh", "-c", COUNTED_SCRIPT], check=False).status != 0:
        raise CapabilityMissing(
            f"the host kernel {host} does not count its memslot searches ({PARAMETERS}/{SLOTS} is missing): "
            "build it with images/kvm-memslots/ (images/kvm-memslots/README.md) and give that kernel"
        )


TRUNCATED = "truncated"
KINDS = ("miss", "ram_hit", "other_hit")

_SLOT = re.compile(r"(-?\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)")
# A structure's name as the model spells it: nothing else reaches a terminal.
_SEARCH = re.compile(r"[a-z0-9_-]{1,32}")
_RAM = re.compile(r"^([0-9a-fA-F]+)-([0-9a-fA-F]+) : System RAM$")


@dataclass(frozen=True)
class SlotCount:
    """One memslot of one VM, and the searches that found it."""

    pid: int
    as_id: int
    slot_id: int
    base_gfn: int
    npages: int
    hits: int
    hit_nodes: int

    def overlaps(self, ranges: Sequence[tuple[int, int]]) -> bool:
        """Does the slot cover any gfn of these [start, end) ranges?"""
        end = self.base_gfn + self.npages
        return any(start < end and self.base_gfn < stop for start, stop in ranges)


@dataclass(frozen=True)
class Reading:
    """The counters and the slot list as L1 printed them."""

    counters: Counters
    slots: tuple[SlotCount, ...]
    search: str
    truncated: bool = False


@dataclass(frozen=True)
class KindCounts:
    """One window's searches sorted by kind, and the nodes each kind
    compared.  ``unattributed``: searches that found a slot no longer in
    the list (replaced during the window), counted as hits of no kind."""

    misses: int
    miss_nodes: int
    ram_hits: int
    ram_hit_nodes: int
    other_hits: int
    other_hit_nodes: int
    unattributed: int = 0

    @property
    def lookups(self) -> int:
        return self.misses + self.ram_hits + self.other_hits + self.unattributed

    def count(self, kind: str) -> int:
        return {"miss": self.misses, "ram_hit": self.ram_hits, "other_hit": self.other_hits}[kind]

    def nodes_per(self, kind: str) -> float | None:
        """Mean nodes a search of this kind compared; None when none ran."""
        count = self.count(kind)
        nodes = {"miss": self.miss_nodes, "ram_hit": self.ram_hit_nodes, "other_hit": self.other_hit_nodes}[kind]
        return nodes / count if count else None

    def nodes_shown(self) -> dict[str, str]:
        """Each kind's nodes a search as a table cell ("-": none ran)."""
        return {k: "-" if (v := self.nodes_per(k)) is None else f"{v:.2f}" for k in KINDS}

    def order(self) -> list[str]:
        """The kinds, most frequent first (ties in seed 002's order)."""
        return sorted(KINDS, key=lambda k: -self.count(k))


def parse_reading(text: str) -> Reading:
    """READ_SCRIPT's output; GuestError when it is not that (a kernel
    without 0001's counters prints no slot list)."""
    head, sep, tail = text.partition("\nslots\n")
    if not sep:
        raise GuestError(
            f"L1 printed no {SLOTS} list: the host kernel does not count its memslot search by slot "
            f"(build it with images/kvm-memslots/0001): {text.strip()[-200:]!r}"
        )
    values: dict[str, str] = {}
    for line in head.splitlines():
        name, _, value = line.strip().partition(" ")
        values[name] = value.strip()
    try:
        counters = Counters(*(int(values[name]) for name in COUNTERS))
    except (KeyError, ValueError):
        raise GuestError(f"L1's memslot counters unreadable: {head.strip()[-200:]!r}") from None
    slots, truncated = [], False
    for line in tail.splitlines():
        if line.strip() == TRUNCATED:
            truncated = True
        elif line.strip():
            match = _SLOT.fullmatch(line.strip())
            if match is None:
                raise GuestError(f"L1's {SLOTS} line unreadable: {line.strip()[:120]!r}")
            slots.append(SlotCount(*(int(g) for g in match.groups())))
    search = values.get("memslot_search", "")
    if search and not _SEARCH.fullmatch(search):
        raise GuestError("L1's memslot_search is not a structure's name")
    return Reading(counters, tuple(slots), search, truncated)


def system_ram(iomem: str) -> tuple[tuple[int, int], ...]:
    """The guest's System RAM as gfn ranges [start, end), from its
    /proc/iomem (read as root: others see zeros)."""
    ranges = []
    for line in iomem.splitlines():
        match = _RAM.match(line.strip()) if not line.startswith(" ") else None
        if match:
            start, end = int(match.group(1), 16), int(match.group(2), 16)
            ranges.append((start >> 12, (end >> 12) + 1))
    if not ranges or all(end <= 1 for _start, end in ranges):
        raise GuestError("the guest's /proc/iomem shows no System RAM (read it as root)")
    return tuple(ranges)


def sort_kinds(reading: Reading, ram: Sequence[tuple[int, int]]) -> KindCounts:
    """The window's searches by kind: the slot list's hits, each by whether
    its slot covers guest RAM, and the misses."""
    if reading.truncated:
        raise GuestError(f"L1's {SLOTS} list was truncated: more slots than a page holds, hits unsorted")
    c = reading.counters
    miss_nodes = c.miss_nodes if c.miss_nodes is not None else 0
    on_ram = [s for s in reading.slots if s.overlaps(ram)]
    other = [s for s in reading.slots if not s.overlaps(ram)]
    ram_hits, other_hits = sum(s.hits for s in on_ram), sum(s.hits for s in other)
    return KindCounts(
        misses=c.misses,
        miss_nodes=miss_nodes,
        ram_hits=ram_hits,
        ram_hit_nodes=sum(s.hit_nodes for s in on_ram),
        other_hits=other_hits,
        other_hit_nodes=sum(s.hit_nodes for s in other),
        unattributed=max(0, c.lookups - c.misses - ram_hits - other_hits),
    )

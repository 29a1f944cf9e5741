"""Memslot layouts: the slots a VM registers, as data.

A slot has an id, a first gfn, a size in 4 KiB pages and flags; the order
of ``Layout.slots`` is the registration order.  ``layout_from_json``
parses the JSON form, ``load_layout(name_or_path)`` a shipped layout
(``layouts/``) or a file; every problem is one BadInput naming the slots.
docs/memslots-model.md, "host/memslots/layout.py", has the file format."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json
from memqual.host.core.paths import write_private_atomic

PAGE_SIZE = 4096
# KVM_CAP_NR_MEMSLOTS on today's x86 kernels (32768 minus the private slots).
DEFAULT_SLOT_LIMIT = 32764
# A gfn is a 64-bit guest physical address shifted by the page size.
GFN_LIMIT = 1 << 52

KVM_MEM_LOG_DIRTY_PAGES = 1
KVM_MEM_READONLY = 2

LAYOUTS_DIR = Path(__file__).resolve().parent / "layouts"
SHIPPED_LAYOUTS = ("seed-3", "seed-3-stacked", "seed-32", "qemu-pc-3dimm", "qemu-q35-3g-2dimm")


@dataclasses.dataclass(frozen=True)
class Slot:
    """One memory slot: gfns ``base_gfn`` .. ``base_gfn + npages - 1``."""

    id: int
    base_gfn: int
    npages: int
    flags: int = 0

    @property
    def end_gfn(self) -> int:
        """One past the last gfn of the slot."""
        return self.base_gfn + self.npages

    def contains(self, gfn: int) -> bool:
        return self.base_gfn <= gfn < self.base_gfn + self.npages

    def describe(self) -> str:
        """``slot 3 (gfn 0x100-0x1ff)``: how messages name a slot."""
        last = self.base_gfn + self.npages - 1
        return f"slot {self.id} (gfn {self.base_gfn:#x}-{last:#x})"

    def to_json(self) -> dict[str, int]:
        return {"id": self.id, "base_gfn": self.base_gfn, "npages": self.npages, "flags": self.flags}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Slots in registration order.  ``name`` is only for reports."""

    slots: tuple[Slot, ...]
    name: str = ""

    def __post_init__(self) -> None:
        # Accept any sequence but store a tuple so a Layout stays hashable
        # and nobody mutates a shipped layout in place.
        object.__setattr__(self, "slots", tuple(self.slots))

    def __len__(self) -> int:
        return len(self.slots)

    def by_gfn(self) -> list[Slot]:
        return sorted(self.slots, key=lambda s: s.base_gfn)

    def find(self, gfn: int) -> Slot | None:
        """Brute force: the slot holding ``gfn``; the oracle of the tests."""
        for slot in self.slots:
            if slot.contains(gfn):
                return slot
        return None

    def total_pages(self) -> int:
        return sum(s.npages for s in self.slots)

    def to_json(self) -> dict[str, Any]:
        return {"slots": [s.to_json() for s in self.slots]}


def validate(layout: Layout, limit: int = DEFAULT_SLOT_LIMIT) -> Layout:
    """Return ``layout`` if KVM would accept it, else raise BadInput.

    Checks: at most ``limit`` slots, no duplicate ids, ids and flags not
    negative, no zero or negative size, the range inside the 52-bit gfn
    space, no two slots overlapping.  The message names the slots at fault
    and says what to change.
    """
    where = f"layout {layout.name!r}: " if layout.name else "layout: "
    if len(layout.slots) > limit:
        raise BadInput(
            f"{where}{len(layout.slots)} slots, more than the limit of {limit}: "
            f"remove {len(layout.slots) - limit} slots (first over the limit: slot {layout.slots[limit].id})"
        )
    seen: dict[int, int] = {}
    for index, slot in enumerate(layout.slots):
        if slot.id < 0:
            raise BadInput(f"{where}slot {slot.id} has a negative id: ids are 0 and up")
        if slot.id in seen:
            raise BadInput(
                f"{where}duplicate slot id {slot.id} (entries {seen[slot.id]} and {index}): give each slot its own id"
            )
        seen[slot.id] = index
        if slot.npages <= 0:
            raise BadInput(f"{where}slot {slot.id} has npages {slot.npages}: a slot needs at least one page")
        if slot.base_gfn < 0 or slot.end_gfn > GFN_LIMIT:
            raise BadInput(
                f"{where}slot {slot.id} (base_gfn {slot.base_gfn:#x}, npages {slot.npages}) "
                f"is outside the gfn space 0-{GFN_LIMIT - 1:#x}"
            )
        if slot.flags < 0:
            raise BadInput(f"{where}slot {slot.id} has negative flags {slot.flags}")
    ordered = layout.by_gfn()
    for lower, upper in itertools.pairwise(ordered):
        if upper.base_gfn < lower.end_gfn:
            raise BadInput(f"{where}{lower.describe()} and {upper.describe()} overlap: move or shrink one of them")
    return layout


# A slot as Layout.to_json writes it; flags may be left out (0).
_REQUIRED_KEYS = ("id", "base_gfn", "npages")
_SLOT_KEYS = {*_REQUIRED_KEYS, "flags"}


def from_json(data: Any, name: str = "", source: str = "layout") -> Layout:
    """Build and validate a layout from the parsed JSON object."""
    if not isinstance(data, dict) or not isinstance(data.get("slots"), list):
        raise BadInput(f'{source}: expected an object {{"slots": [...]}}')
    slots = []
    for index, entry in enumerate(data["slots"]):
        where = f"{source}: slot entry {index}"
        if not isinstance(entry, dict):
            raise BadInput(f"{where} is not an object")
        unknown = set(entry) - _SLOT_KEYS
        if unknown:
            raise BadInput(f"{where} has unknown keys {sorted(unknown)}")
        for key in _REQUIRED_KEYS:
            if key not in entry:
                raise BadInput(f"{where} has no {key!r}: each slot needs id, base_gfn, npages")
        for key, value in entry.items():
            # bool is an int subclass; true as a gfn is a typo, not a number.
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadInput(f"{where} {key!r} is {value!r}, not an integer")
        slots.append(Slot(**entry))
    return validate(Layout(tuple(slots), name=name))


def layout_from_json(data: Any, source: str = "layout") -> Layout:
    """A validated layout from the dict a layout file or a record holds
    (``{"slots": [{"id", "base_gfn", "npages", "flags"}, ...]}``, as
    ``Layout.to_json`` writes it; the ``extra["layout"]`` of a
    ``memslots.guest_layout`` record).  ``source`` names it in messages and
    becomes the layout's name.  Raises BadInput naming what is wrong."""
    return from_json(data, name=source, source=source)


def save_layout(layout: Layout, path: Path | str) -> None:
    """Write ``layout`` as JSON, one slot per line (diffs stay readable)."""
    lines = ",\n".join("    " + json.dumps(s.to_json()) for s in layout.slots)
    write_private_atomic(Path(path), ('{"slots": [\n' + lines + "\n]}\n").encode(), 0o644)


def load_layout(name_or_path: str | Path) -> Layout:
    """A shipped layout by name, or a layout file; validated.

    Raises BadInput for an unknown name, a missing or unreadable file, bad
    JSON or an invalid layout.
    """
    text_name = str(name_or_path)
    if text_name in SHIPPED_LAYOUTS:
        path = LAYOUTS_DIR / f"{text_name}.json"
        name = text_name
    else:
        path = Path(name_or_path)
        name = text_name
        if not path.exists():
            if path.suffix == "" and "/" not in text_name:
                raise BadInput(
                    f"unknown layout {text_name!r}: give a layout file or one of {', '.join(SHIPPED_LAYOUTS)}"
                )
            raise BadInput(f"layout file {text_name} not found: give an existing JSON file")
    data = read_json(path, "layout file", 'give {"slots": [{"id", "base_gfn", "npages", "flags"}, ...]}')
    return from_json(data, name=name, source=f"layout {name}")


_HEX_GFN = re.compile(r"0[xX][0-9a-fA-F]+")
_DEC_GFN = re.compile(r"[0-9]+")


def parse_gfn(text: str) -> int:
    """A gfn from the command line: decimal or 0x-prefixed hex."""
    stripped = text.strip()
    if _HEX_GFN.fullmatch(stripped):
        value = int(stripped[2:], 16)
    elif _DEC_GFN.fullmatch(stripped):
        value = int(stripped, 10)
    else:
        raise BadInput(f"bad gfn {text!r}: give a decimal number or 0x-prefixed hex")
    if value >= GFN_LIMIT:
        raise BadInput(f"bad gfn {text!r}: above the gfn space (max {GFN_LIMIT - 1:#x})")
    return value

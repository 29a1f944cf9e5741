"""QEMU's flat view of guest memory: the ranges ``info mtree -f`` prints for
an address space, parsed into typed values.

Machinery below the subjects: memslots reads its layouts from it
(memqual.host.memslots.qemu_layout) and virtio-mem the memslots its device
occupies (memqual.host.virtio_mem).  It imports no subject.
"""

from __future__ import annotations

import dataclasses
import re

from memqual.host.core.errors import BadInput

_FLAT_LINE = re.compile(r"^\s*([0-9a-fA-F]+)-([0-9a-fA-F]+) \(prio (-?\d+), ([a-z/ ]+?)\): (\S+)(?: @([0-9a-fA-F]+))?")
SLOT_KINDS = ("ram", "rom", "romd")  # flat-view range types KVM maps as memslots


@dataclasses.dataclass(frozen=True)
class FlatRange:
    """One range of a QEMU flat view: [start, end] inclusive, as printed."""

    start: int
    end: int
    kind: str  # ram, rom, romd, i/o
    name: str  # the memory region
    offset: int = 0  # offset into the region ("@..." in the output)

    @property
    def size(self) -> int:
        return self.end - self.start + 1


def parse_flatview(text: str, address_space: str = "memory") -> list[FlatRange]:
    """The ranges of the flat view that serves ``address_space`` in the
    output of ``info mtree -f``.  Raises BadInput when it is not there."""
    ranges: list[FlatRange] = []
    in_view = found = False
    for line in text.splitlines():
        if line.startswith("FlatView #"):
            in_view = False
            continue
        if line.startswith(" AS "):
            if re.match(rf' AS "{re.escape(address_space)}",', line):
                in_view = found = True
            continue
        if not in_view:
            continue
        match = _FLAT_LINE.match(line)
        if match:
            start, end, _prio, kind, name, offset = match.groups()
            ranges.append(FlatRange(int(start, 16), int(end, 16), kind, name, int(offset or "0", 16)))
    if not found:
        raise BadInput(f'no flat view of address space "{address_space}" in the info mtree -f output')
    return ranges

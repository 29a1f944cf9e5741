"""The interface every gfn -> memslot lookup structure shares, ``SlotIndex``,
and the bookkeeping behind it; the structures are in slot_arrays.py,
slot_trees.py and rbtree.py, their registry in structures.py
(docs/memslots-model.md, "The structures and the counting rule")."""

from __future__ import annotations

import abc
import bisect
from collections.abc import Iterable
from typing import ClassVar

from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import Slot


def balanced_bound(n: int) -> int:
    """ceil(log2(n + 1)): the height of a perfectly balanced tree of n nodes
    and the worst number of probes of a binary search over n entries."""
    return n.bit_length()


class SlotIndex(abc.ABC):
    """Common interface and the bookkeeping every structure shares: the slots
    by id and by gfn, used to refuse duplicates and overlaps."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self._by_id: dict[int, Slot] = {}
        self._bases: list[int] = []  # sorted base gfns
        self._sorted: list[Slot] = []  # slots in gfn order, parallel to _bases

    def __len__(self) -> int:
        return len(self._by_id)

    def slots(self) -> list[Slot]:
        """The slots in gfn order."""
        return list(self._sorted)

    def _register(self, slot: Slot) -> int:
        """Record ``slot``; return its position in gfn order."""
        if slot.npages <= 0:
            raise BadInput(f"{slot.describe()} has npages {slot.npages}: a slot needs at least one page")
        if slot.id in self._by_id:
            raise BadInput(f"slot id {slot.id} is already registered: delete it first")
        pos = bisect.bisect_left(self._bases, slot.base_gfn)
        if pos > 0 and self._sorted[pos - 1].end_gfn > slot.base_gfn:
            raise BadInput(f"{slot.describe()} overlaps {self._sorted[pos - 1].describe()}")
        if pos < len(self._sorted) and self._sorted[pos].base_gfn < slot.end_gfn:
            raise BadInput(f"{slot.describe()} overlaps {self._sorted[pos].describe()}")
        self._by_id[slot.id] = slot
        self._bases.insert(pos, slot.base_gfn)
        self._sorted.insert(pos, slot)
        return pos

    def _unregister(self, slot_id: int) -> tuple[Slot, int]:
        """Forget slot ``slot_id``; return it and its former gfn position."""
        slot = self._by_id.pop(slot_id, None)
        if slot is None:
            raise BadInput(f"no slot with id {slot_id} to delete")
        pos = bisect.bisect_left(self._bases, slot.base_gfn)
        del self._bases[pos]
        del self._sorted[pos]
        return slot, pos

    @abc.abstractmethod
    def insert(self, slot: Slot) -> None: ...

    def extend(self, slots: Iterable[Slot]) -> None:
        """Insert ``slots`` in order; a structure may do it in one go when
        the result is the same (hbtree, tree2011)."""
        for slot in slots:
            self.insert(slot)

    @abc.abstractmethod
    def delete(self, slot_id: int) -> Slot: ...

    @abc.abstractmethod
    def lookup(self, gfn: int) -> tuple[int | None, int]: ...

    @abc.abstractmethod
    def check(self) -> None:
        """Raise AssertionError if the structure's invariant is broken."""

    @staticmethod
    def bound(n: int) -> int | None:
        """Worst nodes examined by any lookup with n slots, or None."""
        return n

"""The array structures of gfn -> memslot lookup: ``linear``, ``reorder``,
``binsearch`` and ``binsearch-lru`` (docs/memslots-model.md, "The
structures and the counting rule")."""

from __future__ import annotations

import bisect

from memqual.host.memslots.layout import Slot
from memqual.host.memslots.slot_index import SlotIndex, balanced_bound


class LinearArray(SlotIndex):
    """The 2011 memslot array as Linux v3.0 searched it
    (virt/kvm/kvm_main.c ``__gfn_to_memslot``): ``memslots[]`` indexed by
    slot id, walked ``for (i = 0; i < slots->nmemslots; ++i)``, first match
    wins.  ``__kvm_set_memory_region`` raised ``nmemslots`` to
    ``mem->slot + 1`` and never lowered it, so the walk covers every entry
    up to the highest id ever registered, empty (npages = 0) ones included:
    each is compared with the gfn like any other.  A miss therefore costs
    ``nmemslots`` entries, not the number of slots in use; on an x86 host
    the private slots above the 32 user slots (host/memslots/kvm2011.py)
    put it at 35 on VMX whatever the guest."""

    name = "linear"

    def __init__(self) -> None:
        super().__init__()
        # Indexed by slot id: (base, end, id), or None for an empty entry.
        self._array: list[tuple[int, int, int] | None] = []

    @property
    def nmemslots(self) -> int:
        """Entries a miss walks: one past the highest id ever registered."""
        return len(self._array)

    def insert(self, slot: Slot) -> None:
        self._register(slot)
        if slot.id >= len(self._array):
            self._array.extend([None] * (slot.id + 1 - len(self._array)))
        self._array[slot.id] = (slot.base_gfn, slot.end_gfn, slot.id)

    def delete(self, slot_id: int) -> Slot:
        slot, _ = self._unregister(slot_id)
        self._array[slot_id] = None  # the entry stays, empty: nmemslots does not shrink
        return slot

    def lookup(self, gfn: int) -> tuple[int | None, int]:
        nodes = 0
        for entry in self._array:
            nodes += 1
            if entry is not None and entry[0] <= gfn < entry[1]:
                return entry[2], nodes
        return None, nodes

    def order(self) -> list[int]:
        """Slot ids in search order."""
        return [e[2] for e in self._array if e is not None]

    def check(self) -> None:
        assert sorted(self.order()) == sorted(self._by_id), "entries differ from the registered slots"
        assert all(e is None or e[2] == i for i, e in enumerate(self._array)), "an entry is not at its slot id"

    def bound(self, n: int) -> int | None:  # type: ignore[override]  # the bound needs the ids, n alone does not give it
        # The walk is as long as the array, which the ids set, not n.
        return max(n, self.nmemslots)


class ReorderArray(SlotIndex):
    """The array kept sorted by size, largest first (seed 002's "reorder",
    merged in v3.3 as "KVM: sort memslots by its size").  Empty entries
    sort to the end and the walk (``kvm_for_each_memslot``) stops at the
    first, so a miss reads the slots in use.  Equal sizes keep their
    registration order."""

    name = "reorder"

    def __init__(self) -> None:
        super().__init__()
        self._entries: list[tuple[int, int, int]] = []
        self._neg_sizes: list[int] = []  # -npages, ascending, parallel to _entries

    def insert(self, slot: Slot) -> None:
        self._register(slot)
        # bisect_right: after every slot of the same size (stable).
        pos = bisect.bisect_right(self._neg_sizes, -slot.npages)
        self._neg_sizes.insert(pos, -slot.npages)
        self._entries.insert(pos, (slot.base_gfn, slot.end_gfn, slot.id))

    def delete(self, slot_id: int) -> Slot:
        slot, _ = self._unregister(slot_id)
        pos = next(i for i, e in enumerate(self._entries) if e[2] == slot_id)
        del self._entries[pos]
        del self._neg_sizes[pos]
        return slot

    def lookup(self, gfn: int) -> tuple[int | None, int]:
        nodes = 0
        for base, end, sid in self._entries:
            nodes += 1
            if base <= gfn < end:
                return sid, nodes
        return None, nodes

    def order(self) -> list[int]:
        """Slot ids in search order."""
        return [e[2] for e in self._entries]

    def check(self) -> None:
        assert sorted(self.order()) == sorted(self._by_id), "entries differ from the registered slots"
        sizes = [e[1] - e[0] for e in self._entries]
        assert sizes == sorted(sizes, reverse=True), "reorder array is not sorted by size"


class BinarySearchArray(SlotIndex):
    """Slots sorted by gfn, three-way binary search.

    Each probe compares the gfn with one slot's range and stops on a hit.
    The 2014 kernel searched for a lower bound instead and checked the
    candidate at the end (one more comparison on a hit, no early exit); the
    three-way search is the walk of the implicit perfectly balanced tree,
    which keeps the comparison with the trees fair."""

    name = "binsearch"

    def __init__(self) -> None:
        super().__init__()
        self._entries: list[tuple[int, int, int]] = []

    def insert(self, slot: Slot) -> None:
        pos = self._register(slot)
        self._entries.insert(pos, (slot.base_gfn, slot.end_gfn, slot.id))

    def delete(self, slot_id: int) -> Slot:
        slot, pos = self._unregister(slot_id)
        del self._entries[pos]
        return slot

    def lookup(self, gfn: int) -> tuple[int | None, int]:
        entries = self._entries
        lo, hi = 0, len(entries)
        nodes = 0
        while lo < hi:
            mid = (lo + hi) >> 1
            nodes += 1
            base, end, sid = entries[mid]
            if gfn < base:
                hi = mid
            elif gfn >= end:
                lo = mid + 1
            else:
                return sid, nodes
        return None, nodes

    def check(self) -> None:
        assert [e[2] for e in self._entries] == [s.id for s in self._sorted], "entries not in gfn order"

    @staticmethod
    def bound(n: int) -> int | None:
        # Each probe leaves at most floor(m / 2) candidates out of m.
        return balanced_bound(n)


class BinarySearchLRU(BinarySearchArray):
    """Binary search behind a cache of the last slot hit (the 2014 kernel's
    ``lru_slot``).  The cache probe is one node when the cache holds a slot;
    a miss leaves the cache alone; deleting the cached slot empties it."""

    name = "binsearch-lru"

    def __init__(self) -> None:
        super().__init__()
        self._last: tuple[int, int, int] | None = None

    def delete(self, slot_id: int) -> Slot:
        if self._last is not None and self._last[2] == slot_id:
            self._last = None
        return super().delete(slot_id)

    def lookup(self, gfn: int) -> tuple[int | None, int]:
        last = self._last
        if last is not None:
            if last[0] <= gfn < last[1]:
                return last[2], 1
            cached = 1
        else:
            cached = 0
        entries = self._entries
        lo, hi = 0, len(entries)
        nodes = cached
        while lo < hi:
            mid = (lo + hi) >> 1
            nodes += 1
            entry = entries[mid]
            if gfn < entry[0]:
                hi = mid
            elif gfn >= entry[1]:
                lo = mid + 1
            else:
                self._last = entry
                return entry[2], nodes
        return None, nodes

    def check(self) -> None:
        super().check()
        if self._last is not None:
            assert self._last[2] in self._by_id, "cache holds a deleted slot"
            assert self._last[1] - self._last[0] == self._by_id[self._last[2]].npages, "stale cache entry"

    @staticmethod
    def bound(n: int) -> int | None:
        return balanced_bound(n) + 1

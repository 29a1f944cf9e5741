"""Lookup structures for gfn -> memslot, each counting the nodes it examines.

Seven structures (``linear``, ``reorder``, ``tree2011``, ``hbtree``,
``binsearch``, ``binsearch-lru``, ``rbtree``) behind one interface,
``SlotIndex``: insert, delete, lookup (slot and nodes examined), ``check``
(the invariant) and ``bound`` (the worst lookup by construction).  The
counting rule and each structure: docs/memslots-model.md, "The structures
and the counting rule".  A duplicate id, an overlapping slot or an unknown
id is BadInput.
"""

from __future__ import annotations

import abc
import bisect
import math
from collections.abc import Iterable, Iterator
from typing import ClassVar, Generic, Protocol, Self, TypeVar

from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import Layout, Slot


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


# --- arrays -------------------------------------------------------------------


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


# --- trees --------------------------------------------------------------------


class _Node(Protocol):
    """What the shared walk reads of a tree node: its slot's range and id and
    its children, each a node of the same class or the tree's empty link
    (None, or the red-black tree's sentinel)."""

    @property
    def base(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def left(self) -> Self | None: ...
    @property
    def right(self) -> Self | None: ...


NodeT = TypeVar("NodeT", bound=_Node)


class _TreeWalk(SlotIndex, Generic[NodeT]):
    """The lookup every binary search tree here shares: go left below a
    node's range, right above it, stop inside it.  An empty link is None;
    a tree with a sentinel leaf (``_nil``) overrides ``lookup`` to stop at
    it and sets ``_root`` to it when empty."""

    _nil: ClassVar[object] = None

    def __init__(self) -> None:
        super().__init__()
        self._root: NodeT | None = None

    def lookup(self, gfn: int) -> tuple[int | None, int]:
        node = self._root
        nil = self._nil  # None, or the tree's sentinel leaf
        nodes = 0
        while node is not None and node is not nil:
            nodes += 1
            if gfn < node.base:
                node = node.left
            elif gfn >= node.end:
                node = node.right
            else:
                return node.id, nodes
        return None, nodes

    def height(self) -> int:
        """Nodes on the longest root-to-leaf path (the worst miss)."""

        # Iterative: tree2011 can be n deep, beyond Python's recursion limit.
        deepest = 0
        stack = [(self._root, 1)]
        while stack:
            node, depth = stack.pop()
            if node is None or node is self._nil:
                continue
            deepest = max(deepest, depth)
            stack.append((node.left, depth + 1))
            stack.append((node.right, depth + 1))
        return deepest

    def inorder(self) -> Iterator[NodeT]:
        stack: list[NodeT] = []
        node = self._root
        nil = self._nil
        while stack or (node is not None and node is not nil):
            while node is not None and node is not nil:
                stack.append(node)
                node = node.left
            top = stack.pop()
            yield top
            node = top.right

    def _check_order(self) -> None:
        ids = [n.id for n in self.inorder()]
        assert ids == [s.id for s in self._sorted], "tree is not in gfn order"


class _WNode:
    __slots__ = ("base", "end", "id", "npages", "left", "right")

    def __init__(self, slot: Slot) -> None:
        self.base = slot.base_gfn
        self.end = slot.end_gfn
        self.id = slot.id
        self.npages = slot.npages
        self.left: _WNode | None = None
        self.right: _WNode | None = None


class HeightBudgetedTree(_TreeWalk[_WNode]):
    """memqual's own proposal (no kernel ever had it): a gfn search tree that
    puts the largest slots near the top, within a height budget that keeps
    every miss short.

    Invariant (checked by ``check()``), for n slots:

    W1. In-order traversal gives the slots in gfn order.
    W2. Height budget: the root has budget H(n) = ceil(log2(n + 1)) + 1 and
        each child one less than its parent.  A subtree with budget b holds
        at most 2^b - 1 slots, so its height is at most b.  Hence a miss
        examines at most H(n) nodes: one more than a perfectly balanced tree.
    W3. Weight rule: the root of every subtree (m slots, budget b) is the
        heaviest slot (most pages) among the positions i (0-based, gfn order
        within the subtree) that keep both sides within budget b - 1:
        i <= 2^(b-1) - 1 and m - 1 - i <= 2^(b-1) - 1.  Ties go to the
        position nearest the middle, then to the lower gfn.

    W1-W3 determine the tree from the set of slots alone.  At the root the
    window spans every position (2^(H-1) - 1 >= n), so the largest slot is
    always the root: a hit into the biggest RAM slot costs one node, as
    seed 000 wanted; the budget forces balance only where the slack of one
    level runs out.

    Rebalancing after insert and delete: walk down from the root along the
    changed gfn; where a subtree's root is still the right choice, keep the
    node and descend only into the side that changed (the other side keeps
    its slots and its budget, so it is still valid); where it is not, rebuild
    that subtree by the rule (a partial rebuild, as a scapegoat tree does).
    When n crosses a power of two H(n) changes and both sides are revisited.
    Cost: O(n) per update (the window scan at the top), O(log n) nodes
    rebuilt for most updates; lookups are what the model is about.

    The 2011 tree (``Tree2011``) kept the heaviest node on top of each
    subtree without a height budget, so a run of ever smaller slots made a
    path of n nodes; W2 is what bounds the miss here.
    """

    name = "hbtree"

    def __init__(self) -> None:
        super().__init__()
        self._budget = 0  # H(n) the current tree was built for
        self.rebuilt_nodes = 0  # nodes created by rebalancing, for tests and docs

    @staticmethod
    def budget(n: int) -> int:
        return balanced_bound(n) + 1 if n else 0

    @staticmethod
    def bound(n: int) -> int | None:
        return HeightBudgetedTree.budget(n)

    @staticmethod
    def _pick(slots: list[Slot], lo: int, hi: int, budget: int) -> int:
        """Index (into ``slots``) of the root W3 chooses for slots[lo:hi]."""
        m = hi - lo
        cap = (1 << (budget - 1)) - 1
        first = lo + max(0, m - 1 - cap)
        last = lo + min(m - 1, cap)
        middle2 = lo + hi - 1  # twice the middle position, to stay in integers
        best = first
        best_key = (slots[first].npages, -abs(2 * first - middle2), -slots[first].base_gfn)
        for i in range(first + 1, last + 1):
            key = (slots[i].npages, -abs(2 * i - middle2), -slots[i].base_gfn)
            if key > best_key:
                best, best_key = i, key
        return best

    def _build(self, slots: list[Slot], lo: int, hi: int, budget: int) -> _WNode | None:
        if lo >= hi:
            return None
        i = self._pick(slots, lo, hi, budget)
        node = _WNode(slots[i])
        self.rebuilt_nodes += 1
        node.left = self._build(slots, lo, i, budget - 1)
        node.right = self._build(slots, i + 1, hi, budget - 1)
        return node

    def _rebalance(
        self, node: _WNode | None, lo: int, hi: int, budget: int, same_budget: bool, changed_gfn: int
    ) -> _WNode | None:
        """Restore W1-W3 for the subtree now holding self._sorted[lo:hi]."""
        slots = self._sorted
        if lo >= hi:
            return None
        i = self._pick(slots, lo, hi, budget)
        if node is None or slots[i].id != node.id:
            return self._build(slots, lo, hi, budget)
        # Same root: a side whose slots and budget did not change is valid.
        if not same_budget or changed_gfn < node.base:
            node.left = self._rebalance(node.left, lo, i, budget - 1, same_budget, changed_gfn)
        if not same_budget or changed_gfn >= node.end:
            node.right = self._rebalance(node.right, i + 1, hi, budget - 1, same_budget, changed_gfn)
        return node

    def _restore(self, changed_gfn: int) -> None:
        budget = self.budget(len(self._sorted))
        same = budget == self._budget
        self._root = self._rebalance(self._root, 0, len(self._sorted), budget, same, changed_gfn)
        self._budget = budget

    def insert(self, slot: Slot) -> None:
        self._register(slot)
        self._restore(slot.base_gfn)

    def extend(self, slots: Iterable[Slot]) -> None:
        # W1-W3 fix the tree from the set alone, so one build gives what
        # inserting one by one would, in O(n log n) instead of O(n^2).
        for slot in slots:
            self._register(slot)
        self._budget = self.budget(len(self._sorted))
        self._root = self._build(self._sorted, 0, len(self._sorted), self._budget)

    def delete(self, slot_id: int) -> Slot:
        slot, _ = self._unregister(slot_id)
        self._restore(slot.base_gfn)
        return slot

    def check(self) -> None:
        self._check_order()  # W1
        assert self._budget == self.budget(len(self)), "tree built for another slot count"
        slots = self._sorted

        def walk(node: _WNode | None, lo: int, hi: int, budget: int) -> int:
            if node is None:
                assert lo == hi, "subtree lost slots"
                return 0
            assert hi - lo <= (1 << budget) - 1, f"subtree of {hi - lo} slots over budget {budget}"  # W2
            i = self._pick(slots, lo, hi, budget)
            assert slots[i].id == node.id, f"slot {node.id} is not the W3 root (slot {slots[i].id} is)"  # W3
            height = 1 + max(walk(node.left, lo, i, budget - 1), walk(node.right, i + 1, hi, budget - 1))
            assert height <= budget, f"height {height} over budget {budget}"
            return height

        walk(self._root, 0, len(slots), self._budget)


class _TNode:
    __slots__ = ("base", "end", "id", "prio", "left", "right")

    def __init__(self, slot: Slot, seq: int) -> None:
        self.base = slot.base_gfn
        self.end = slot.end_gfn
        self.id = slot.id
        # Heap priority: the size, then earlier registration first.  Seed 000
        # does not say how the 2011 code broke ties between equal sizes; with
        # a strict "rotate up while larger" (what an insert that rotates a
        # new leaf up does) the earlier slot stays on top, which is this key.
        self.prio = (slot.npages, -seq)
        self.left: _TNode | None = None
        self.right: _TNode | None = None


class Tree2011(_TreeWalk[_TNode]):
    """The 2011 weight-balanced tree as seed 000 describes it ("largely
    leveraged from the rbtree, copying its rotate functions, while
    introducing different rebalance and erase functions"; "the most likely
    targets (the largest ranges) at the top of each subtree").

    Read as: a binary search tree ordered by gfn whose every subtree has its
    largest slot at the root, kept so by rotations: a treap whose heap
    priority is the slot size.  The patch itself is not in the seeds; its
    author said it "currently doesn't" reach O(log n) for want of a
    compaction after insert and remove (seed 002), and nothing bounds the
    height: slots whose size shrinks as their gfn grows make a path.

    Invariant (checked by ``check()``):

    T1. In-order traversal gives the slots in gfn order.
    T2. Heap order: a node's (npages, -registration sequence) is above both
        children's, i.e. every subtree's largest slot is its root, and of
        equal sizes the one registered first.

    Insert: attach the new slot as a leaf where the gfn search ends, then
    rotate it up while it is larger than its parent.  Delete: rotate the
    slot down, always lifting its larger child, until it is a leaf, then
    cut it off.  T1 and T2 fix the shape from the slots and their
    registration order alone, so a bulk build (a Cartesian tree over the
    gfn-sorted slots, O(n)) gives what inserting one by one gives.
    Iterative throughout: the height can reach n, beyond Python's
    recursion limit.
    """

    name = "tree2011"

    def __init__(self) -> None:
        super().__init__()
        self._seq = 0  # registration counter: the tie-break of equal sizes

    @staticmethod
    def bound(n: int) -> int | None:
        # No height bound: the worst case is a path through every slot.
        return n

    def _path_to(self, gfn: int) -> list[tuple[_TNode, bool]]:
        """Nodes from the root to where a search for ``gfn`` leaves the
        tree, each with whether the search went left."""
        path: list[tuple[_TNode, bool]] = []
        node = self._root
        while node is not None:
            left = gfn < node.base
            path.append((node, left))
            node = node.left if left else node.right
        return path

    def _replace_child(self, parent: _TNode | None, old: _TNode, new: _TNode | None) -> None:
        if parent is None:
            self._root = new
        elif parent.left is old:
            parent.left = new
        else:
            parent.right = new

    def insert(self, slot: Slot) -> None:
        self._register(slot)
        node = _TNode(slot, self._seq)
        self._seq += 1
        path = self._path_to(slot.base_gfn)
        if not path:
            self._root = node
            return
        parent, left = path[-1]
        if left:
            parent.left = node
        else:
            parent.right = node
        # Rotate up while larger than the parent (rbtree-style rotations:
        # the parent comes down on the side away from the node).
        while path:
            parent, left = path.pop()
            if node.prio <= parent.prio:
                break
            if left:  # right rotation at parent
                parent.left = node.right
                node.right = parent
            else:  # left rotation at parent
                parent.right = node.left
                node.left = parent
            self._replace_child(path[-1][0] if path else None, parent, node)

    def delete(self, slot_id: int) -> Slot:
        slot, _ = self._unregister(slot_id)
        grand: _TNode | None = None
        node = self._root
        while node is not None and node.id != slot_id:
            grand = node
            node = node.left if slot.base_gfn < node.base else node.right
        assert node is not None, f"slot {slot_id} registered but not in the tree"
        # Rotate the node down, lifting its larger child, until a side is
        # empty; then the other side takes its place.
        while node.left is not None and node.right is not None:
            if node.left.prio > node.right.prio:
                child = node.left
                node.left = child.right
                child.right = node
            else:
                child = node.right
                node.right = child.left
                child.left = node
            self._replace_child(grand, node, child)
            grand = child
        self._replace_child(grand, node, node.left if node.left is not None else node.right)
        return slot

    def extend(self, slots: Iterable[Slot]) -> None:
        # Register in order (the sequence numbers decide ties), then build the
        # unique tree with T1 and T2 over the gfn-sorted slots with a stack
        # (the right spine): O(n) where inserting one by one can be O(n^2).
        nodes: dict[int, _TNode] = {}
        for slot in slots:
            self._register(slot)
            nodes[slot.id] = _TNode(slot, self._seq)
            self._seq += 1
        if not nodes:
            return
        # Existing nodes keep their priorities: collect them from the tree.
        for old in self.inorder():
            nodes.setdefault(old.id, old)
        spine: list[_TNode] = []
        for slot in self._sorted:
            node = nodes[slot.id]
            node.left = node.right = None
            last: _TNode | None = None
            while spine and spine[-1].prio < node.prio:
                last = spine.pop()
            node.left = last
            if spine:
                spine[-1].right = node
            spine.append(node)
        self._root = spine[0]

    def check(self) -> None:
        self._check_order()  # T1
        stack = [self._root] if self._root is not None else []
        while stack:
            node = stack.pop()
            for child in (node.left, node.right):
                if child is not None:
                    assert child.prio < node.prio, f"slot {child.id} is larger than its parent slot {node.id}"  # T2
                    stack.append(child)


class _RBNode:
    __slots__ = ("base", "end", "id", "left", "right", "parent", "red")

    # Never None: an empty link is the tree's black sentinel (``_make_nil``).
    left: _RBNode
    right: _RBNode
    parent: _RBNode

    def __init__(self, slot: Slot, nil: _RBNode) -> None:
        self.base, self.end, self.id = slot.base_gfn, slot.end_gfn, slot.id
        self.left = self.right = self.parent = nil
        self.red = True  # CLRS: a new node is red until the fix-up says otherwise


def _make_nil() -> _RBNode:
    """The sentinel: black, its links pointing at itself."""
    nil = _RBNode.__new__(_RBNode)
    nil.base = nil.end = nil.id = -1
    nil.left = nil.right = nil.parent = nil
    nil.red = False
    return nil


class RedBlackTree(_TreeWalk[_RBNode]):
    """A red-black tree keyed by base gfn, the structure of today's kernel
    (``kvm_memslots.gfn_tree``, 2021).  CLRS insert and delete with a black
    sentinel leaf.  A red-black tree guarantees height <= 2 log2(n + 1), not
    the ceil(log2(n + 1)) + 1 of a near-perfect tree; ``bound`` says so.

    Today's kernel also checks a last-used slot before walking the tree;
    that cache is modelled by binsearch-lru, not here."""

    name = "rbtree"
    _nil: ClassVar[_RBNode] = _make_nil()
    _root: _RBNode

    def __init__(self) -> None:
        super().__init__()
        self._root = self._nil
        self._nodes: dict[int, _RBNode] = {}

    @staticmethod
    def bound(n: int) -> int | None:
        return math.floor(2 * math.log2(n + 1)) if n else 0

    def _rotate_left(self, x: _RBNode) -> None:
        nil = self._nil
        y = x.right
        x.right = y.left
        if y.left is not nil:
            y.left.parent = x
        y.parent = x.parent
        if x.parent is nil:
            self._root = y
        elif x is x.parent.left:
            x.parent.left = y
        else:
            x.parent.right = y
        y.left = x
        x.parent = y

    def _rotate_right(self, x: _RBNode) -> None:
        nil = self._nil
        y = x.left
        x.left = y.right
        if y.right is not nil:
            y.right.parent = x
        y.parent = x.parent
        if x.parent is nil:
            self._root = y
        elif x is x.parent.right:
            x.parent.right = y
        else:
            x.parent.left = y
        y.right = x
        x.parent = y

    def insert(self, slot: Slot) -> None:
        self._register(slot)
        nil = self._nil
        z = _RBNode(slot, nil)
        self._nodes[slot.id] = z
        parent = nil
        x = self._root
        while x is not nil:
            parent = x
            x = x.left if z.base < x.base else x.right
        z.parent = parent
        if parent is nil:
            self._root = z
        elif z.base < parent.base:
            parent.left = z
        else:
            parent.right = z
        self._insert_fixup(z)

    def _insert_fixup(self, z: _RBNode) -> None:
        while z.parent.red:
            grand = z.parent.parent
            if z.parent is grand.left:
                uncle = grand.right
                if uncle.red:
                    z.parent.red = uncle.red = False
                    grand.red = True
                    z = grand
                else:
                    if z is z.parent.right:
                        z = z.parent
                        self._rotate_left(z)
                    z.parent.red = False
                    z.parent.parent.red = True
                    self._rotate_right(z.parent.parent)
            else:
                uncle = grand.left
                if uncle.red:
                    z.parent.red = uncle.red = False
                    grand.red = True
                    z = grand
                else:
                    if z is z.parent.left:
                        z = z.parent
                        self._rotate_right(z)
                    z.parent.red = False
                    z.parent.parent.red = True
                    self._rotate_left(z.parent.parent)
        self._root.red = False

    def _transplant(self, u: _RBNode, v: _RBNode) -> None:
        if u.parent is self._nil:
            self._root = v
        elif u is u.parent.left:
            u.parent.left = v
        else:
            u.parent.right = v
        v.parent = u.parent

    def delete(self, slot_id: int) -> Slot:
        slot, _ = self._unregister(slot_id)
        nil = self._nil
        z = self._nodes.pop(slot_id)
        y = z
        y_was_red = y.red
        if z.left is nil:
            x = z.right
            self._transplant(z, z.right)
        elif z.right is nil:
            x = z.left
            self._transplant(z, z.left)
        else:
            y = z.right
            while y.left is not nil:
                y = y.left
            y_was_red = y.red
            x = y.right
            if y.parent is z:
                x.parent = y
            else:
                self._transplant(y, y.right)
                y.right = z.right
                y.right.parent = y
            self._transplant(z, y)
            y.left = z.left
            y.left.parent = y
            y.red = z.red
        if not y_was_red:
            self._delete_fixup(x)
        nil.parent = nil  # the sentinel's parent is scratch space during fixup
        return slot

    def _delete_fixup(self, x: _RBNode) -> None:
        while x is not self._root and not x.red:
            if x is x.parent.left:
                w = x.parent.right
                if w.red:
                    w.red = False
                    x.parent.red = True
                    self._rotate_left(x.parent)
                    w = x.parent.right
                if not w.left.red and not w.right.red:
                    w.red = True
                    x = x.parent
                else:
                    if not w.right.red:
                        w.left.red = False
                        w.red = True
                        self._rotate_right(w)
                        w = x.parent.right
                    w.red = x.parent.red
                    x.parent.red = False
                    w.right.red = False
                    self._rotate_left(x.parent)
                    x = self._root
            else:
                w = x.parent.left
                if w.red:
                    w.red = False
                    x.parent.red = True
                    self._rotate_right(x.parent)
                    w = x.parent.left
                if not w.right.red and not w.left.red:
                    w.red = True
                    x = x.parent
                else:
                    if not w.left.red:
                        w.right.red = False
                        w.red = True
                        self._rotate_left(w)
                        w = x.parent.left
                    w.red = x.parent.red
                    x.parent.red = False
                    w.left.red = False
                    self._rotate_right(x.parent)
                    x = self._root
        x.red = False

    def check(self) -> None:
        nil = self._nil
        assert not nil.red, "sentinel turned red"
        assert not self._root.red, "root is red"
        self._check_order()

        def walk(node: _RBNode) -> int:
            if node is nil:
                return 1
            for child in (node.left, node.right):
                if child is not nil:
                    assert child.parent is node, f"bad parent pointer under slot {node.id}"
                    assert not (node.red and child.red), f"red slot {node.id} has a red child"
            left, right = walk(node.left), walk(node.right)
            assert left == right, f"black heights differ under slot {node.id}"
            return left + (0 if node.red else 1)

        walk(self._root)


STRUCTURES: dict[str, type[SlotIndex]] = {
    cls.name: cls
    for cls in (
        LinearArray,
        ReorderArray,
        Tree2011,
        HeightBudgetedTree,
        BinarySearchArray,
        BinarySearchLRU,
        RedBlackTree,
    )
}


def build(name: str, layout: Layout) -> SlotIndex:
    """Structure ``name`` with the layout's slots inserted in registration order."""
    try:
        index = STRUCTURES[name]()
    except KeyError:
        raise BadInput(f"unknown structure {name!r}: one of {', '.join(STRUCTURES)}") from None
    index.extend(layout.slots)
    return index


def build_all(layout: Layout) -> dict[str, SlotIndex]:
    return {name: build(name, layout) for name in STRUCTURES}

"""The binary search trees of gfn -> memslot lookup: the walk they share,
``hbtree`` (height budgeted) and ``tree2011`` (the 2011 proposal); the
red-black tree is in rbtree.py (docs/memslots-model.md, "The structures
and the counting rule")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar, Generic, Protocol, Self, TypeVar

from memqual.host.memslots.layout import Slot
from memqual.host.memslots.slot_index import SlotIndex, balanced_bound


class TreeNode(Protocol):
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


NodeT = TypeVar("NodeT", bound=TreeNode)


class TreeWalk(SlotIndex, Generic[NodeT]):
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


class HeightBudgetedTree(TreeWalk[_WNode]):
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


class Tree2011(TreeWalk[_TNode]):
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

"""The red-black tree of gfn -> memslot lookup, ``rbtree``: the kernel's
structure since 5.11 (docs/memslots-model.md, "The structures and the
counting rule")."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from memqual.host.memslots.layout import Slot
from memqual.host.memslots.slot_trees import TreeWalk


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


Side = Literal["left", "right"]
_MIRROR: dict[Side, Side] = {"left": "right", "right": "left"}


def _child(node: _RBNode, side: Side) -> _RBNode:
    child: _RBNode = getattr(node, side)
    return child


def _set_child(node: _RBNode, side: Side, child: _RBNode) -> None:
    setattr(node, side, child)


def _make_nil() -> _RBNode:
    """The sentinel: black, its links pointing at itself."""
    nil = _RBNode.__new__(_RBNode)
    nil.base = nil.end = nil.id = -1
    nil.left = nil.right = nil.parent = nil
    nil.red = False
    return nil


class RedBlackTree(TreeWalk[_RBNode]):
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

    def _rotate(self, x: _RBNode, down: Side) -> None:
        """Rotate at ``x``: it goes ``down`` a level to that side of its
        child on the other side, which takes its place (CLRS's left
        rotation is ``down="left"``)."""
        up = _MIRROR[down]
        y = _child(x, up)
        inner = _child(y, down)
        _set_child(x, up, inner)
        if inner is not self._nil:
            inner.parent = x
        self._transplant(x, y)
        _set_child(y, down, x)
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
            # CLRS's two cases are mirror images: ``side`` is the parent's.
            side: Side = "left" if z.parent is grand.left else "right"
            other = _MIRROR[side]
            uncle = _child(grand, other)
            if uncle.red:
                z.parent.red = uncle.red = False
                grand.red = True
                z = grand
            else:
                if z is _child(z.parent, other):
                    z = z.parent
                    self._rotate(z, side)
                z.parent.red = False
                z.parent.parent.red = True
                self._rotate(z.parent.parent, other)
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
            # CLRS's two cases are mirror images: ``side`` is x's.
            side: Side = "left" if x is x.parent.left else "right"
            other = _MIRROR[side]
            w = _child(x.parent, other)
            if w.red:
                w.red = False
                x.parent.red = True
                self._rotate(x.parent, side)
                w = _child(x.parent, other)
            if not w.left.red and not w.right.red:
                w.red = True
                x = x.parent
            else:
                if not _child(w, other).red:
                    _child(w, side).red = False
                    w.red = True
                    self._rotate(w, other)
                    w = _child(x.parent, other)
                w.red = x.parent.red
                x.parent.red = False
                _child(w, other).red = False
                self._rotate(x.parent, side)
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

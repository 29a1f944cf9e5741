"""Lookup structures for gfn -> memslot, each counting the nodes it examines.

Seven structures (``linear``, ``reorder``, ``tree2011``, ``hbtree``,
``binsearch``, ``binsearch-lru``, ``rbtree``) behind one interface,
``SlotIndex`` (slot_index.py): the arrays in slot_arrays.py, the trees in
slot_trees.py and rbtree.py; here their registry and ``build``.  The
counting rule and each structure: docs/memslots-model.md, "The structures
and the counting rule".  A duplicate id, an overlapping slot or an unknown
id is BadInput.
"""

from __future__ import annotations

from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import Layout
from memqual.host.memslots.rbtree import RedBlackTree
from memqual.host.memslots.slot_arrays import BinarySearchArray, BinarySearchLRU, LinearArray, ReorderArray
from memqual.host.memslots.slot_index import SlotIndex, balanced_bound
from memqual.host.memslots.slot_trees import HeightBudgetedTree, Tree2011

__all__ = [
    "STRUCTURES",
    "BinarySearchArray",
    "BinarySearchLRU",
    "HeightBudgetedTree",
    "LinearArray",
    "RedBlackTree",
    "ReorderArray",
    "SlotIndex",
    "Tree2011",
    "balanced_bound",
    "build",
    "build_all",
]

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

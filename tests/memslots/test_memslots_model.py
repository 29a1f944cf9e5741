"""Workloads and the model table, including the seed's two claims as the
model sees them."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from memqual.host.core.errors import BadInput
from memqual.host.memslots import kvm2011
from memqual.host.memslots import model as model_mod
from memqual.host.memslots import structures as structures_mod
from memqual.host.memslots.layout import Layout, Slot, load_layout
from memqual.host.memslots.model import PUBLISHED, ModelDisagreement, model_table, oracle
from memqual.host.memslots.workloads import SMALL_SLOT_PAGES, WORKLOADS, generate, holes


@pytest.fixture(scope="module")
def seed32() -> Layout:
    return load_layout("seed-32")


def test_seed_32_misses_are_counted_not_assumed(seed32):
    """The model reports what each tree walks on seed-32's misses; nothing
    here holds it to the seed's "6-7".  The array reads every entry; the
    2011 tree walks at most its height, the height-budgeted tree (memqual's
    own design) at most its budget."""
    table = model_table(seed32, "miss")
    linear = table.structures["linear"]
    assert linear.mean_nodes == linear.max_nodes == 32
    old, ours = table.structures["tree2011"], table.structures["hbtree"]
    tree2011 = structures_mod.Tree2011()
    tree2011.extend(seed32.slots)
    assert old.max_nodes <= tree2011.height()
    assert ours.bound_nodes is not None and ours.max_nodes <= ours.bound_nodes == 7
    assert old.bound_nodes == 32  # no height bound of its own
    assert table.hit_fraction == 0
    assert table.published_applies
    assert set(PUBLISHED["structures"]) == {"linear", "tree2011"}  # the seed's figures are about the 2011 tree


def test_the_2011_tree_miss_depends_on_the_layout():
    """Evidence that could go the other way: on a layout whose slots shrink
    as their gfn grows, the 2011 tree is a path and a miss below the
    smallest slot walks every node, as the array does."""
    shrinking = Layout(tuple(Slot(i, i * 0x10000, 0x8000 - i) for i in range(32)), name="shrinking")
    indexes = structures_mod.build_all(shrinking)
    assert indexes["tree2011"].lookup(31 * 0x10000 + 0x9000) == (None, 32)
    assert indexes["hbtree"].lookup(31 * 0x10000 + 0x9000)[1] <= 7


def test_reorder_as_good_as_the_tree_for_ram_hits_on_the_stacked_layout():
    """Seed 002's kernbench argument: for hits into the few big RAM slots the
    size-sorted array does no worse than either tree."""
    table = model_table(load_layout("seed-3-stacked"), "ram-hits")
    assert table.structures["reorder"].mean_nodes <= table.structures["tree2011"].mean_nodes
    assert table.structures["reorder"].mean_nodes <= table.structures["hbtree"].mean_nodes
    assert table.structures["reorder"].mean_nodes < table.structures["binsearch"].mean_nodes


def test_every_workload_runs_on_every_shipped_layout():
    for name in ("seed-3", "seed-3-stacked", "seed-32"):
        layout = load_layout(name)
        for workload in WORKLOADS:
            table = model_table(layout, workload, lookups=300)
            for structure, stats in table.structures.items():
                assert 0 < stats.min_nodes <= stats.mean_nodes <= stats.max_nodes, (name, workload, structure)
                assert stats.bound_nodes is None or stats.max_nodes <= stats.bound_nodes


def test_workloads_hit_what_they_say(seed32):
    assert all(slot is None for slot in oracle(seed32, generate(seed32, "miss", 2000)))
    ram = oracle(seed32, generate(seed32, "ram-hits", 2000))
    assert None not in ram
    small_ids = {s.id for s in seed32.slots if s.npages <= SMALL_SLOT_PAGES}
    small = oracle(seed32, generate(seed32, "small-hits", 2000))
    assert set(small) <= small_ids and len(set(small)) == len(small_ids)  # each small slot is visited


def test_ram_hits_are_weighted_by_size():
    layout = load_layout("seed-3")
    counts = Counter(oracle(layout, generate(layout, "ram-hits", 20000, seed=3)))
    share = counts[2] / 20000
    assert share == pytest.approx(layout.slots[2].npages / layout.total_pages(), abs=0.02)
    assert counts[0] < 20  # 640 KiB out of 10 GiB


def test_mixed_shares(seed32):
    answers = oracle(seed32, generate(seed32, "mixed", 20000, seed=1))
    misses = sum(1 for a in answers if a is None) / len(answers)
    assert misses == pytest.approx(0.70, abs=0.02)


def test_misses_visit_every_hole(seed32):
    gfns = generate(seed32, "miss", 5000)
    gaps = holes(seed32)
    visited = {next(i for i, (lo, hi) in enumerate(gaps) if lo <= g < hi) for g in gfns}
    assert visited == set(range(len(gaps)))


def test_seeded_and_reproducible(seed32):
    assert generate(seed32, "mixed", 500, seed=7) == generate(seed32, "mixed", 500, seed=7)
    assert generate(seed32, "mixed", 500, seed=7) != generate(seed32, "mixed", 500, seed=8)
    assert (
        model_table(seed32, "small-hits", 500, seed=4).to_json()
        == model_table(seed32, "small-hits", 500, seed=4).to_json()
    )


def test_json_shape(seed32):
    doc = json.loads(json.dumps(model_table(seed32, "ram-hits", lookups=200).to_json()))
    assert doc["layout"] == "seed-32" and doc["workload"] == "ram-hits" and doc["lookups"] == 200
    assert list(doc["structures"]) == [
        "linear",
        "reorder",
        "tree2011",
        "hbtree",
        "binsearch",
        "binsearch-lru",
        "rbtree",
    ]
    for entry in doc["structures"].values():
        assert isinstance(entry["mean_nodes"], float) and isinstance(entry["max_nodes"], int)
    assert doc["published"]["structures"]["tree2011"]["nodes"] == "6-7"
    assert "hbtree" not in doc["published"]["structures"]
    assert doc["published"]["applies"] is False  # ram-hits: not the seed's case


def test_bad_workload_and_layout_without_small_slots():
    with pytest.raises(BadInput, match="unknown workload 'hits'"):
        model_table(load_layout("seed-32"), "hits")
    big_only = Layout((Slot(0, 0, 1 << 20),), name="big")
    with pytest.raises(BadInput, match="layout 'big' has no slot of at most 4096 pages"):
        model_table(big_only, "small-hits")
    with pytest.raises(BadInput, match="give at least 1"):
        generate(big_only, "miss", 0)


def test_a_wrong_structure_is_caught(monkeypatch, seed32):
    """The model checks every answer against the layout: a structure that
    finds the wrong slot stops the table instead of skewing it."""

    class Broken(structures_mod.BinarySearchArray):
        def lookup(self, gfn):
            slot, nodes = super().lookup(gfn)
            return (None if slot == 1 else slot), nodes

    monkeypatch.setitem(structures_mod.STRUCTURES, "binsearch", Broken)
    with pytest.raises(ModelDisagreement, match="binsearch found slot None"):
        model_mod.model_table(seed32, "ram-hits", lookups=100)


def test_a_trace_with_locality_favours_the_lru_cache(seed32):
    """Frames replayed in order: runs of frames in one slot (a guest walking
    its memory) cost one node each in binsearch-lru after the first."""
    trace = [0x100 + i for i in range(500)] + [0x100000 + i for i in range(500)]
    table = model_mod.table_for_frames(seed32, trace, workload="walk")
    assert table.workload == "walk" and table.lookups == 1000 and table.hit_fraction == 1
    lru, plain = table.structures["binsearch-lru"], table.structures["binsearch"]
    assert lru.mean_nodes < 1.02 < plain.mean_nodes
    with pytest.raises(BadInput, match="the trace is empty"):
        model_mod.table_for_frames(seed32, [])


def test_other_hits_is_small_hits_under_another_name(seed32):
    assert generate(seed32, "other-hits", 300, seed=2) == generate(seed32, "small-hits", 300, seed=2)
    table = model_table(seed32, "other-hits", lookups=300)
    assert table.workload == "other-hits" and table.hit_fraction == 1


def test_model_table_on_a_layout_read_from_a_record():
    """The layout a real guest gave (the extra of a memslots.guest_layout
    record) goes through layout_from_json into the model."""
    from memqual.host.memslots.layout import layout_from_json

    data = {
        "slots": [
            {"id": 0, "base_gfn": 0, "npages": 0xA0, "flags": 0},
            {"id": 1, "base_gfn": 0x100, "npages": 0x1FF00, "flags": 0},
            {"id": 2, "base_gfn": 0xFFFE0, "npages": 0x20, "flags": 2},
        ]
    }
    layout = layout_from_json(data, "pc-plain")
    assert layout.name == "pc-plain" and len(layout) == 3
    for workload in ("miss", "ram-hits", "other-hits"):
        table = model_table(layout, workload, lookups=200)
        for name in ("tree2011", "hbtree", "linear", "reorder"):
            assert table.structures[name].mean_nodes > 0
    with pytest.raises(BadInput, match="pc-bad: slot entry 0 has no 'npages'"):
        layout_from_json({"slots": [{"id": 0, "base_gfn": 0}]}, "pc-bad")


def test_a_miss_mean_is_exact_over_the_gaps(seed32):
    """Each gap once: the mean is the per-gap average of the nodes the one
    path through that gap walks, whatever lookups or seed say (seed-32's
    2011 tree: 7.345, where 10,000 sampled frames gave 7.37)."""
    gaps = holes(seed32)
    per_gap = [model_mod.nodes_at(seed32, "tree2011", start) for start, _ in gaps]
    table = model_table(seed32, "miss", lookups=10, seed=5)
    assert table.lookups == len(gaps) == 29
    assert table.structures["tree2011"].mean_nodes == pytest.approx(sum(per_gap) / len(per_gap))
    assert table.structures["tree2011"].mean_nodes == pytest.approx(7.345, abs=0.0005)
    assert model_table(seed32, "miss", lookups=10000, seed=0).structures == table.structures


def test_the_2011_vmx_host_adds_its_private_slots_and_refuses_a_33rd_user_slot():
    guest = Layout((Slot(0, 0, 0xA0), Slot(1, 0x100, 0x1FF00)), name="pc")
    host = kvm2011.on_host(guest)
    assert [s.id for s in host.slots] == [0, 1, 32, 33, 34]
    assert model_table(host, "miss").structures["linear"].max_nodes == 35
    assert model_table(kvm2011.on_host(guest, kvm2011.SVM), "miss").structures["linear"].max_nodes == 2
    # A guest slot over the APIC page keeps it: the private slot is left out.
    over_apic = Layout((Slot(0, 0xFEE00, 0x10),), name="over-apic")
    assert [s.id for s in kvm2011.on_host(over_apic).slots] == [0, 32, 34]
    assert kvm2011.runs_on_2011(Layout(tuple(Slot(i, i * 0x100, 0x10) for i in range(32))))
    assert not kvm2011.runs_on_2011(Layout(tuple(Slot(i, i * 0x100, 0x10) for i in range(33))))

"""Memslot layouts: validation messages, JSON files, shipped layouts, gfn parsing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import (
    SHIPPED_LAYOUTS,
    Layout,
    Slot,
    from_json,
    load_layout,
    parse_gfn,
    save_layout,
    validate,
)

MIB = 256  # pages
GIB = 1 << 18


def test_overlap_names_both_slots():
    layout = Layout((Slot(3, 0x100, 0x100), Slot(7, 0x180, 0x10)))
    with pytest.raises(BadInput) as err:
        validate(layout)
    message = str(err.value)
    assert "slot 3 (gfn 0x100-0x1ff)" in message
    assert "slot 7 (gfn 0x180-0x18f)" in message
    assert "overlap" in message


def test_touching_slots_do_not_overlap():
    validate(Layout((Slot(0, 0, 16), Slot(1, 16, 16))))


def test_zero_size_names_the_slot():
    with pytest.raises(BadInput, match=r"slot 4 has npages 0: a slot needs at least one page"):
        validate(Layout((Slot(1, 0, 1), Slot(4, 10, 0))))


def test_duplicate_id_names_the_id_and_entries():
    with pytest.raises(BadInput, match=r"duplicate slot id 2 \(entries 0 and 1\)"):
        validate(Layout((Slot(2, 0, 1), Slot(2, 10, 1))))


def test_more_slots_than_the_limit():
    layout = Layout(tuple(Slot(i, i * 2, 1) for i in range(5)), name="big")
    validate(layout, limit=5)
    with pytest.raises(
        BadInput,
        match=r"layout 'big': 5 slots, more than the limit of 4: remove 1 slots \(first over the limit: slot 4\)",
    ):
        validate(layout, limit=4)


def test_default_limit_is_kvm_cap_nr_memslots():
    slots = tuple(Slot(i, i, 1) for i in range(32765))
    with pytest.raises(BadInput, match="more than the limit of 32764"):
        validate(Layout(slots))


def test_out_of_gfn_space_and_negative_values():
    with pytest.raises(BadInput, match="slot 0 .* outside the gfn space"):
        validate(Layout((Slot(0, -1, 4),)))
    with pytest.raises(BadInput, match="outside the gfn space"):
        validate(Layout((Slot(0, (1 << 52) - 1, 2),)))
    with pytest.raises(BadInput, match="negative id"):
        validate(Layout((Slot(-1, 0, 1),)))
    with pytest.raises(BadInput, match="negative flags"):
        validate(Layout((Slot(0, 0, 1, flags=-2),)))


def test_json_round_trip(tmp_path):
    layout = Layout((Slot(5, 0x100000, 4 * GIB, 0), Slot(1, 0, MIB, 2)), name="x")
    path = tmp_path / "l.json"
    save_layout(layout, path)
    assert json.loads(path.read_text()) == {
        "slots": [
            {"id": 5, "base_gfn": 0x100000, "npages": 4 * GIB, "flags": 0},
            {"id": 1, "base_gfn": 0, "npages": MIB, "flags": 2},
        ]
    }
    loaded = load_layout(path)
    assert loaded.slots == layout.slots  # registration order kept
    assert loaded.name == str(path)


@pytest.mark.parametrize(
    "data, message",
    [
        ([], r'expected an object \{"slots": \[...\]\}'),
        ({"slots": [{"id": 0, "npages": 1}]}, "slot entry 0 has no 'base_gfn'"),
        ({"slots": [{"id": 0, "base_gfn": "0x10", "npages": 1}]}, r"slot entry 0 'base_gfn' is '0x10', not an integer"),
        ({"slots": [{"id": 0, "base_gfn": 0, "npages": True}]}, "'npages' is True, not an integer"),
        ({"slots": [{"id": 0, "base_gfn": 0, "npages": 1, "size": 3}]}, r"unknown keys \['size'\]"),
        ({"slots": [7]}, "slot entry 0 is not an object"),
    ],
)
def test_bad_json_shapes(data, message):
    with pytest.raises(BadInput, match=message):
        from_json(data, source="layout t")


def test_flags_default_to_zero():
    layout = from_json({"slots": [{"id": 0, "base_gfn": 0, "npages": 1}]})
    assert layout.slots[0].flags == 0


def test_load_errors(tmp_path):
    with pytest.raises(BadInput, match=r"unknown layout 'seed-4': give a layout file or one of seed-3"):
        load_layout("seed-4")
    with pytest.raises(BadInput, match="layout file .*missing.json not found"):
        load_layout(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{slots:")
    with pytest.raises(BadInput, match="layout file truncated or not JSON"):
        load_layout(bad)
    overlap = tmp_path / "overlap.json"
    overlap.write_text(
        json.dumps({"slots": [{"id": 0, "base_gfn": 0, "npages": 8}, {"id": 1, "base_gfn": 4, "npages": 8}]})
    )
    with pytest.raises(BadInput, match=r"slot 0 \(gfn 0x0-0x7\) and slot 1 \(gfn 0x4-0xb\) overlap"):
        load_layout(overlap)


def test_seed_3_is_the_seeds_three_slots():
    layout = load_layout("seed-3")
    low, mid, high = layout.slots
    assert [s.id for s in layout.slots] == [0, 1, 2]
    assert low.base_gfn == 0 and low.end_gfn <= MIB  # below 1 MiB
    assert mid.base_gfn == MIB and mid.end_gfn == 3 * GIB + GIB // 2  # 1 MiB - 3.5 GiB
    assert high.base_gfn == 4 * GIB and high.npages >= GIB  # 4 GiB and up


def test_stacked_registers_the_same_ranges_the_other_way_round():
    plain = load_layout("seed-3")
    stacked = load_layout("seed-3-stacked")
    ranges = [(s.base_gfn, s.npages) for s in plain.slots]
    assert [(s.base_gfn, s.npages) for s in stacked.slots] == ranges[::-1]
    assert [s.id for s in stacked.slots] == [0, 1, 2]  # seed 002: "0: 4G+, 1: 1M-3.5G, 2: <1M"


def test_seed_32_has_ram_slots_and_small_ones():
    layout = load_layout("seed-32")
    assert len(layout) == 32
    # RAM: 1 MiB - 3.5 GiB and 4 GiB+ are big; low RAM (640 KiB), ROMs and BARs small.
    assert [s.id for s in layout.slots if s.npages > 4096] == [1, 2]
    assert layout.slots[0].base_gfn == 0 and layout.slots[0].npages == 160
    assert {"seed-3", "seed-3-stacked", "seed-32"} <= set(SHIPPED_LAYOUTS)
    for name in SHIPPED_LAYOUTS:  # every shipped name loads and validates
        assert len(load_layout(name)) > 0


@pytest.mark.parametrize("text, value", [("0", 0), ("4096", 4096), ("0x1000", 4096), ("0XfF", 255), (" 12 ", 12)])
def test_parse_gfn(text, value):
    assert parse_gfn(text) == value


@pytest.mark.parametrize("text", ["", "x", "-1", "0x", "0x-5", "1e3", "0x1_0", str(1 << 52)])
def test_parse_gfn_rejects(text):
    with pytest.raises(BadInput, match="bad gfn"):
        parse_gfn(text)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8), st.integers(0, 6)), max_size=8))
def test_validate_accepts_exactly_the_layouts_kvm_would(entries):
    """Against brute force: valid iff ids are unique, sizes positive and no
    two ranges share a frame."""
    slots = tuple(Slot(sid, base, npages) for base, npages, sid in entries)
    ids_unique = len({s.id for s in slots}) == len(slots)
    sizes_ok = all(s.npages > 0 for s in slots)
    disjoint = all(
        not (a.base_gfn < b.end_gfn and b.base_gfn < a.end_gfn) for i, a in enumerate(slots) for b in slots[i + 1 :]
    )
    try:
        validate(Layout(slots))
        accepted = True
    except BadInput:
        accepted = False
    assert accepted == (ids_unique and sizes_ok and disjoint)

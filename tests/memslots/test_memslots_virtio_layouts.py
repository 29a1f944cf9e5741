"""memqual.host.memslots.virtio_layouts: a virtio-mem guest's plugged
states as records, and the rows a memslot claim's card lists for them
(the reference structures' nodes computed from each layout, /dev/kvm's
miss cost at its slot count), and how the claims and the report carry
them without letting them decide, or the claim's figures enter them."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from memqual.host.core.errors import BadInput
from memqual.host.core.flatview import FlatRange
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import parse
from memqual.host.judge.claims.model import DEFAULT_CLAIMS_FILE, NOT_MEASURABLE, Claim, Verdict
from memqual.host.memslots import virtio_layouts as VL
from memqual.host.report import report

GIB = 1 << 30
BASE = [
    FlatRange(0x0, 0x9FFFF, "ram", "pc.ram"),
    FlatRange(0xC0000, 0xDFFFF, "rom", "pc.rom"),
    FlatRange(0x100000, 0x1FFFFFFF, "ram", "pc.ram", 0x100000),
    FlatRange(0xFFFC0000, 0xFFFFFFFF, "rom", "pc.bios"),
    FlatRange(0xFEB00000, 0xFEB00FFF, "i/o", "vmem0"),  # the device's BAR: MMIO, no memslot
]


def device_slots(count: int, base: int = 0x100000000) -> list[FlatRange]:
    return [FlatRange(base + i * GIB, base + (i + 1) * GIB - 1, "ram", "vmem0", i * GIB) for i in range(count)]


def state(step: int, plugged_mib: int, count: int) -> Measurement:
    return VL.state_record(step, plugged_mib, BASE + device_slots(count), "vmem0", {"device_mib": 8192})


def kvm_record(slots: int, vm_medians: list[float], rounds: int = 3) -> Measurement:
    return Measurement(
        scenario="memslots.kvm_lookup",
        metric="access_ns",
        unit="ns",
        better="lower",
        samples=[],
        replicates=[[m - 1.0, m, m + 1.0][:rounds] for m in vm_medians],
        variant={"kind": "miss", "slots": slots},
    )


@pytest.mark.parametrize(
    ("count", "slots", "device"),
    [(0, 4, 0), (1, 5, 1), (2, 6, 2), (8, 12, 8)],
)
def test_state_record_holds_the_whole_layout_and_the_device_share(count: int, slots: int, device: int) -> None:
    rec = state(3, count * 1024, count)
    assert rec.scenario == VL.SCENARIO and rec.metric == "slots"
    assert rec.samples == [float(slots)]
    assert len(rec.extra["layout"]["slots"]) == slots
    assert rec.extra["device_slots"] == device
    assert rec.variant == {"step": 3, "plugged_mib": count * 1024}
    assert rec.settings == {"device_mib": 8192}


def test_state_record_refuses_a_flat_view_kvm_would_refuse() -> None:
    overlapping = BASE + [
        FlatRange(0x100000000, 0x13FFFFFFF, "ram", "vmem0"),
        FlatRange(0x100000000, 0x100000FFF, "ram", "x"),
    ]
    with pytest.raises(BadInput, match="overlap"):
        VL.state_record(0, 1024, overlapping, "vmem0", {})


# (structure, slots) -> nodes a miss examines, worked out by hand for the
# layouts above: the array walks every slot on every miss; the rbtree is
# balanced; tree2011 never rotates equal sizes, so equal 1 GiB memslots
# make a list in gfn order and its worst miss walks all of them.
@pytest.mark.parametrize(
    ("count", "structure", "mean", "worst"),
    [
        (0, "linear", 4.0, 4),
        (8, "linear", 12.0, 12),
        (0, "rbtree", None, 3),
        (8, "rbtree", None, 5),
        (8, "tree2011", None, 8),
    ],
)
def test_nodes_are_computed_from_the_layout(count: int, structure: str, mean: float | None, worst: int) -> None:
    (row,) = VL.today_rows([state(0, count * 1024, count)], ("linear", "tree2011", "rbtree"))
    nodes = row.nodes_of(structure)
    assert nodes is not None
    assert nodes.worst == worst
    if mean is not None:
        assert nodes.mean == mean
    assert row.nodes_of("hbtree") is None


def test_a_records_own_figures_do_not_enter_the_rows() -> None:
    """The slot count and the nodes come from the layout, never from what
    the record says about it."""
    rec = state(0, 2048, 2)
    lying = dataclasses.replace(
        rec, samples=[99.0], replicates=[], extra={**rec.extra, "miss_mean_nodes": {"linear": 1}}
    )
    (honest,) = VL.today_rows([rec], ("linear",))
    (row,) = VL.today_rows([lying], ("linear",))
    assert row == honest
    assert row.slots == 6


@pytest.mark.parametrize(
    ("kvm", "expected"),
    [
        ([], None),
        ([kvm_record(7, [180.0])], None),  # another count
        ([kvm_record(6, [180.0, 190.0, 170.0])], (180.0, 170.0, 190.0, 3)),
        # the record with more fresh VMs wins
        ([kvm_record(6, [500.0]), kvm_record(6, [180.0, 190.0, 170.0])], (180.0, 170.0, 190.0, 3)),
    ],
)
def test_kvm_miss_at_the_states_slot_count(kvm: list[Measurement], expected: tuple[float, ...] | None) -> None:
    (row,) = VL.today_rows([state(0, 2048, 2), *kvm], ("rbtree",))
    if expected is None:
        assert row.kvm is None
    else:
        assert row.kvm is not None
        assert (row.kvm.median_ns, row.kvm.low_ns, row.kvm.high_ns, row.kvm.vms) == expected


def test_a_hit_record_at_the_count_is_no_miss() -> None:
    hit = dataclasses.replace(kvm_record(6, [50.0]), variant={"kind": "ram_hit", "slots": 6})
    (row,) = VL.today_rows([state(0, 2048, 2), hit], ("rbtree",))
    assert row.kvm is None


def test_rows_in_step_order_first_record_of_a_step_wins() -> None:
    records = [state(2, 2048, 2), state(0, 0, 0), state(1, 512, 1), state(1, 512, 8)]
    rows = VL.today_rows(records, ("linear",))
    assert [(r.step, r.slots) for r in rows] == [(0, 4), (1, 5), (2, 6)]
    assert VL.slot_counts(records) == (4, 5, 6, 12)


# ------------------------------------------------------------ the claim card


def _claims_doc(today: Any = None) -> dict[str, Any]:
    with open(DEFAULT_CLAIMS_FILE) as f:
        doc = json.load(f)
    for entry in doc["claims"]:
        if entry["id"] == "memslot-miss" and today is not None:
            entry["evidence"]["today"] = today
    return doc


def _miss(doc: dict[str, Any]) -> Claim:
    return next(c for c in parse(doc) if c.id == "memslot-miss")


def test_the_shipped_memslot_miss_claim_lists_a_virtio_mem_guest_of_today() -> None:
    claim = _miss(_claims_doc())
    assert claim.evidence.today is not None
    assert claim.evidence.today.scenario == VL.SCENARIO
    assert claim.evidence.today.structures == ("linear", "tree2011", "rbtree")


@pytest.mark.parametrize(
    ("today", "match"),
    [
        ("rbtree", "evidence.today: 'rbtree' is not of type 'object'"),
        ({"label": "x", "scenario": "s", "structures": []}, "structures"),
        ({"label": "x", "scenario": "s", "structures": ["splay"]}, "structures"),
        ({"scenario": "s", "structures": ["rbtree"]}, "label"),
    ],
)
def test_a_bad_today_entry_is_one_line_naming_the_field(today: Any, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        parse(_claims_doc(today))


def test_today_rows_never_decide_and_never_use_the_claims_figures() -> None:
    """With only virtio-mem states in the run the verdict stays not
    measurable (no 2011 guest layout), the rows are on the card all the
    same, and changing the claim's published figures changes none of them."""
    records = [state(0, 0, 0), state(1, 8192, 8), kvm_record(12, [180.0, 185.0, 190.0])]
    doc = _claims_doc()
    (verdict,) = evaluate([_miss(doc)], records)
    for entry in doc["claims"]:
        if entry["id"] == "memslot-miss":
            entry["measure"]["expected"] = 100.0
            entry["measure"]["a"]["published"] = 1.0
            entry["published"] = [{"what": "nothing", "unit": "x", "value": 0}]
    (other,) = evaluate([_miss(doc)], records)
    assert verdict.verdict == NOT_MEASURABLE
    assert [r.slots for r in verdict.today] == [4, 12]
    assert verdict.today == other.today
    data = verdict.to_json()["today"]
    assert data["rows"][1]["kvm"]["median_ns"] == 185.0
    assert data["structures"] == ["linear", "tree2011", "rbtree"]


def test_no_states_in_the_run_no_today_table() -> None:
    (verdict,) = evaluate([_miss(_claims_doc())], [])
    assert verdict.to_json()["today"] is None
    assert report.claim_card(verdict.to_json()).today is None


def test_the_card_lists_each_state_with_its_nodes_and_kvm_cost() -> None:
    records = [state(0, 0, 0), state(1, 8192, 8), kvm_record(12, [180.0, 185.0, 190.0])]
    (verdict,) = evaluate([_miss(_claims_doc())], records)
    card = report.claim_card(verdict.to_json())
    assert card.today is not None
    assert card.today.structures == ("linear", "tree2011", "rbtree")
    first, second = card.today.rows
    assert (first.state, first.slots, first.device_slots, first.kvm) == ("step 0: 0 MiB plugged", 4, 0, "")
    assert second.nodes[0].startswith("12 (worst 12)")
    assert second.nodes[1].endswith("(worst 8)")
    assert second.kvm.startswith("185 ns (180-190, 3 VMs)")
    html = report.render_html(report_results(verdict))
    assert "a virtio-mem guest of today" in html
    assert "not measured in this run" in html


def report_results(verdict: Verdict) -> Any:
    from memqual.host.judge.results import build_results

    return build_results([verdict], [])

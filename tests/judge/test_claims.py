"""The claims registry and the verdicts.

Each of the eight claims has a test in which its evidence points one way and
then the other, and the verdict changes with it: a verdict that no evidence
can move would be decided by memqual's constants.  The KSM and balloon
claims' flip tests are in test_claims_scenarios.py, fed by the scenarios'
own record builders.  The two claims nothing
here can measure are shown to stay "not measurable" whatever records exist.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from markupsafe import escape

from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement
from memqual.host.judge.claims import load as claims_load
from memqual.host.judge.claims.evaluate import evaluate, judge_claim
from memqual.host.judge.claims.layouts import layout_results
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import (
    ANCHOR_IDS,
    DEFAULT_CLAIMS_FILE,
    DIRECTION_ONLY,
    EVIDENCE_CLASSES,
    MEASURED,
    MIN_REPLICATES,
    MODEL,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    SUCCESSOR,
    UNDERPOWERED,
    UNMEASURABLE,
    Skip,
    Verdict,
)
from memqual.host.judge.stats import permutation
from memqual.host.memslots import guest_layouts as G
from memqual.host.memslots import kvm2011
from memqual.host.memslots import qemu_layout as Q
from memqual.host.report.claim_lines import ceiling_line, measured_text
from memqual.host.report.report import claim_card, render_html, report_page


def _results(verdicts: list) -> dict:
    """A results.json with these verdicts and nothing else."""
    return {"claims": [v.to_json() for v in verdicts], "metrics": [], "environment": {}, "run": {}}


RNG_SEED = 42


def _replicates(level: float, n: int, per: int = 4, noise: float = 0.02, seed: int = RNG_SEED) -> list[list[float]]:
    """n independent units around ``level``: each unit has its own offset
    (the between-guest spread), its samples their own noise."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        unit = level * (1 + rng.normal(0, noise))
        out.append([float(unit * (1 + rng.normal(0, noise / 2))) for _ in range(per)])
    return out


def _pair(
    scenario: str,
    metric: str,
    unit: str,
    a_variant: dict,
    a_level: float,
    b_variant: dict,
    b_level: float,
    *,
    n: int = 4,
    claim: str | None = None,
    settings: dict | None = None,
) -> list[Measurement]:
    common: dict[str, Any] = dict(
        scenario=scenario,
        metric=metric,
        unit=unit,
        better="lower",
        claim=claim,
        settings=settings or {"profile": "quick"},
    )
    return [
        Measurement(replicates=_replicates(a_level, n, seed=1), samples=[], variant=a_variant, **common),
        Measurement(replicates=_replicates(b_level, n, seed=2), samples=[], variant=b_variant, **common),
    ]


def _ksm(speedup: float, claim: str = "ksm-volatile-4k", n: int = 4) -> list[Measurement]:
    # B (smart_scan=0) costs `speedup` times A (smart_scan=1) per page.
    pages = "thp" if claim.endswith("thp") else "4k"
    return _pair(
        "ksm.volatile_scan",
        "ksmd_cpu_ns_per_page",
        "ns",
        {"smart_scan": 1, "pages": pages},
        100.0 / speedup,
        {"smart_scan": 0, "pages": pages},
        100.0,
        n=n,
        claim=claim,
    )


def _verdict(cid: str, records: list[Measurement]) -> Verdict:
    return {v.claim.id: v for v in evaluate(load(), records)}[cid]


# --------------------------------------------------------------- registry


def test_shipped_registry_holds_every_anchor_claim_with_its_evidence():
    loaded = load()
    assert sorted(c.id for c in loaded) == sorted(ANCHOR_IDS)
    for c in loaded:
        assert c.quote and c.seed and c.published
        assert c.evidence.kind in EVIDENCE_CLASSES
        assert c.evidence.claimed and c.evidence.instead
        if c.measure.source == "none":
            assert c.measure.reason and c.evidence.would_measure
    kinds = {c.id: c.evidence.kind for c in loaded}
    assert kinds["ksm-volatile-4k"] == kinds["ksm-volatile-thp"] == SUCCESSOR
    assert kinds["memslot-miss"] == MODEL
    assert kinds["memslot-netperf"] == UNMEASURABLE


def _shipped() -> dict:
    return json.loads(DEFAULT_CLAIMS_FILE.read_text())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="memqual.claims/1"), "schema"),
        (lambda d: d["claims"].append(copy.deepcopy(d["claims"][0])), "appears twice"),
        (lambda d: d["claims"][0].pop("quote"), "missing field 'quote'"),
        (lambda d: d["claims"][0]["measure"].update(source="oracle"), "is not one of"),
        (lambda d: d["claims"][0]["measure"].update(direction="sideways"), "direction"),
        (lambda d: d["claims"][0]["measure"].update(tolerance=-1), "tolerance"),
        (lambda d: d["claims"][4]["measure"]["a"].pop("variant"), "needs a 'variant'"),
        (lambda d: d["claims"][2]["measure"].pop("reason"), "missing field 'reason'"),
        (lambda d: d["claims"][0].pop("evidence"), "missing field 'evidence'"),
        (lambda d: d["claims"][0]["evidence"].update({"class": "measured"}), "does not fit source"),
        (lambda d: d["claims"][0]["evidence"].update(inputs=[]), "where each of its inputs"),
        (lambda d: d["claims"][2]["evidence"].update(would_measure=""), "what would measure it"),
        (lambda d: d["claims"][4]["evidence"].update({"class": "oracle"}), "is not one of"),
        (
            lambda d: d["claims"][4]["measure"].update(tolerence=0.1),
            r"measure: unknown field 'tolerence' \(did you mean 'tolerance'\?\); allowed: a, accelerator, b,",
        ),
        (lambda d: d["claims"][4]["measure"].update(paired="yes"), "measure.paired: 'yes' is not of type 'boolean'"),
        (lambda d: d["claims"][0]["measure"]["a"].pop("structure"), "needs 'structure', 'workload' and 'field'"),
        (lambda d: d["claims"][3]["measure"].update(order=["a"]), "at least two distinct variants"),
        (lambda d: d["claims"][3]["measure"].update(order=["a", "a"]), "at least two distinct variants"),
        (lambda d: d["claims"][4]["measure"].update(expected=0), "'expected' must be a positive ratio or null"),
        (lambda d: d["claims"][4].update(published=[{"what": "x"}]), "needs 'what' and 'unit'"),
        (lambda d: d["claims"].clear(), "'claims' must be a non-empty list"),
        (lambda d: d["claims"][4].update(id=5), "claim #4: id: 5 is not of type 'string'"),
        (lambda d: d["claims"][0]["evidence"]["today"].update(structures=["heap"]), "structures of the memslot model"),
        (lambda d: d["claims"][4]["evidence"].update(summary="One. Two. Three."), "at most two sentences"),
    ],
)
def test_bad_registry_is_bad_input_naming_the_fault(tmp_path, mutate, message):
    data = _shipped()
    mutate(data)
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=message) as raised:
        load(path)
    assert "\n" not in str(raised.value)  # one line


@pytest.mark.parametrize("index", [0, 2, 3, 4], ids=["model", "not measurable", "order", "records"])
def test_a_misspelt_evidence_class_is_named_with_the_fields_allowed(tmp_path, index):
    """Not the field a rule reading the missing ``class`` asks for next (a
    model's ``inputs``), whatever the claim's source."""
    data = _shipped()
    evidence = data["claims"][index]["evidence"]
    evidence["clas"] = evidence.pop("class")
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput) as raised:
        load(path)
    assert str(raised.value) == (
        f"{path}: claim {data['claims'][index]['id']!r}: evidence: unknown field 'clas' (did you mean 'class'?); "
        "allowed: accelerator, beside, claimed, class, inputs, instead, summary, today, would_measure"
    )


def test_a_registry_found_valid_is_not_checked_again_and_a_changed_one_is(monkeypatch):
    """The schema's check is most of a load's time, and memqual run loads
    the same registry at every look: what passed once passes again
    unchecked; any change is checked anew."""
    claims_load.parse(_shipped())
    checked: list[Path] = []
    validator = claims_load.schema_validator

    def counted(path: Path) -> Any:
        checked.append(path)
        return validator(path)

    monkeypatch.setattr(claims_load, "schema_validator", counted)
    assert [c.id for c in claims_load.parse(_shipped())] == [c.id for c in load()]
    assert checked == []
    changed = _shipped()
    changed["claims"][0]["measure"].update(direction="sideways")
    with pytest.raises(BadInput, match="direction"):
        claims_load.parse(changed)
    assert checked == [claims_load.SCHEMA_FILE]


def test_truncated_or_missing_registry_is_bad_input(tmp_path):
    path = tmp_path / "claims.json"
    path.write_text(DEFAULT_CLAIMS_FILE.read_text()[:300])
    with pytest.raises(BadInput, match="claims file truncated or not JSON"):
        load(path)
    with pytest.raises(BadInput, match="no such claims file"):
        load(tmp_path / "absent.json")


# ------------------------------------------------- one flip test per claim


def test_too_few_independent_replicates_are_underpowered_not_decided():
    few = _verdict("ksm-volatile-4k", _ksm(7.5, n=2))
    assert few.verdict == UNDERPOWERED and few.replicates_needed == MIN_REPLICATES
    # Many samples inside one guest are still one replicate.
    one_guest = [
        Measurement(
            scenario="ksm.volatile_scan",
            metric="ksmd_cpu_ns_per_page",
            unit="ns",
            better="lower",
            samples=[100.0 + i for i in range(40)],
            variant={"smart_scan": 0, "pages": "4k"},
        ),
        Measurement(
            scenario="ksm.volatile_scan",
            metric="ksmd_cpu_ns_per_page",
            unit="ns",
            better="lower",
            samples=[13.0 + i / 10 for i in range(40)],
            variant={"smart_scan": 1, "pages": "4k"},
        ),
    ]
    assert _verdict("ksm-volatile-4k", one_guest).verdict == UNDERPOWERED


@dataclass(frozen=True)
class Contrast:
    """What a measured claim compares: variant A at a fixed level against
    variant B, whose level each case sets."""

    scenario: str
    metric: str
    unit: str
    a_variant: dict
    a_level: float
    b_variant: dict

    def records(self, b_level: float) -> list[Measurement]:
        return _pair(self.scenario, self.metric, self.unit, self.a_variant, self.a_level, self.b_variant, b_level)


KERNBENCH = Contrast("memslots.kernbench", "elapsed_s", "s", {"lookup": "reorder"}, 42.16, {"lookup": "tree2011"})
RAM_HIT_VS_MISS = Contrast(
    "memslots.kvm_lookup", "access_ns", "ns", {"kind": "ram_hit", "slots": 32}, 300.0, {"kind": "miss", "slots": 32}
)


def test_balloon_claims_are_not_measurable_without_per_request_evidence():
    # Stock inflates with their model predictions are no evidence of request size.
    stock = Measurement(
        scenario="balloon.inflate",
        metric="inflate_s",
        unit="s",
        better="lower",
        samples=[0.8, 0.9],
        extra={"model": {"predictions": {"seed_breakdown": {"ms": {"array256": 3932.0}}}}},
    )
    for cid in ("balloon-bitmap", "balloon-breakdown"):
        v = _verdict(cid, [stock])
        assert v.verdict == NOT_MEASURABLE and v.evidence == UNMEASURABLE
        assert "What would measure it" in v.reason


def test_memslot_hit_and_priorities_are_registered_not_measurable():
    """Nothing here writes memslots.kernbench, and /dev/kvm costs cannot
    rank lookup kinds by how often they happen: both stay not measurable
    whatever today's costs say, which are shown beside."""
    today = KERNBENCH.records(42.3) + RAM_HIT_VS_MISS.records(5000.0)
    hit = _verdict("memslot-hit", today)
    assert hit.verdict == NOT_MEASURABLE and hit.evidence == UNMEASURABLE and "ept=0" in hit.reason
    prio = _verdict("memslot-priorities", today)
    assert prio.verdict == NOT_MEASURABLE and "kvm_mmio" in prio.reason
    assert {b.label.split(":")[0] for b in prio.beside} == {"today's kernel"}


def _lab_kernbench_registry(tmp_path: Path) -> Path:
    """The registry with memslot-hit judged on kernbench records, as a lab
    host where KVM boots Linux would have them."""
    data = _shipped()
    for c in data["claims"]:
        if c["id"] == "memslot-hit":
            c["evidence"]["class"] = "measured"
            c["measure"] = {
                "source": "records",
                "scenario": "memslots.kernbench",
                "metric": "elapsed_s",
                "a": {"label": "size-sorted array", "variant": {"lookup": "reorder"}},
                "b": {"label": "tree2011", "variant": {"lookup": "tree2011"}},
                "unit": "s",
                "direction": "at_least",
                "expected": None,
                "tolerance": 0.02,
            }
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(data))
    return path


def _kernbench(tree_level: float, noise: float) -> list[Measurement]:
    common: dict[str, Any] = dict(
        scenario="memslots.kernbench", metric="elapsed_s", unit="s", better="lower", settings={"profile": "lab"}
    )
    return [
        Measurement(
            replicates=_replicates(42.16, 6, noise=noise, seed=1), samples=[], variant={"lookup": "reorder"}, **common
        ),
        Measurement(
            replicates=_replicates(tree_level, 6, noise=noise, seed=2),
            samples=[],
            variant={"lookup": "tree2011"},
            **common,
        ),
    ]


def test_as_good_as_needs_an_interval_that_establishes_it(tmp_path):
    """'at_least': a tight interval above the floor reproduces; a wide one
    that reaches below it does not, whatever its centre; an interval wholly
    below says the tree beat the array, in those words."""
    path = _lab_kernbench_registry(tmp_path)
    (claim,) = [c for c in load(path) if c.id == "memslot-hit"]
    tight = evaluate([claim], _kernbench(42.3, 0.002))[0]
    assert tight.verdict == REPRODUCED and tight.ci is not None and tight.ci[0] >= 0.98
    wide = evaluate([claim], _kernbench(42.3, 0.15))[0]
    assert wide.ci is not None and wide.ci[0] < 0.98 < 1.0 < wide.ci[1]
    assert wide.verdict == NOT_REPRODUCED and "not established" in wide.reason
    beaten = evaluate([claim], _kernbench(38.0, 0.002))[0]
    assert beaten.verdict == NOT_REPRODUCED
    assert "tree2011 beats size-sorted array" in beaten.reason and "size-sorted array is not as good" in beaten.reason


def test_memslot_netperf_stays_not_measurable_whatever_the_records():
    noise = _ksm(7.5) + RAM_HIT_VS_MISS.records(5000.0)
    v = _verdict("memslot-netperf", noise)
    assert v.verdict == NOT_MEASURABLE and "KVM" in v.reason and "What would measure it" in v.reason
    # Today's miss cost is shown beside it, without deciding it.
    assert any(b.variant.get("kind") == "miss" for b in v.beside)


FLATVIEWS = json.loads((Path(__file__).parents[1] / "data" / "guest-flatviews.json").read_text())["configs"]


def _guest_layout(config: str, nic_at: int | None = None) -> Measurement:
    """The memslots.guest_layout record the e2e scenario's own builder
    (guest_layouts.layout_record) makes from a real pc guest's flat view
    (tests/data/guest-flatviews.json); ``nic_at`` moves the NIC's MMIO BAR,
    as firmware does with a 64-bit BAR when the hole below 4 GiB is full."""
    entry = FLATVIEWS[config]
    ranges = [Q.FlatRange(*r) for r in entry["ranges"]]
    if nic_at is not None:
        ranges = [
            Q.FlatRange(nic_at, nic_at + r.size - 1, r.kind, r.name) if r.name == "rtl8139" else r for r in ranges
        ]
    return G.layout_record(config, ranges, entry["settings"])


SEED_GUEST = "pc-seed000-guest"
OTHER_NIC_LAYOUTS = ("pc-rtl8139", "pc-rtl8139-ram-bars", "pc-rtl8139-26-dimms")


def _seed_guest_with(extra: list[list], name: str = SEED_GUEST) -> Measurement:
    """Seed 000's guest with more flat-view ranges (the flip tests' moved
    evidence), through the e2e scenario's own record builder."""
    entry = FLATVIEWS[SEED_GUEST]
    ranges = [Q.FlatRange(*r) for r in entry["ranges"]] + [Q.FlatRange(*r) for r in extra]
    return G.layout_record(name, ranges, entry["settings"])


def test_memslot_miss_is_decided_on_seed_000s_guest_with_the_other_layouts_beside():
    """Seed 000's guest (10 GiB around the PCI hole, cirrus VGA, rtl8139),
    booted and read: 6 tree nodes at the NIC BAR against 35 array entries,
    5.83x, within 25 % of 32 / 6.5; the other rtl8139 layouts give the
    range beside it (3.89-8.75x) and do not decide."""
    records = [_guest_layout(SEED_GUEST)] + [_guest_layout(n) for n in OTHER_NIC_LAYOUTS]
    v = _verdict("memslot-miss", records)
    assert v.settings["decided_on"] == SEED_GUEST and v.settings["decided_by"] == "nic-bar-miss"
    assert (v.a_replicates, v.b_replicates) == ([[6.0]], [[35.0]])
    assert v.verdict == REPRODUCED and v.ratio == pytest.approx(35 / 6)
    assert v.range_beside == pytest.approx((35 / 9, 35 / 4))
    assert "3.889-8.750x" in v.headline and "(other layouts 3.889-8.750)" in measured_text(v.to_json())
    # The seed's own 3.5 GiB split (QEMU 7.2's pc-i440fx-1.7) moves no node.
    old = _guest_layout("pc-i440fx-1.7-seed000-guest")
    assert _verdict("memslot-miss", [old]).ratio == pytest.approx(35 / 6)
    # The bare 512 MiB guest alone (main's deciding layout, 8.75x) decides nothing now.
    alone = _verdict("memslot-miss", [_guest_layout("pc-rtl8139")])
    assert alone.verdict == NOT_MEASURABLE and "8.750x at the NIC BAR (pc-rtl8139)" in alone.reason


def test_memslot_miss_flips_with_the_seed_guests_layout():
    """The same guest with its evidence moved: two more small RAM BARs put
    the NIC's miss two nodes deeper, equal dimms above 4 GiB with the NIC
    BAR above them make the tree a list longer than half the array."""
    base = _verdict("memslot-miss", [_guest_layout(SEED_GUEST)])
    assert base.verdict == REPRODUCED
    nic = next(r for r in FLATVIEWS[SEED_GUEST]["ranges"] if r[3] == "rtl8139")
    # The NIC moved into a hole the tree reaches at once: 35 / 4, too good.
    moved = [[r[0], r[1], r[2], r[3], r[4]] for r in FLATVIEWS[SEED_GUEST]["ranges"]]
    for r in moved:
        if r[3] == "rtl8139":
            r[0], r[1] = 0x2C0000000 + 0x100000, 0x2C0000000 + 0x100000 + r[1] - r[0]
    entry = FLATVIEWS[SEED_GUEST]
    shallow = G.layout_record(SEED_GUEST, [Q.FlatRange(*r) for r in moved], entry["settings"])
    v = _verdict("memslot-miss", [shallow])
    assert v.ratio != pytest.approx(35 / 6) and v.verdict == DIRECTION_ONLY, (v.ratio, v.reason)
    # 22 equal 128 MiB RAM ranges at 12 GiB and up, the NIC above them: a list.
    dimms = [
        [0x300000000 + i * (128 << 20), 0x300000000 + (i + 1) * (128 << 20) - 1, "ram", f"x{i}", 0] for i in range(22)
    ]
    deep = [[r[0], r[1], r[2], r[3], r[4]] for r in entry["ranges"] if r[3] != "rtl8139"] + dimms
    top = 0x300000000 + 22 * (128 << 20) + (1 << 20)
    deep.append([top, top + nic[1] - nic[0], "i/o", "rtl8139", 0])
    listy = G.layout_record(SEED_GUEST, [Q.FlatRange(*r) for r in deep], entry["settings"])
    v = _verdict("memslot-miss", [listy])
    assert v.layouts[0].slots == 32 and v.verdict == NOT_REPRODUCED, (v.ratio, v.reason)


def test_memslot_miss_labels_say_what_was_checked_and_what_is_newer_than_2011():
    """A 2011 host 'accepted' a layout on its slot count alone; pc-dimm,
    ivshmem-plain and q35 are marked newer than the claim's kernel and
    never decide."""
    records = [_guest_layout(n) for n in ("pc-plain", "pc-ram-bars", "pc-rtl8139-26-dimms", "pc-64-dimms")]
    v = _verdict("memslot-miss", records)
    m = next(c for c in load() if c.id == "memslot-miss").measure
    assert m.a is not None and m.b is not None
    by = {lr.config: lr for lr in layout_results(m.a, m.b, records, seed=G.SEED_000)}
    assert by["pc-rtl8139-26-dimms"].newer == (kvm2011.PC_DIMM,)
    assert by["pc-ram-bars"].newer == (kvm2011.IVSHMEM_PLAIN,) and by["pc-plain"].newer == ()
    assert not by["pc-64-dimms"].runs_2011 and by["pc-64-dimms"].a == 34.0  # equal dimms: the tree is a list
    assert v.verdict == NOT_MEASURABLE  # none of them is the seed's guest
    assert kvm2011.newer_than_2011({"machine": "q35"}) == (kvm2011.Q35,)
    html = render_html(_results([_verdict("memslot-miss", [_guest_layout(SEED_GUEST)] + records)]))
    assert "accepted (at most 32 user slots)" in html and ">ran<" not in html
    assert "pc-dimm (QEMU 2.1, 2014)" in html and "(the seed's guest: decides)" in html


def test_memslot_miss_is_not_measurable_without_real_layouts():
    v = _verdict("memslot-miss", [])
    assert v.verdict == NOT_MEASURABLE and "no memslot layouts read from real guests" in v.reason


# ------------------------------------------------------ evidence honesty


def test_the_evidence_does_not_depend_on_the_published_figures(tmp_path):
    """Only the comparison reads the seed's figures: change them and the
    evidence stays, while the verdict follows."""
    records = _ksm(7.5)
    data = _shipped()
    for c in data["claims"]:
        if c["id"] == "ksm-volatile-4k":
            c["measure"]["expected"] = 50.0
            c["published"][0]["value"] = 50
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(data))
    moved = evaluate([c for c in load(path) if c.id == "ksm-volatile-4k"], records)[0]
    shipped = _verdict("ksm-volatile-4k", records)
    assert moved.ratio == shipped.ratio and moved.ci == shipped.ci
    assert (shipped.verdict, moved.verdict) == (REPRODUCED, DIRECTION_ONLY)


def test_judge_claim_is_the_report_rule():
    records = _ksm(7.5)
    assert judge_claim("ksm-volatile-4k", records).verdict == _verdict("ksm-volatile-4k", records).verdict
    with pytest.raises(BadInput, match="no claim"):
        judge_claim("nonsense", records)


def test_verdict_json_has_the_report_fields():
    data = _verdict("ksm-volatile-4k", _ksm(7.5)).to_json()
    for key in ("id", "verdict", "reason", "evidence", "published", "measured", "ci", "unit", "samples", "replicates"):
        assert key in data
    assert data["evidence"]["class"] == SUCCESSOR
    assert "smart scan" in data["evidence"]["instead"] and "dirty-bit" in data["evidence"]["claimed"]
    assert len(data["replicates"]["a"]) == 4
    json.dumps(data)  # serialisable


def test_every_claim_gets_a_verdict_with_a_reason_even_with_nothing():
    skips = [Skip("e2e/test_ksm.py:KsmVolatile.test_scan", "CANCEL", "host KSM sysfs not writable")]
    verdicts = evaluate(load(), [], skips=skips)
    assert len(verdicts) == len(ANCHOR_IDS)
    for v in verdicts:
        assert v.verdict == NOT_MEASURABLE and v.reason and v.evidence == UNMEASURABLE
    by = {v.claim.id: v for v in verdicts}
    assert "host KSM sysfs not writable" in by["ksm-volatile-4k"].reason
    assert "KVM" in by["memslot-netperf"].reason


def test_claims_left_out_by_only_say_so():
    by = {v.claim.id: v for v in evaluate(load(), [], only=("memslots",))}
    assert by["ksm-volatile-4k"].reason.startswith("not selected in this run (--only memslots")
    assert "not selected" not in by["memslot-netperf"].reason  # not measurable anyway, for its own reason


def test_a_negligible_measured_effect_is_not_a_speed_up():
    v = _verdict("ksm-volatile-4k", _ksm(1.02))
    assert v.verdict == NOT_REPRODUCED


def test_the_skip_named_like_the_scenario_explains_the_missing_records():
    skips = [
        Skip("e2e/test_ksm.py:KsmTest.test_merge", "CANCEL", "mem-merge off unsupported"),
        Skip("e2e/test_ksm.py:KsmTest.test_volatile_scan_thp", "CANCEL", "THP is never on this host"),
    ]
    v = {x.claim.id: x for x in evaluate(load(), [], skips=skips)}["ksm-volatile-thp"]
    assert "test_volatile_scan_thp ended CANCEL: THP is never on this host" in v.reason


def test_a_paired_design_cancels_what_each_guest_shares():
    """Each guest measures both variants; host load moves a guest's two
    figures together.  Paired, the ratio's CI is tight; the same numbers
    judged unpaired give a wide one."""
    rng = np.random.default_rng(7)
    loads = [1.0, 1.6, 0.7, 1.3, 0.9]
    a = [[100.0 / 4.5 * load * (1 + rng.normal(0, 0.01)) for _ in range(3)] for load in loads]
    b = [[100.0 * load * (1 + rng.normal(0, 0.01)) for _ in range(3)] for load in loads]
    assert permutation.sign_flip_pvalue(a, b) == pytest.approx(2 / 32)
    common: dict[str, Any] = dict(
        scenario="ksm.volatile_scan", metric="ksmd_cpu_ns_per_page", unit="ns", better="lower"
    )
    records = [
        Measurement(replicates=a, samples=[], variant={"smart_scan": 1, "pages": "4k"}, **common),
        Measurement(replicates=b, samples=[], variant={"smart_scan": 0, "pages": "4k"}, **common),
    ]
    v = _verdict("ksm-volatile-4k", records)
    assert v.ci is not None and v.ci[1] - v.ci[0] < 0.6 and "paired" in v.reason


# ------------------------------------------------ claim fidelity, third pass


def _kinds(miss: int, ram: int, other: int, boots: int = 4, accel: str = "kvm") -> list[Measurement]:
    """memslots.lookup_kinds records as e2e/test_memslots_kvm.py writes them
    (lookup_kinds.records), counted over ``boots`` fresh guests."""
    from memqual.host.memslots import lookup_kinds as LK

    rng = np.random.default_rng(3)
    per_boot = [
        LK.Counts(
            {k: int(n * (1 + rng.normal(0, 0.05))) for k, n in (("miss", miss), ("ram_hit", ram), ("other_hit", other))}
            | {"fault_no_slot": 3},
            20.0,
        )
        for _ in range(boots)
    ]
    records = LK.records(per_boot, {"accel": accel})
    for r in records:
        r.environment = {"accel": accel}
    return records


def test_memslot_priorities_is_judged_on_the_order_of_the_counts_and_flips():
    """Seed 002's order (miss > RAM hit > other hit, by frequency) from a
    KVM host's counts: it holds, fails when the counts say otherwise, is
    underpowered on two guests and not measurable under TCG."""
    held = _verdict("memslot-priorities", _kinds(90000, 30000, 40))
    assert held.verdict == REPRODUCED and held.evidence == MEASURED, held.reason
    flipped = _verdict("memslot-priorities", _kinds(20000, 30000, 40))
    assert flipped.verdict == NOT_REPRODUCED and "the other way round" in flipped.reason
    assert flipped.ratio is not None and flipped.ratio < 1
    assert _verdict("memslot-priorities", _kinds(90000, 30000, 40, boots=2)).verdict == UNDERPOWERED
    tcg = _verdict("memslot-priorities", _kinds(90000, 30000, 40, accel="tcg"))
    assert tcg.verdict == NOT_MEASURABLE and "not KVM" in tcg.reason


def test_an_order_names_the_host_of_its_counts_and_a_model_has_none_of_its_own():
    """The order's counts ran somewhere (its records' host and clock); the
    memslot model runs nowhere: its inputs say where they came from, and
    it names no host or clock even when its layout records do."""
    kinds = _kinds(90000, 30000, 40)
    for r in kinds:
        r.environment["clock"] = "wall"
    held = _verdict("memslot-priorities", kinds)
    assert (held.ran_on.host, held.ran_on.clock) == ("this machine (accel kvm)", "wall")
    layouts = [_guest_layout(SEED_GUEST)] + [_guest_layout(n) for n in OTHER_NIC_LAYOUTS]
    for r in layouts:
        r.environment = {"accel": "tcg", "clock": "wall"}
    model = _verdict("memslot-miss", layouts)
    assert model.evidence == MODEL and not model.ran_on.measured
    assert model.to_json()["ran_on"]["host"] == model.to_json()["ran_on"]["clock"] == "no measurement"


def test_every_card_shows_its_note_and_the_terminal_prints_it():
    from rich.console import Console

    from memqual.host.report.terminal import print_tables

    results = _results(evaluate(load(), []))
    html = render_html(results)
    for text in (
        "The array&#39;s 35 entries are the host&#39;s, whatever the guest",
        "how often the guest dirties a page",
        "for a 16 GB guest",
    ):
        assert text in html, text
    console = Console(record=True, width=200)
    print_tables(results, console=console)
    assert "Note: The seed counted 6-7 tree nodes" in console.export_text()


def _ksm_with_ceiling(speedup: float, ceiling: float, pages: str, limit: float = 9.0) -> list[Measurement]:
    claim = f"ksm-volatile-{pages}"
    share = 1 - 1 / ceiling
    bound = Measurement(
        scenario="ksm.volatile_scan",
        metric="gain_ceiling",
        unit="x",
        better="higher",
        samples=[],
        replicates=[[ceiling]] * 4,
        variant={"pages": pages},
        claim=claim,
        extra={
            "ceiling_formula": "1 / (1 - skip share)",
            "limit_any_workload": limit,
            "limit_source": "skip_age()",
            "skip_share": [share] * 4,
        },
    )
    return _ksm(speedup, claim=claim) + [bound]


def test_ksm_4k_band_is_out_of_reach_at_the_runs_skip_share_not_by_design():
    """9x whatever the workload is above 8x's band (from 6x): a ceiling of
    5.87x (skip share 0.83) puts the band out of reach at this run's share;
    THP's band (from 12x) is out of reach by design."""
    four = _verdict("ksm-volatile-4k", _ksm_with_ceiling(4.3, 5.87, "4k"))
    assert four.verdict == DIRECTION_ONLY
    assert (
        "Out of reach at this run's skip share 0.8296" in four.reason
        and "by design" not in four.reason.split("not by design")[0]
    )
    line = ceiling_line(four.to_json())
    assert "out of reach at this run's skip share" in line and "out of its reach by design" not in line
    thp = _verdict("ksm-volatile-thp", _ksm_with_ceiling(4.3, 5.87, "thp"))
    assert "Out of reach by design" in thp.reason and "by design" in ceiling_line(thp.to_json())


def test_ksm_cards_carry_the_accelerator_qualifier_and_say_what_smart_scan_skips():
    records = _ksm(7.5)
    for r in records:
        r.environment = {"accel": "tcg"}
    v = _verdict("ksm-volatile-4k", records)
    assert v.qualifier.startswith("under TCG on this host, saying nothing about KVM")
    row = report_page(_results([v])).summary[0]
    assert row.qualifier == "under TCG, not KVM"
    ev = v.claim.evidence
    assert "volatile or not" in ev.instead and "volatile or not" in v.claim.measure.note
    assert "adopted instead" not in ev.instead and "successor in purpose" in ev.instead


def test_the_guest_of_today_columns_say_they_count_the_guests_slots_alone():
    node = {"mean": 6.0, "worst": 6}
    card = claim_card(
        {
            "id": "memslot-miss",
            "verdict": NOT_MEASURABLE,
            "reason": "-",
            "today": {
                "label": "virtio-mem",
                "structures": ["linear", "tree2011", "rbtree"],
                "rows": [
                    {
                        "step": 0,
                        "plugged_mib": 0,
                        "slots": 6,
                        "device_slots": 0,
                        "kvm": None,
                        "nodes": [dict(node, structure=s) for s in ("linear", "tree2011", "rbtree")],
                    }
                ],
            },
        }
    )
    assert card.today is not None and "guest's slots alone" in card.today.headers[0]
    html = render_html(
        _results([_verdict("memslot-miss", [])])
        | {
            "claims": [
                dict(
                    _verdict("memslot-miss", []).to_json(),
                    today={
                        "label": "virtio-mem",
                        "structures": ["linear"],
                        "rows": [
                            {
                                "step": 0,
                                "plugged_mib": 0,
                                "slots": 6,
                                "device_slots": 0,
                                "kvm": None,
                                "nodes": [dict(node, structure="linear")],
                            }
                        ],
                    },
                )
            ]
        }
    )
    assert "array over the guest&#39;s slots alone" in html


def test_the_balloons_bitmap_and_breakdown_claims_need_kvm():
    # The judge qualifies a verdict made under another accelerator by it (claims/records.py).
    by = {c["id"]: c for c in _shipped()["claims"]}
    for cid in ("balloon-bitmap", "balloon-breakdown"):
        assert by[cid]["evidence"]["accelerator"]["needs"] == "kvm"


def _card_html(html: str, cid: str) -> str:
    start = html.index(f"<section class='card' id='{cid}'>")
    return html[start : html.index("</section>", start)]


def test_a_card_says_its_evidence_once_in_at_most_three_sentences():
    """The memslot-miss card: one paragraph (class, what was measured on
    what, the verdict's reason) above the fold; the long text, the sources
    and the per-layout arithmetic only inside <details>."""
    records = [_guest_layout(SEED_GUEST)] + [_guest_layout(n) for n in OTHER_NIC_LAYOUTS]
    v = _verdict("memslot-miss", records)
    html = render_html(_results([v] + evaluate(load(), [])[1:]))
    card = _card_html(html, "memslot-miss")
    shown, folded = card.split("<details>")
    summary = shown.split("<p class='evidence'>")[1].split("</p>")[0]
    sentences = [x for x in summary.replace("4.92x", "4.92 x").split(". ") if x.strip()]
    assert len(sentences) <= 3, sentences
    instead = escape(v.claim.evidence.instead)
    assert instead not in shown and card.count(str(instead)) == 1
    assert "pc-rtl8139-ram-bars (13 user slots)" in folded and "35 / 9 = 3.889x" in folded
    for cid in ANCHOR_IDS:
        assert "<details>" in _card_html(html, cid)


def test_the_order_judge_errs_at_most_its_level_on_a_tie_and_finds_a_clear_order():
    """Synthetic truth through the real judge: per fresh guest a shared
    load factor (lognormal, sd 0.3) and Poisson counts.  With misses exactly
    as frequent as RAM hits (the boundary of the claim's null), 'reproduced'
    comes at most at the interval's 2.5 % a side (measured here over 400
    runs of 4 guests); with misses 3x RAM hits and RAM hits 100x other hits
    the order is found almost always."""
    from memqual.host.memslots import lookup_kinds as LK

    claim = next(c for c in load() if c.id == "memslot-priorities")
    rng = np.random.default_rng(11)

    def run(miss: float, ram: float, other: float) -> str:
        boots = []
        for _ in range(4):
            load = float(np.exp(rng.normal(0, 0.3)))
            rates = {"miss": miss, "ram_hit": ram, "other_hit": other, "fault_no_slot": 1.0}
            boots.append(LK.Counts({k: int(rng.poisson(r * load * 20)) for k, r in rates.items()}, 20.0))
        records = LK.records(boots, {"accel": "kvm"})
        for r in records:
            r.environment = {"accel": "kvm"}
        return evaluate([claim], records)[0].verdict

    tie = [run(500.0, 500.0, 5.0) for _ in range(400)]
    assert tie.count(REPRODUCED) / len(tie) <= 0.04
    clear = [run(1500.0, 500.0, 5.0) for _ in range(100)]
    assert clear.count(REPRODUCED) / len(clear) >= 0.9

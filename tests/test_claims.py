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

from memqual.host.core import stats
from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement
from memqual.host.judge import claims
from memqual.host.memslots import guest_layouts as G
from memqual.host.memslots import qemu_layout as Q

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


def _verdict(cid: str, records: list[Measurement]) -> claims.Verdict:
    return {v.claim.id: v for v in claims.evaluate(claims.load(), records)}[cid]


# --------------------------------------------------------------- registry


def test_shipped_registry_holds_every_anchor_claim_with_its_evidence():
    loaded = claims.load()
    assert sorted(c.id for c in loaded) == sorted(claims.ANCHOR_IDS)
    for c in loaded:
        assert c.quote and c.seed and c.published
        assert c.evidence.kind in claims.EVIDENCE_CLASSES
        assert c.evidence.claimed and c.evidence.instead
        if c.measure.source == "none":
            assert c.measure.reason and c.evidence.would_measure
    kinds = {c.id: c.evidence.kind for c in loaded}
    assert kinds["ksm-volatile-4k"] == kinds["ksm-volatile-thp"] == claims.SUCCESSOR
    assert kinds["memslot-miss"] == claims.MODEL
    assert kinds["memslot-netperf"] == claims.UNMEASURABLE


def _shipped() -> dict:
    return json.loads(claims.DEFAULT_CLAIMS_FILE.read_text())


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
    ],
)
def test_bad_registry_is_bad_input_naming_the_fault(tmp_path, mutate, message):
    data = _shipped()
    mutate(data)
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=message):
        claims.load(path)


def test_truncated_or_missing_registry_is_bad_input(tmp_path):
    path = tmp_path / "claims.json"
    path.write_text(claims.DEFAULT_CLAIMS_FILE.read_text()[:300])
    with pytest.raises(BadInput, match="claims file truncated or not JSON"):
        claims.load(path)
    with pytest.raises(BadInput, match="no such claims file"):
        claims.load(tmp_path / "absent.json")


# ------------------------------------------------- one flip test per claim


def test_too_few_independent_replicates_are_underpowered_not_decided():
    few = _verdict("ksm-volatile-4k", _ksm(7.5, n=2))
    assert few.verdict == claims.UNDERPOWERED and few.replicates_needed == claims.MIN_REPLICATES
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
    assert _verdict("ksm-volatile-4k", one_guest).verdict == claims.UNDERPOWERED


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
        assert v.verdict == claims.NOT_MEASURABLE and v.evidence == claims.UNMEASURABLE
        assert "What would measure it" in v.reason


def test_memslot_hit_and_priorities_are_registered_not_measurable():
    """Nothing here writes memslots.kernbench, and /dev/kvm costs cannot
    rank lookup kinds by how often they happen: both stay not measurable
    whatever today's costs say, which are shown beside."""
    today = KERNBENCH.records(42.3) + RAM_HIT_VS_MISS.records(5000.0)
    hit = _verdict("memslot-hit", today)
    assert hit.verdict == claims.NOT_MEASURABLE and hit.evidence == claims.UNMEASURABLE and "ept=0" in hit.reason
    prio = _verdict("memslot-priorities", today)
    assert prio.verdict == claims.NOT_MEASURABLE and "kvm_mmio" in prio.reason
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
    (claim,) = [c for c in claims.load(path) if c.id == "memslot-hit"]
    tight = claims.evaluate([claim], _kernbench(42.3, 0.002))[0]
    assert tight.verdict == claims.REPRODUCED and tight.ci is not None and tight.ci[0] >= 0.98
    wide = claims.evaluate([claim], _kernbench(42.3, 0.15))[0]
    assert wide.ci is not None and wide.ci[0] < 0.98 < 1.0 < wide.ci[1]
    assert wide.verdict == claims.NOT_REPRODUCED and "not established" in wide.reason
    beaten = claims.evaluate([claim], _kernbench(38.0, 0.002))[0]
    assert beaten.verdict == claims.NOT_REPRODUCED
    assert "tree2011 beats size-sorted array" in beaten.reason and "size-sorted array is not as good" in beaten.reason


def test_memslot_netperf_stays_not_measurable_whatever_the_records():
    noise = _ksm(7.5) + RAM_HIT_VS_MISS.records(5000.0)
    v = _verdict("memslot-netperf", noise)
    assert v.verdict == claims.NOT_MEASURABLE and "KVM" in v.reason and "What would measure it" in v.reason
    # Today's miss cost is shown beside it, without deciding it.
    assert any(b.variant.get("kind") == "miss" for b in v.beside)


FLATVIEWS = json.loads((Path(__file__).parent / "data" / "guest-flatviews.json").read_text())["configs"]


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


def test_memslot_miss_flips_with_the_real_layouts():
    """Seed 000's path on real pc guests with an rtl8139, on the 2011 VMX
    host (35 array entries): the tree's nodes at the NIC BAR decide."""
    plain = _verdict("memslot-miss", [_guest_layout("pc-rtl8139")])
    assert plain.settings["decided_by"] == "nic-bar-miss"
    assert plain.layouts[0].nic_b == 35 and plain.layouts[0].nic_a == 4
    assert plain.verdict == claims.DIRECTION_ONLY and plain.ratio == pytest.approx(8.75)
    # With RAM BARs the NIC path is 9 nodes deep: within 25 % of the seed's 32 / 6.5.
    bars = _verdict("memslot-miss", [_guest_layout("pc-rtl8139-ram-bars")])
    assert bars.verdict == claims.REPRODUCED and bars.ratio == pytest.approx(35 / 9)
    # The 32-slot case, decisively: 26 equal dimms and the NIC in the hole below 4 GiB.
    full = _verdict("memslot-miss", [_guest_layout("pc-rtl8139-26-dimms")])
    assert full.layouts[0].slots == 32 and full.layouts[0].runs_2011
    assert full.verdict == claims.DIRECTION_ONLY and full.ratio == pytest.approx(35 / 5)
    # The same guest with the NIC BAR above the dimms: the miss walks the
    # whole list the equal dimms made, and the tree saves under half the walk.
    above = _verdict("memslot-miss", [_guest_layout("pc-rtl8139-26-dimms", nic_at=0x210000000)])
    assert above.layouts[0].nic_a == 27
    assert above.verdict == claims.NOT_REPRODUCED and above.ratio == pytest.approx(35 / 27)


def test_memslot_miss_counts_no_layout_a_2011_host_refused():
    """pc-64-dimms (70 slots) ran on no 2011 host: listed with the tree's
    worst case, not counted; without a NIC layout the mean over gaps decides."""
    records = [_guest_layout(name) for name in ("pc-plain", "pc-ram-bars", "pc-64-dimms")]
    v = _verdict("memslot-miss", records)
    by = {lr.config: lr for lr in v.layouts}
    assert not by["pc-64-dimms"].runs_2011 and by["pc-64-dimms"].slots == 70
    assert by["pc-64-dimms"].a == 34.0  # exact over its gaps; equal dimms: the tree is a list
    assert v.settings["refused_by_2011_host"] == ["pc-64-dimms"] and v.settings["decided_by"] == "mean-over-gaps"
    assert len(v.a_replicates) == 2 and "ran on no 2011 host" in v.reason and "worst case here: pc-64-dimms" in v.reason
    assert v.verdict == claims.DIRECTION_ONLY and v.ratio == pytest.approx(stats.median([35 / 3.5, 35 / (20 / 3)]))
    only_refused = _verdict("memslot-miss", [_guest_layout("pc-64-dimms")])
    assert only_refused.verdict == claims.NOT_MEASURABLE and "ran on no 2011 host" in only_refused.reason


def test_memslot_miss_is_not_measurable_without_real_layouts():
    v = _verdict("memslot-miss", [])
    assert v.verdict == claims.NOT_MEASURABLE and "no memslot layouts read from real guests" in v.reason


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
    moved = claims.evaluate([c for c in claims.load(path) if c.id == "ksm-volatile-4k"], records)[0]
    shipped = _verdict("ksm-volatile-4k", records)
    assert moved.ratio == shipped.ratio and moved.ci == shipped.ci
    assert (shipped.verdict, moved.verdict) == (claims.REPRODUCED, claims.DIRECTION_ONLY)


def test_judge_claim_is_the_report_rule():
    records = _ksm(7.5)
    assert claims.judge_claim("ksm-volatile-4k", records).verdict == _verdict("ksm-volatile-4k", records).verdict
    with pytest.raises(BadInput, match="no claim"):
        claims.judge_claim("nonsense", records)


def test_verdict_json_has_the_report_fields():
    data = _verdict("ksm-volatile-4k", _ksm(7.5)).to_json()
    for key in ("id", "verdict", "reason", "evidence", "published", "measured", "ci", "unit", "samples", "replicates"):
        assert key in data
    assert data["evidence"]["class"] == claims.SUCCESSOR
    assert "smart scan" in data["evidence"]["instead"] and "dirty-bit" in data["evidence"]["claimed"]
    assert len(data["replicates"]["a"]) == 4
    json.dumps(data)  # serialisable


def test_every_claim_gets_a_verdict_with_a_reason_even_with_nothing():
    skips = [claims.Skip("e2e/test_ksm.py:KsmVolatile.test_scan", "CANCEL", "host KSM sysfs not writable")]
    verdicts = claims.evaluate(claims.load(), [], skips=skips)
    assert len(verdicts) == len(claims.ANCHOR_IDS)
    for v in verdicts:
        assert v.verdict == claims.NOT_MEASURABLE and v.reason and v.evidence == claims.UNMEASURABLE
    by = {v.claim.id: v for v in verdicts}
    assert "host KSM sysfs not writable" in by["ksm-volatile-4k"].reason
    assert "KVM" in by["memslot-netperf"].reason


def test_claims_left_out_by_only_say_so():
    by = {v.claim.id: v for v in claims.evaluate(claims.load(), [], only=("memslots",))}
    assert by["ksm-volatile-4k"].reason.startswith("not selected in this run (--only memslots")
    assert "not selected" not in by["memslot-netperf"].reason  # not measurable anyway, for its own reason


def test_a_negligible_measured_effect_is_not_a_speed_up():
    v = _verdict("ksm-volatile-4k", _ksm(1.02))
    assert v.verdict == claims.NOT_REPRODUCED


def test_the_skip_named_like_the_scenario_explains_the_missing_records():
    skips = [
        claims.Skip("e2e/test_ksm.py:KsmTest.test_merge", "CANCEL", "mem-merge off unsupported"),
        claims.Skip("e2e/test_ksm.py:KsmTest.test_volatile_scan_thp", "CANCEL", "THP is never on this host"),
    ]
    v = {x.claim.id: x for x in claims.evaluate(claims.load(), [], skips=skips)}["ksm-volatile-thp"]
    assert "test_volatile_scan_thp ended CANCEL: THP is never on this host" in v.reason


def test_a_paired_design_cancels_what_each_guest_shares():
    """Each guest measures both variants; host load moves a guest's two
    figures together.  Paired, the ratio's CI is tight; the same numbers
    judged unpaired give a wide one."""
    rng = np.random.default_rng(7)
    loads = [1.0, 1.6, 0.7, 1.3, 0.9]
    a = [[100.0 / 4.5 * load * (1 + rng.normal(0, 0.01)) for _ in range(3)] for load in loads]
    b = [[100.0 * load * (1 + rng.normal(0, 0.01)) for _ in range(3)] for load in loads]
    lo, hi = stats.paired_ratio_ci(list(zip(a, b, strict=True)), seed=1)
    assert 4.2 < lo < 4.5 < hi < 4.8
    assert claims.sign_flip_pvalue(a, b) == pytest.approx(2 / 32)
    common: dict[str, Any] = dict(
        scenario="ksm.volatile_scan", metric="ksmd_cpu_ns_per_page", unit="ns", better="lower"
    )
    records = [
        Measurement(replicates=a, samples=[], variant={"smart_scan": 1, "pages": "4k"}, **common),
        Measurement(replicates=b, samples=[], variant={"smart_scan": 0, "pages": "4k"}, **common),
    ]
    v = _verdict("ksm-volatile-4k", records)
    assert v.ci is not None and v.ci[1] - v.ci[0] < 0.6 and "paired" in v.reason

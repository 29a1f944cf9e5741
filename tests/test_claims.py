"""The claims registry and the verdicts, on synthetic records."""

from __future__ import annotations

import copy
import json
import sys
import types

import numpy as np
import pytest

from host import claims
from host.errors import BadInput
from host.record import Measurement


def _records_ksm(speedup: float, claim: str = "ksm-volatile-4k", n: int = 6, noise: float = 0.02) -> list[Measurement]:
    rng = np.random.default_rng(42)
    base = 0.8  # ksmd CPU seconds per full scan with smart_scan=0
    slow = list(base * (1 + rng.normal(0, noise, n)))
    fast = list(base / speedup * (1 + rng.normal(0, noise, n)))
    common = dict(scenario="ksm.volatile_scan", metric="ksmd_cpu_ns_per_page", unit="ns", better="lower",
                  claim=claim, settings={"pages_to_scan": 4000}, environment={"accel": "tcg"})
    return [
        Measurement(samples=slow, variant={"smart_scan": 0}, **common),
        Measurement(samples=fast, variant={"smart_scan": 1}, **common),
    ]


def _by_id(verdicts):
    return {v.claim.id: v for v in verdicts}


@pytest.fixture()
def no_model(monkeypatch):
    # None in sys.modules makes "import host.memslots.model" raise ImportError.
    monkeypatch.setitem(sys.modules, "host.memslots.model", None)


@pytest.fixture()
def fake_model(monkeypatch):
    """A model with known answers: 32 entries on a miss for the array, 6.4 on
    average for the tree; RAM hits 1.5 (reorder) and 1.8 (wbtree) nodes."""
    table = {
        ("seed-32", "miss"): {"linear": {"mean_nodes": 32, "max_nodes": 32}, "wbtree": {"mean_nodes": 6.4, "max_nodes": 7}},
        ("seed-32", "ram-hits"): {"linear": {"mean_nodes": 1.4, "max_nodes": 2}},
        ("seed-3-stacked", "ram-hits"): {"reorder": {"mean_nodes": 1.5, "max_nodes": 2}, "wbtree": {"mean_nodes": 1.8, "max_nodes": 2}},
    }
    mod = types.ModuleType("host.memslots.model")

    def model_table(layout, workload):
        return {"layout": layout.name, "workload": workload, "structures": table[(layout.name, workload)]}

    mod.model_table = model_table
    monkeypatch.setitem(sys.modules, "host.memslots.model", mod)
    return table


def test_shipped_registry_holds_every_anchor_claim():
    loaded = claims.load()
    ids = [c.id for c in loaded]
    assert sorted(ids) == sorted(claims.ANCHOR_IDS)
    for c in loaded:
        assert c.quote and c.seed and c.published
        if c.measure.source == "none":
            assert c.measure.reason  # not measurable always says why


def test_reproduced_when_the_magnitude_is_within_tolerance(no_model):
    v = _by_id(claims.evaluate(claims.load(), _records_ksm(7.5)))["ksm-volatile-4k"]
    assert v.verdict == claims.REPRODUCED
    assert 7.0 < v.ratio < 8.0
    assert v.ci[0] > 1.0 and v.p_value < 0.05
    assert "within 25%" in v.reason and "8x" in v.reason


def test_direction_only_when_the_effect_is_real_but_small(no_model):
    v = _by_id(claims.evaluate(claims.load(), _records_ksm(1.3)))["ksm-volatile-4k"]
    assert v.verdict == claims.DIRECTION_ONLY
    assert "below the published 8x" in v.reason


def test_not_reproduced_when_there_is_no_effect(no_model):
    v = _by_id(claims.evaluate(claims.load(), _records_ksm(1.0, noise=0.05)))["ksm-volatile-4k"]
    assert v.verdict == claims.NOT_REPRODUCED
    assert "not established" in v.reason


def test_records_of_another_claim_are_not_used(no_model):
    verdicts = _by_id(claims.evaluate(claims.load(), _records_ksm(15.0, claim="ksm-volatile-thp")))
    assert verdicts["ksm-volatile-thp"].verdict == claims.REPRODUCED
    assert verdicts["ksm-volatile-4k"].verdict == claims.NOT_MEASURABLE
    assert "no records of ksm.volatile_scan" in verdicts["ksm-volatile-4k"].reason


def test_every_claim_gets_a_verdict_with_a_reason_even_with_nothing(no_model):
    skips = [claims.Skip("e2e/test_ksm.py:KsmVolatile.test_scan", "CANCEL", "host KSM sysfs not writable")]
    verdicts = claims.evaluate(claims.load(), [], skips=skips)
    assert len(verdicts) == len(claims.ANCHOR_IDS)
    for v in verdicts:
        assert v.verdict == claims.NOT_MEASURABLE and v.reason
    by = _by_id(verdicts)
    assert "host KSM sysfs not writable" in by["ksm-volatile-4k"].reason
    assert "memslot reference model is not available" in by["memslot-miss"].reason
    assert "KVM" in by["memslot-netperf"].reason


def test_memslot_claims_from_the_model_say_they_are_computed(fake_model):
    by = _by_id(claims.evaluate(claims.load(), []))
    miss = by["memslot-miss"]
    assert miss.computed and "computed from the reference model" in miss.reason
    assert miss.ratio == pytest.approx(32 / 6.4)
    assert miss.verdict == claims.REPRODUCED  # 5.0 is within 25% of 4.92
    assert by["memslot-hit"].verdict == claims.REPRODUCED  # wbtree 1.8 >= reorder 1.5
    assert by["memslot-priorities"].verdict == claims.REPRODUCED  # miss 32 > hit 1.4


def test_model_that_contradicts_the_claim_is_not_reproduced(fake_model):
    fake_model[("seed-32", "miss")]["wbtree"]["mean_nodes"] = 40
    assert _by_id(claims.evaluate(claims.load(), []))["memslot-miss"].verdict == claims.NOT_REPRODUCED


def test_model_of_another_shape_is_not_measurable(fake_model):
    del fake_model[("seed-32", "miss")]["wbtree"]
    v = _by_id(claims.evaluate(claims.load(), []))["memslot-miss"]
    assert v.verdict == claims.NOT_MEASURABLE and "no structure 'wbtree'" in v.reason


def test_record_extra_claims_read_the_scenarios_model(no_model):
    # The shape of host.balloon_model.predict_seed(): a split per cost model.
    prediction = {"predictions": {"seed_breakdown": {"ms": {"array256": 8000.0, "bitmap32768": 2000.0, "bitmap524288": 1250.0}}}}
    rec = Measurement(
        scenario="balloon.inflate", metric="inflate_s", unit="s", better="lower", claim="balloon-bitmap",
        samples=[0.80, 0.81, 0.79], extra={"model": prediction},
    )
    by = _by_id(claims.evaluate(claims.load(), [rec]))
    assert by["balloon-bitmap"].verdict == claims.REPRODUCED
    assert by["balloon-bitmap"].ratio == pytest.approx(1.6)
    assert "not measured directly" in by["balloon-bitmap"].reason
    assert "seed_breakdown" in by["balloon-bitmap"].reason  # says which figure it used
    # One model serves both balloon claims: 8000 / 1250 = 6.4, published 6.67.
    assert by["balloon-breakdown"].verdict == claims.REPRODUCED
    # A calibrated figure, when present, wins over the seed-breakdown split.
    prediction["predictions"]["calibrated"] = {"ms": {"array256": 1000.0, "bitmap32768": 900.0, "bitmap524288": 850.0}}
    by = _by_id(claims.evaluate(claims.load(), [rec]))
    assert by["balloon-bitmap"].verdict == claims.DIRECTION_ONLY
    assert by["balloon-bitmap"].ratio == pytest.approx(900 / 850)


def test_record_extra_with_another_shape_says_so(no_model):
    rec = Measurement(scenario="balloon.inflate", metric="inflate_ms", unit="ms", better="lower", samples=[1.0], extra={})
    v = _by_id(claims.evaluate(claims.load(), [rec]))["balloon-bitmap"]
    assert v.verdict == claims.NOT_MEASURABLE and "carry no numbers" in v.reason


def _shipped() -> dict:
    return json.loads(claims.DEFAULT_CLAIMS_FILE.read_text())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="memqual.claims/0"), "schema"),
        (lambda d: d["claims"].append(copy.deepcopy(d["claims"][0])), "appears twice"),
        (lambda d: d["claims"][0].pop("quote"), "missing field 'quote'"),
        (lambda d: d["claims"][0]["measure"].update(source="oracle"), "is not one of"),
        (lambda d: d["claims"][0]["measure"].update(direction="sideways"), "direction"),
        (lambda d: d["claims"][0]["measure"].update(tolerance=-1), "tolerance"),
        (lambda d: d["claims"][4]["measure"]["a"].pop("variant"), "needs a 'variant'"),
        (lambda d: d["claims"][2]["measure"].pop("reason"), "missing field 'reason'"),
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


def test_verdict_json_has_the_report_fields(no_model):
    v = _by_id(claims.evaluate(claims.load(), _records_ksm(7.5)))["ksm-volatile-4k"]
    data = v.to_json()
    for key in ("id", "verdict", "reason", "published", "measured", "ci", "unit", "samples"):
        assert key in data
    assert len(data["samples"]["a"]) == 6
    json.dumps(data)  # serialisable


def test_the_real_memslot_model_answers_the_memslot_claims():
    pytest.importorskip("host.memslots.model", reason="the memslot reference model (issue 5) is not here")
    by = _by_id(claims.evaluate(claims.load(), []))
    for cid in ("memslot-miss", "memslot-hit", "memslot-priorities"):
        assert by[cid].verdict != claims.NOT_MEASURABLE, by[cid].reason
        assert by[cid].computed
    # Seed 000's 6-7 nodes against 32 entries on a miss.
    assert by["memslot-miss"].a_samples[0] == pytest.approx(6.5, abs=0.6)
    assert by["memslot-miss"].b_samples == [32.0]


def test_claims_left_out_by_only_say_so(no_model):
    by = _by_id(claims.evaluate(claims.load(), [], only=("memslots",)))
    assert by["ksm-volatile-4k"].reason.startswith("not selected in this run (--only memslots")
    assert "not selected" not in by["memslot-netperf"].reason  # not measurable anyway, for its own reason


def test_a_negligible_computed_effect_is_not_a_speed_up(no_model):
    # The balloon model predicting 0.2 % between bitmap sizes does not carry
    # the seed's "a big bitmap is better" (1.64x).
    prediction = {"predictions": {"seed_breakdown": {"ms": {"array256": 3932.0, "bitmap32768": 1249.1, "bitmap524288": 1246.7}}}}
    rec = Measurement(scenario="balloon.inflate", metric="inflate_s", unit="s", better="lower", samples=[0.8],
                      extra={"model": prediction})
    v = _by_id(claims.evaluate(claims.load(), [rec]))["balloon-bitmap"]
    assert v.verdict == claims.NOT_REPRODUCED
    assert "minimum effect" in v.reason


def test_the_skip_named_like_the_scenario_explains_the_missing_records(no_model):
    skips = [
        claims.Skip("e2e/test_ksm.py:KsmTest.test_merge", "CANCEL", "mem-merge off unsupported"),
        claims.Skip("e2e/test_ksm.py:KsmTest.test_volatile_scan_thp", "CANCEL", "THP is never on this host"),
    ]
    v = _by_id(claims.evaluate(claims.load(), [], skips=skips))["ksm-volatile-thp"]
    assert v.reason.endswith("test_volatile_scan_thp ended CANCEL: THP is never on this host")

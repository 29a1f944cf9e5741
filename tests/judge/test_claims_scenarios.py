"""The KSM and balloon claims' flip tests, fed by the scenarios' own record
builders: host/ksm/volatile.py's ``volatile_records`` (what
e2e/test_ksm.py writes) and host/balloon/request_size.py's
``RequestSizeRun.records`` (what e2e/test_balloon_driver.py writes), given
synthetic raw measurements: scan windows and inflates.  A change in how a
scenario records then reaches these verdicts too."""

from __future__ import annotations

from pathlib import Path

import pytest
from balloon_records import balloon_records
from ksm_volatile_runs import ksm_records

from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import (
    ANALOGUE,
    DIRECTION_ONLY,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    SUCCESSOR,
    Verdict,
)
from memqual.host.ksm import volatile


def _verdict(cid: str, records: list[Measurement]) -> Verdict:
    return {v.claim.id: v for v in evaluate(load(), records)}[cid]


def test_ksm_4k_flips_with_the_measured_speed_up():
    # A skip share of 0.9 is beyond the kernel's 8/9: a synthetic smart scan
    # whose ceiling (10x) leaves the seed's 8x reachable.
    reached = _verdict("ksm-volatile-4k", ksm_records(7.5, skip_share=0.9))
    assert reached.verdict == REPRODUCED and reached.evidence == SUCCESSOR
    short = _verdict("ksm-volatile-4k", ksm_records(4.4, skip_share=0.83))
    assert short.verdict == DIRECTION_ONLY
    slower = _verdict("ksm-volatile-4k", ksm_records(0.8))
    assert slower.verdict == NOT_REPRODUCED and "points the other way" in slower.reason


def test_ksm_thp_flips_with_the_measured_speed_up():
    roomy = volatile.SkipLimit(64, "a synthetic kernel that skips a page up to 64 scans")
    assert (
        _verdict("ksm-volatile-thp", ksm_records(16.0, skip_share=0.97, pages="thp", limit=roomy)).verdict == REPRODUCED
    )
    assert _verdict("ksm-volatile-thp", ksm_records(1.0, pages="thp")).verdict == NOT_REPRODUCED
    # The THP run's records are not the 4 KiB claim's evidence.
    assert _verdict("ksm-volatile-4k", ksm_records(5.0, pages="thp")).verdict == NOT_MEASURABLE


def test_the_ksm_card_shows_smart_scans_own_ceiling_and_says_the_seed_is_out_of_its_reach():
    """At the skip share measured here (73 k of 88 k pages) smart scan cannot
    pass 5.9x per page covered, and no workload lets it pass 9x: the seed's
    8x (band from 6x) is out of reach at this run's skip share, 16x (band
    from 12x) by design."""
    v = _verdict("ksm-volatile-4k", ksm_records(4.4, skip_share=73 / 88))
    assert v.ceiling is not None and v.ceiling.value == pytest.approx(88 / 15, rel=1e-3)
    assert v.ceiling.limit_any_workload == 9.0
    assert "Out of reach at this run's skip share 0.8295, not by design" in v.reason and "5.867x" in v.reason
    assert "whatever the workload it can reach 9x" in v.reason
    thp = _verdict("ksm-volatile-thp", ksm_records(5.5, skip_share=0.885, pages="thp"))
    assert thp.verdict == DIRECTION_ONLY and "Out of reach by design" in thp.reason
    assert "cannot pass 9x" in thp.reason
    # Where the ceiling leaves the band within reach, a short fall is only that.
    near = _verdict("ksm-volatile-4k", ksm_records(5.0, skip_share=0.88))
    assert near.verdict == DIRECTION_ONLY and "Out of reach" not in near.reason
    assert "within its reach" in near.reason
    data = v.to_json()
    assert data["ceiling"]["limit_any_workload"] == 9.0 and data["ceiling"]["limit_source"]


def test_the_ksm_card_records_the_dirtying_regime_beside_the_ratio():
    v = _verdict("ksm-volatile-4k", ksm_records(4.4))
    regime = [b for b in v.beside if "dirty passes" in b.label]
    # 2 dirty passes a second against 4.5 full scans a second.
    assert regime and regime[0].median == pytest.approx(2.0 / 4.5)


def test_the_skip_limit_is_read_from_the_kernel_source_when_it_is_installed(tmp_path: Path):
    (tmp_path / "mm").mkdir()
    (tmp_path / "mm" / "ksm.c").write_text(
        "static unsigned int skip_age(rmap_age_t age)\n{\n\tif (age <= 3)\n\t\treturn 1;\n\treturn 16;\n}\n"
    )
    read = volatile.skip_limit("6.18.0", roots=[tmp_path])
    assert read is not None and read.limit == 16 and str(tmp_path) in read.source
    by_version = volatile.skip_limit("6.18.44-fc", roots=[tmp_path / "absent"])
    assert by_version is not None and by_version.limit == 8 and by_version.ceiling_any_workload == 9.0
    assert volatile.skip_limit("6.1.0-57-amd64", roots=[]) is None


# --------------------------------------------------------------- balloon


# (claim, per-request cost, verdict): the seed's 1.64x and 6.67x, a cost that
# only points the seed's way, and none.
@pytest.mark.parametrize(
    "cid, per_request_s, verdict",
    [
        ("balloon-bitmap", 0.0468, REPRODUCED),
        ("balloon-bitmap", 0.0, NOT_REPRODUCED),
        ("balloon-breakdown", 0.0078, REPRODUCED),
        ("balloon-breakdown", 0.0025, DIRECTION_ONLY),
        ("balloon-breakdown", 0.0, NOT_REPRODUCED),
    ],
)
def test_balloon_claims_flip_with_the_request_cost(cid: str, per_request_s: float, verdict: str):
    v = _verdict(cid, balloon_records(per_request_s))
    assert v.verdict == verdict and v.evidence == ANALOGUE


def test_balloon_verdicts_under_tcg_say_nothing_about_kvm_and_what_would_measure_it():
    v = _verdict("balloon-bitmap", balloon_records(0.0))
    assert v.accelerator == "tcg"
    assert v.qualifier.startswith("under TCG on this host, saying nothing about KVM")
    assert "80 %" in v.qualifier and "memqual run --hosts" in v.qualifier
    assert "not reproduced under TCG on this host" in v.reason
    records = balloon_records(0.0)
    for rec in records:
        rec.environment = {"accel": "kvm"}
    on_kvm = _verdict("balloon-bitmap", records)
    assert on_kvm.verdict == NOT_REPRODUCED and on_kvm.qualifier == "" and "TCG" not in on_kvm.reason
    data = v.to_json()
    assert data["evidence"]["class"] == ANALOGUE and data["qualifier"] == v.qualifier

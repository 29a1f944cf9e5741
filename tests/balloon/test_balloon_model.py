"""Known answers for the balloon transfer-cost model (host/balloon/model.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memqual.host.balloon import model as transfer_model

GIB = transfer_model.GIB_PAGES  # 262144 pages of 4 KiB


def test_array_requests_and_bytes_contiguous():
    t = transfer_model.array_transfer(transfer_model.PfnRanges.contiguous(0, GIB))
    assert (t.requests, t.bytes, t.pages) == (1024, 4 * GIB, GIB)
    assert transfer_model.array_transfer(GIB + 1).requests == 1025  # a partial array is one more request
    assert transfer_model.array_transfer(0).requests == 0


def test_array_ignores_layout():
    scattered = transfer_model.PfnRanges.from_pfns(range(0, 8 * GIB, GIB))
    t = transfer_model.array_transfer(scattered)
    assert (t.pages, t.requests, t.bytes) == (8, 1, 32)


def test_bitmap_contiguous_gib():
    pfns = transfer_model.PfnRanges.contiguous(0, GIB)
    assert transfer_model.bitmap_transfer(pfns, 32 * 1024).requests == 1  # 32 KB covers exactly 1 GiB
    assert transfer_model.bitmap_transfer(pfns, 64 * 1024).requests == 1
    one_more = transfer_model.PfnRanges.contiguous(0, GIB + 1)
    assert transfer_model.bitmap_transfer(one_more, 32 * 1024).requests == 2
    assert transfer_model.bitmap_transfer(one_more, 64 * 1024).requests == 1


def test_bitmap_scattered_one_page_per_gib():
    scattered = transfer_model.PfnRanges.from_pfns(range(0, 8 * GIB, GIB))
    assert [transfer_model.bitmap_transfer(scattered, b).requests for b in transfer_model.SEED_BITMAP_BYTES] == [
        8,
        4,
        1,
    ]
    t = transfer_model.bitmap_transfer(scattered, 32 * 1024)
    assert t.bytes == 8 * (32 * 1024 + 16)  # the seed's bmap_len: bitmap + 2 longs


def test_bitmap_window_base_is_rounded_down_to_a_long():
    # base = 100 // 64 * 64 = 64: [100, 100 + GIB) spills 36 PFNs into a second window
    assert transfer_model.bitmap_windows(transfer_model.PfnRanges.contiguous(100, GIB), 32 * 1024) == 2
    # starting on a long boundary it fits in one
    assert transfer_model.bitmap_windows(transfer_model.PfnRanges.contiguous(128, GIB), 32 * 1024) == 1


def test_bitmap_rejects_odd_sizes_and_handles_empty():
    with pytest.raises(ValueError):
        transfer_model.bitmap_windows(transfer_model.PfnRanges.contiguous(0, 1), 12)
    assert transfer_model.bitmap_transfer(transfer_model.PfnRanges(()), 32 * 1024).requests == 0


def test_ranges_merge_and_count():
    r = transfer_model.PfnRanges.of([(10, 20), (0, 5), (5, 8), (19, 30), (40, 40)])
    assert r.ranges == ((0, 8), (10, 30))
    assert r.pages == 28
    assert transfer_model.PfnRanges.from_pfns([3, 1, 2, 2, 7]).ranges == ((1, 4), (7, 8))
    with pytest.raises(ValueError):
        transfer_model.PfnRanges.of([(5, 1)])


@settings(max_examples=150, deadline=None)
@given(
    st.sets(st.integers(min_value=0, max_value=5000), min_size=1, max_size=200),
    st.sampled_from([8, 16, 64, 128]),
)
def test_bitmap_windows_match_brute_force(pfns, bitmap_bytes):
    span = 8 * bitmap_bytes
    base = min(pfns) // 64 * 64
    expected = len({(p - base) // span for p in pfns})
    assert transfer_model.bitmap_windows(transfer_model.PfnRanges.from_pfns(pfns), bitmap_bytes) == expected


def test_seed_layout_counts():
    pfns = transfer_model.seed_guest_pfns()
    assert pfns.pages == 15 * GIB
    assert pfns.ranges == ((GIB, 3 * GIB), (4 * GIB, 17 * GIB))
    schemes = {t.scheme: t for t in transfer_model.seed_schemes(pfns)}
    assert schemes["array256"].requests == 15 * GIB // 256 == 15360
    # 1 GiB windows from 1 GiB: 2 below the hole, 13 above; 2 GiB: 1 + 1 + 6; 16 GiB: 1
    assert [schemes[f"bitmap{b}"].requests for b in transfer_model.SEED_BITMAP_BYTES] == [15, 8, 1]


def test_seed_implied_per_request_cost():
    # slope of (15, 2.031) (8, 1.507) (1, 1.237): 5.558/98 s per request
    assert transfer_model.seed_implied_per_window_s() == pytest.approx(5.558 / 98, rel=1e-9)
    assert transfer_model.seed_gbps(2031) == pytest.approx(15 * 2**30 / 2.031 / 1e9)


def test_calibration_from_full_arrays_is_not_identifiable():
    obs = [transfer_model.Observation.of_array_inflate(p, 0.03 + p * 4e-6) for p in (65536, 131072, 196608)]
    cal = transfer_model.calibrate(obs)
    assert not cal.identifiable
    assert cal.per_request_s is None and cal.per_page_s is None
    assert "not identifiable" in cal.reason
    assert cal.combined_per_page_s == pytest.approx(4e-6)
    assert cal.fixed_s == pytest.approx(0.03, abs=1e-9)


def test_calibration_recovers_known_costs_when_requests_vary():
    c_req, c_page, fixed = 20e-6, 1e-6, 0.01
    shapes = [(65536, 256), (65536, 2048), (131072, 512), (131072, 4096), (262144, 1024)]
    obs = [transfer_model.Observation(p, r, fixed + r * c_req + p * c_page) for p, r in shapes]
    cal = transfer_model.calibrate(obs)
    assert cal.identifiable
    assert cal.per_request_s == pytest.approx(c_req, rel=1e-6)
    assert cal.per_page_s == pytest.approx(c_page, rel=1e-6)
    assert cal.fixed_s == pytest.approx(fixed, rel=1e-6)


def test_calibration_never_returns_a_negative_cost():
    # noisy points whose unconstrained intercept would be below zero
    obs = [transfer_model.Observation.of_array_inflate(p, t) for p, t in ((50000, 0.2), (100000, 1.0), (200000, 2.4))]
    cal = transfer_model.calibrate(obs)
    assert cal.fixed_s == 0.0 and cal.combined_per_page_s > 0


def test_calibration_needs_two_sizes():
    with pytest.raises(ValueError):
        transfer_model.calibrate([transfer_model.Observation.of_array_inflate(65536, 0.3)] * 3)


def test_prediction_bounds_and_seed_side_by_side():
    cal = transfer_model.calibrate(
        [transfer_model.Observation.of_array_inflate(p, p * 4e-6) for p in (65536, 131072, 196608)]
    )
    pred = transfer_model.predict_seed(cal)
    preds = pred["predictions"]
    assert set(preds) == {"all_per_page", "all_per_request", "seed_breakdown"}
    # all per page: the bitmap size cannot matter
    assert preds["all_per_page"]["speedup_vs_32k"]["bitmap524288"] == pytest.approx(1.0)
    # all per request (no fixed cost): time proportional to requests, 15 -> 1
    assert preds["all_per_request"]["speedup_vs_32k"]["bitmap524288"] == pytest.approx(15.0, rel=1e-6)
    assert preds["all_per_request"]["speedup_vs_array"]["bitmap32768"] == pytest.approx(15360 / 15)
    assert pred["seed_ms"] == {"bitmap32768": 2031.0, "bitmap65536": 1507.0, "bitmap524288": 1237.0}
    assert pred["seed_speedup_vs_32k"]["bitmap524288"] == pytest.approx(2031 / 1237)
    rows = transfer_model.side_by_side(pred)
    assert [r[0] for r in rows] == ["array256", "bitmap32768", "bitmap65536", "bitmap524288"]
    assert rows[1][1] == "2031" and rows[3][1] == "1237"
    total_ms = 1000 * 15 * GIB * 4e-6
    assert preds["all_per_page"]["ms"]["array256"] == pytest.approx(total_ms)
    assert math.isfinite(pred["seed_implied_per_request_ms"])

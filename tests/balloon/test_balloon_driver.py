"""The balloon driver variant without a guest: request sizes,
the plan, the driver's counters, the fit, the package names, the patch, the
deployment against a fake guest, and the records' shape the claims need."""

from __future__ import annotations

import itertools
import math
import random
import re

import numpy as np
import pytest
from fake_balloon_driver import FakeController, FakeGuest, Moved

from memqual.host.balloon import driver as bd
from memqual.host.balloon import measure as bmeas
from memqual.host.balloon import request_size as rs
from memqual.host.core.errors import BadInput, GuestError
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import ANALOGUE, NOT_REPRODUCED, REPRODUCED
from memqual.images import balloon_driver as build


@pytest.mark.parametrize("bad", [0, -1, bd.PFNS_MAX + 1, "256", 2.5])
def test_sizes_the_driver_refuses_are_refused_before_boot(bad):
    with pytest.raises(BadInput, match="PFNs per request"):
        bd.check_pfns(bad)


@pytest.mark.parametrize("good", [1, 256, 262144, bd.PFNS_MAX])
def test_sizes_the_driver_takes(good):
    assert bd.check_pfns(good) == good


def test_request_sizes_scale_the_seeds_bitmaps_to_the_guest():
    assert rs.request_sizes(1024) == {"256 pfns": 256, "1/16 guest": 16384, "1/8 guest": 32768, "whole guest": 262144}
    # In the seed's 16 GiB guest they are exactly its bitmaps' coverage (8 PFNs a byte).
    seed = rs.request_sizes(16 * 1024)
    assert (seed["1/16 guest"], seed["1/8 guest"], seed["whole guest"]) == (32768 * 8, 65536 * 8, 524288 * 8)


def test_the_full_profile_covers_every_size_of_the_curve_with_explicit_labels():
    full = rs.request_sizes(1024, curve=True)
    assert sorted(full.values()) == [256, 1024, 4096, 16384, 32768, 65536, 262144]
    assert list(full.values()) == sorted(full.values())  # records and checks go smallest first
    # In a 1 GiB guest 16384 and 262144 PFNs are the seed's 32 KB and 512 KB bitmaps scaled:
    # they keep the labels the claims pair.
    assert full["1/16 guest"] == 16384 and full["whole guest"] == 262144 and full["65536 pfns"] == 65536
    two = rs.request_sizes(2048, curve=True)
    assert two["262144 pfns"] == 262144 and two["whole guest"] == 524288 and two["1/16 guest"] == 32768
    assert set(rs.request_sizes(1024)) < set(full)


def test_interleaved_puts_every_size_in_every_position():
    labels = list(rs.request_sizes(1024))
    orders = [rs.interleaved(labels, g) for g in range(len(labels))]
    assert all(sorted(o) == sorted(labels) for o in orders)
    for position in range(len(labels)):
        assert {o[position] for o in orders} == set(labels)


TIMING = """inflate requests=768 pfns=196608 alloc_ns=4000 wait_ns=700 total_ns=4900 span_ns=5000
deflate requests=768 pfns=196608 alloc_ns=0 wait_ns=80 total_ns=290 span_ns=300
"""


def test_the_drivers_counters_are_parsed_and_broken_down():
    t = bd.parse_timing(TIMING)
    assert t["inflate"].requests == 768 and t["inflate"].pfns == 196608
    share = t["inflate"].breakdown()
    assert share == pytest.approx({"alloc_pct": 80.0, "host_wait_pct": 14.0, "rest_pct": 4.0, "between_calls_pct": 2.0})
    assert sum(share.values()) == pytest.approx(100.0)
    with pytest.raises(GuestError):
        bd.parse_timing("inflate requests=1\n")


def _inflates(fixed, per_request, per_page, guests=4, noise=0.0, seed=1):
    rng = random.Random(seed)
    rows = []
    for g in range(guests):
        offset = rng.gauss(0, noise)
        for pages, pfns in ((196608, 256), (196608, 16384), (196608, 262144), (98304, 256), (98304, 262144)):
            requests = rs.requests_for(pages, pfns)
            seconds = fixed + requests * per_request + pages * per_page + offset + rng.gauss(0, noise / 4)
            rows.append(rs.Inflate(g, pages, requests, seconds))
    return rows


def test_the_fit_recovers_known_costs_and_its_interval_holds_them():
    exact = rs.fit_costs(_inflates(0.2, 300e-6, 12e-6), resamples=200)
    assert exact["per_request_s"]["value"] == pytest.approx(300e-6, rel=1e-6)
    assert exact["per_page_s"]["value"] == pytest.approx(12e-6, rel=1e-6)
    assert exact["fixed_s"]["value"] == pytest.approx(0.2, rel=1e-6)
    noisy = rs.fit_costs(_inflates(0.2, 300e-6, 12e-6, guests=8, noise=0.05), resamples=500)
    for key, truth in (("per_request_s", 300e-6), ("per_page_s", 12e-6)):
        assert noisy[key]["low"] <= truth <= noisy[key]["high"]
    assert noisy["n_guests"] == 8


def _least_squares(rows):
    a = np.array([[1.0, r.requests, r.pages] for r in rows])
    scale = np.linalg.norm(a, axis=0)
    coef, *_ = np.linalg.lstsq(a / scale, np.array([r.seconds for r in rows]), rcond=None)
    return coef / scale


def _refit_every_resample(rows, resamples, seed):
    """The bootstrap's draws as fit_costs made them before it kept each
    distinct draw's fit: one least-squares fit per resample."""
    rng = random.Random(seed)
    guests = sorted({r.guest for r in rows})
    draws = []
    for _ in range(resamples):
        sample = [r for g in rng.choices(guests, k=len(guests)) for r in rows if r.guest == g]
        if np.linalg.matrix_rank(np.array([[1.0, r.requests, r.pages] for r in sample])) == 3:
            draws.append(_least_squares(sample))
    return draws


@pytest.mark.parametrize("guests", [1, 2, 3])
def test_the_intervals_are_those_of_refitting_every_resample(guests):
    rows = _inflates(0.2, 300e-6, 12e-6, guests=guests, noise=0.05)
    fit = rs.fit_costs(rows, resamples=300, seed=7)
    draws = _refit_every_resample(rows, 300, 7)
    for i, key in enumerate(("fixed_s", "per_request_s", "per_page_s")):
        values = sorted(float(d[i]) for d in draws)
        assert fit[key]["low"] == values[int(0.025 * (len(values) - 1))]
        assert fit[key]["high"] == values[int(math.ceil(0.975 * (len(values) - 1)))]


def test_the_fit_refuses_inflates_that_cannot_separate_the_costs():
    same_size = [rs.Inflate(g, 196608, rs.requests_for(196608, p), 2.0) for g in range(3) for p in (256, 262144)]
    with pytest.raises(ValueError):
        rs.fit_costs(same_size)
    stock_only = [rs.Inflate(g, n, rs.requests_for(n, 256), n * 1e-5) for g in range(3) for n in (98304, 196608)]
    with pytest.raises(ValueError):
        rs.fit_costs(stock_only)


def test_debian_package_names_of_a_kernel():
    assert build.package_names("6.1.0-57-amd64", "6.1.192-3") == {
        "source": "linux-source-6.1",
        "headers": "linux-headers-6.1.0-57-amd64",
        "common": "linux-headers-6.1.0-57-common",
        "kbuild": "linux-kbuild-6.1",
    }
    assert (
        build.package_names("6.12.38+deb13-cloud-amd64", "6.12.38-1")["common"] == "linux-headers-6.12.38+deb13-common"
    )
    assert build.package_names("6.1.0-57-cloud-amd64", "6.1.192-3")["common"] == "linux-headers-6.1.0-57-common"
    with pytest.raises(BadInput):
        build.package_names("6.1.0", "6.1.192-3")


def test_the_patch_changes_one_file_and_renames_nothing_of_the_kernel():
    text = build.PATCH.read_text()
    assert re.findall(r"^\+\+\+ (\S+)", text, re.M) == ["b/virtio_balloon_mq.c"]
    assert "module_param_cb(pfns_per_request" in text and "kvmalloc_array(pfns_per_request" in text
    assert "KMALLOC_MAX_SIZE" in text  # the ceiling, and where it comes from
    assert 'MODULE_DESCRIPTION("Virtio balloon driver, memqual variant' in text


def test_a_refused_size_fails_at_load_with_the_drivers_line():
    guest = FakeGuest()
    driver = bd.VariantDriver(guest, FakeController(guest), "ko")
    with pytest.raises(BadInput, match="refused pfns_per_request=0: virtio_balloon_mq: pfns_per_request=0 refused"):
        driver.load(0)
    assert driver.loaded is None


def test_load_checks_the_variant_drives_the_balloon_then_the_stock_driver_returns():
    guest = FakeGuest()
    driver = bd.VariantDriver(guest, FakeController(guest), "ko")
    driver.deploy()
    line = driver.load(16384)
    assert "16384 PFNs per request" in line and driver.loaded == 16384
    assert driver.taint is not None and bd.taint_flags(driver.taint) == "O (out-of-tree), E (unsigned)"
    assert any(c.startswith("rmmod virtio_balloon_mq") and "rmmod virtio_balloon " in c for c in guest.commands)
    driver.restore_stock()
    assert guest.module == "virtio_balloon" and driver.loaded is None


def test_a_variant_that_does_not_move_the_balloon_is_caught():
    guest = FakeGuest()

    class Stuck(FakeController):
        def reach(self, target, deadline_s=60.0):
            return Moved(self.ram_bytes())  # QMP says reached, but the driver counted nothing

    with pytest.raises(GuestError, match="does not drive the balloon"):
        bd.VariantDriver(guest, Stuck(guest), "ko").load(256)


# -- records in the scenario's shape pair up in the claims ------------------
def _records(whole_s: float, small_s: float, stock_s: float) -> list[Measurement]:
    settings = {"guest_mib": 1024, "target_mib": 256, "machine": "pc", "profile": "quick"}
    rng = random.Random(3)
    out = []
    for label, level in (
        ("whole guest", whole_s),
        ("1/16 guest", small_s),
        ("1/8 guest", small_s),
        ("256 pfns", stock_s),
    ):
        out.append(
            Measurement(
                scenario="balloon.request_size",
                metric="inflate_s",
                unit="s",
                better="lower",
                replicates=[[level * (1 + rng.gauss(0, 0.01))] for _ in range(4)],
                samples=[],
                variant={"per_request": label},
                settings=settings,
                extra={"pfns_per_request": rs.request_sizes(1024)[label]},
            )
        )
    out.append(
        Measurement(
            scenario="balloon.request_size",
            metric="host_wait_share",
            unit="%",
            better="lower",
            replicates=[[14.0], [12.0], [13.0]],
            samples=[],
            variant={"per_request": "256 pfns"},
            settings=settings,
        )
    )
    return out


def test_the_scenarios_records_give_analogue_verdicts_that_move_with_them():
    registry = load()

    def verdict(cid, records):
        (v,) = [v for v in evaluate(registry, records) if v.claim.id == cid]
        return v

    flat = _records(2.0, 2.0, 2.0)
    for cid in ("balloon-bitmap", "balloon-breakdown"):
        v = verdict(cid, flat)
        assert v.evidence == ANALOGUE  # PFN arrays of the seed's shares, not its bitmap
        assert v.verdict == NOT_REPRODUCED
    assert verdict("balloon-bitmap", _records(1.0, 1.64, 2.0)).verdict == REPRODUCED
    assert verdict("balloon-breakdown", _records(1.0, 1.64, 6.67)).verdict == REPRODUCED


def test_qemu_cpu_seconds_count_a_process_threads_work():
    import os

    before = bd.qemu_cpu_s(os.getpid())
    deadline = before + 0.05
    while bd.qemu_cpu_s(os.getpid()) < deadline:
        sum(range(10000))
    assert bd.qemu_cpu_s(os.getpid()) - before >= 0.05


# -- memqual balloon measure --pfns-per-request -------------------------------
def test_sizes_on_the_command_line():
    assert bmeas.parse_sizes("256,262144,256") == [256, 262144]
    for bad in ("", "0", "256,abc", str(bd.PFNS_MAX + 1)):
        with pytest.raises(BadInput):
            bmeas.parse_sizes(bad)


@pytest.mark.parametrize("sizes", ["0", "256,x", "2000000"])
def test_cli_refuses_bad_sizes_before_building_or_booting(monkeypatch, sizes):
    from test_balloon_controller import run_cli

    def must_not_run(*args, **kwargs):
        raise AssertionError("built or booted despite bad input")

    monkeypatch.setattr("memqual.images.build.build", must_not_run)
    monkeypatch.setattr(bmeas, "measure", must_not_run)
    monkeypatch.setattr(bmeas, "measure_sizes", must_not_run)
    assert run_cli(["balloon", "measure", "--memory", "1024", "--target", "256", "--pfns-per-request", sizes]) == 2


# -- a whole run's records from known costs ------------------------------------
def _sample(guest, label, pfns, size_bytes, fixed, per_request, per_page, rng):
    from memqual.host.balloon.device import BalloonResult

    pages = size_bytes // bd.PAGE
    requests = rs.requests_for(pages, pfns)

    def moved(seconds):
        return BalloonResult(0, 0, 0, 0, True, False, seconds, 0.001, 10, 0.01)

    up = fixed + requests * per_request + pages * per_page + rng.gauss(0, 1e-3)
    down = fixed / 2 + requests * per_request / 2 + pages * per_page / 4 + rng.gauss(0, 1e-3)
    # The driver's span on the guest's clock: 80 % of the host's window.
    timing = bd.DirectionTiming(requests, pages, 10, 5, 20, int(0.8 * up * 1e9))
    return rs.Sample(guest, label, size_bytes, "", moved(up), 1.0, timing, moved(down), timing)


def test_a_run_records_every_size_both_ways_and_both_fits_with_intervals():
    sizes = rs.request_sizes(1024, curve=True)
    inflate_bytes = 768 << 20
    run = rs.RequestSizeRun(sizes, inflate_bytes)
    rng = random.Random(5)
    for g in range(4):
        run.add_guest(
            [
                _sample(g, label, sizes[label], size, 0.5, 2e-3, 20e-6, rng)
                for label, size in rs.guest_plan(list(sizes), g, inflate_bytes)
            ]
        )
    assert [len(v) for v in run.per_guest_fit.values()] == [4, 4, 4, 4]
    fits = run.fits()
    assert fits.inflate["per_request_s"]["value"] == pytest.approx(2e-3, rel=0.05)
    assert fits.deflate["per_page_s"]["value"] == pytest.approx(5e-6, rel=0.05)
    assert fits.driver["per_page_s"]["value"] == pytest.approx(0.8 * 20e-6, rel=0.05)
    records = run.records({"guest_mib": 1024}, {}, "", 12288, fits)
    by_metric: dict[str, list[Measurement]] = {}
    for m in records:
        by_metric.setdefault(m.metric, []).append(m)
    assert [m.metric for m in records] == [*rs.SIZE_METRICS * len(sizes), *(r[0] for r in rs.FIT_RECORDS)]
    for metric in rs.SIZE_METRICS:
        assert [m.variant for m in by_metric[metric]] == [{"per_request": k, "pfns": v} for k, v in sizes.items()]
        assert all(m.n_replicates == 4 for m in by_metric[metric])
    for metric, measure, *_ in rs.FIT_RECORDS:
        (m,) = by_metric[metric]
        assert m.extra["measure"] == measure and m.n_replicates == 4
        assert m.extra["low"] <= m.extra["value"] <= m.extra["high"]
    assert by_metric["per_request_us"][0].extra["value"] == pytest.approx(2000, rel=0.05)
    assert run.requests(0, "deflate")["256 pfns"] == 768 and run.requests(0)["whole guest"] == 1


def test_the_stall_window_follows_the_clock(monkeypatch):
    from memqual.host.core import clock

    wall = rs.stall_s(16384)
    monkeypatch.setattr(clock, "current", lambda: clock.icount())
    assert rs.stall_s(16384) == pytest.approx(wall * clock.ICOUNT_WALL_FACTOR)


def test_the_stall_window_outlasts_one_request_at_every_size():
    # A 65536-PFN request took over 3 s at load average 6: the window must
    # outlast that, and the stock size keeps the plain 3 s.
    assert rs.stall_s(256) == pytest.approx(rs.INFLATE_STALL_S + 256 * rs.STALL_S_PER_PFN)
    assert rs.stall_s(65536) > 6.0 and rs.stall_s(256) < 3.1
    assert all(rs.stall_s(a) < rs.stall_s(b) for a, b in itertools.pairwise(rs.CURVE_PFNS))

"""Balloon request-size records made through the scenario's own code, with a
request cost the test chooses."""

from __future__ import annotations

import numpy as np

from memqual.host.balloon import request_size as rs
from memqual.host.balloon.device import PAGE, BalloonResult
from memqual.host.balloon.driver import DirectionTiming
from memqual.host.balloon.table import REQUEST_SIZE
from memqual.host.core import profiles
from memqual.host.core.record import Measurement

GUEST_MIB = 1024
INFLATE_BYTES = 768 << 20


def direction_timing(requests: int, pages: int, seconds: float) -> DirectionTiming:
    span = int(seconds * 1e9)
    return DirectionTiming(requests, pages, span // 5, span // 2, span, span)


def balloon_move(seconds: float, size: int) -> BalloonResult:
    return BalloonResult(size, size, 0, size, True, False, seconds, 0.01, 20, 0.01)


def balloon_records(
    per_request_s: float, n: int = REQUEST_SIZE.sizes_for(profiles.QUICK).guests, seed: int = 5
) -> list[Measurement]:
    """n fresh guests inflating at every size of the quick profile; an
    inflate takes fixed + requests x ``per_request_s`` + pages x 5 us
    (each guest as slow as its host minute, each inflate with its own
    noise), through the scenario's own run and records."""
    rng = np.random.default_rng(seed)
    sizes = rs.request_sizes(GUEST_MIB)
    run = rs.RequestSizeRun(sizes, INFLATE_BYTES)
    for g in range(n):
        load = float(np.exp(rng.normal(0, 0.15)))
        samples = []
        for label, size in rs.guest_plan(list(sizes), g, INFLATE_BYTES):
            pages = size // PAGE
            requests = rs.requests_for(pages, sizes[label])
            seconds = load * (0.05 + requests * per_request_s + pages * 5e-6) * float(np.exp(rng.normal(0, 0.02)))
            timing = direction_timing(requests, pages, seconds)
            move = balloon_move(seconds, size)
            samples.append(rs.Sample(g, label, size, "probe", move, seconds / 2, timing, move, timing))
        run.add_guest(samples)
    records = run.records({"profile": "quick", "guest_mib": GUEST_MIB}, {"variant": "synthetic"}, "probe", 0)
    for rec in records:
        rec.environment = {"accel": "tcg"}  # as e2e/base.py's record() adds it: this host runs Linux under TCG
    return records

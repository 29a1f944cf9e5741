"""The request-size experiment: seed 003 on the driver variant
(e2e/test_balloon_driver.py).

Per fresh guest, the variant at each request size in a rotated order, plus
one half-size inflate; each step's inflate and deflate timed by QMP, with
QEMU's CPU seconds and the driver's counters (``Sample``); records per size
and the fit ``seconds = fixed + requests x per_request + pages x per_page``
with intervals over guests.  docs/balloon.md, "The driver variant"."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from memqual.host.balloon import model as transfer_model
from memqual.host.balloon.device import PAGE, BalloonResult
from memqual.host.balloon.driver import STOCK_PFNS, DirectionTiming, VariantDriver, qemu_cpu_s, taint_flags
from memqual.host.balloon.host_share import HostWork, QemuThreads
from memqual.host.balloon.timed_move import BalloonMover
from memqual.host.core import clock, descriptive
from memqual.host.core.record import Measurement

SCENARIO = "balloon.request_size"
# A loaded host can starve a vCPU this long mid-inflate; the scenario's
# targets are far above the floor, so a stall is not expected.
INFLATE_STALL_S = 3.0
# QMP sees nothing of a request until the host has it, so ``actual`` moves
# in steps of a whole request: a 65536-PFN request took over 3 s at load
# average 6 here (alloc 25-40 us a page under TCG).  The stall window grows
# with the request by this much a page, so only a request that could not
# still be in flight reads as a stall.
STALL_S_PER_PFN = 60e-6


def stall_s(pfns: int) -> float:
    """The stall window of an inflate at ``pfns`` per request, on the run's
    clock: a request in flight takes the guest's work, which icount runs
    that much slower (clock.deadline_s; a 16384-PFN request outlasted its
    wall window of 4 s there at load 17)."""
    return clock.deadline_s(INFLATE_STALL_S + pfns * STALL_S_PER_PFN)


# -- plan ------------------------------------------------------------------
# Fresh guests (the independent units; each measures every size, so the
# claims pair them) come from the scenario's row (host/balloon/table.py).
# The seed's three bitmaps by the share of the guest one request covers: a
# 32 KB bitmap covers 1 GB of its 16 GB guest (1/16), 64 KB 1/8, 512 KB all
# of it.  Scaled to the guest, these labels are what the claims pair.
SEED_BITMAPS = {"1/16 guest": 16, "1/8 guest": 8, "whole guest": 1}
# The curve's absolute sizes: 256 (the stock array) to 262144 (1 GiB of
# 4 KiB pages, the seed's 32 KB bitmap in one request), each x4.
CURVE_PFNS = (256, 1024, 4096, 16384, 65536, 262144)


def request_sizes(guest_mib: int, curve: bool = False) -> dict[str, int]:
    """Label -> PFNs per request, smallest first: the stock 256 and the
    seed's three bitmaps scaled to this guest; with ``curve`` also every size of
    ``CURVE_PFNS`` up to the whole guest; a size equal to a scaled bitmap
    keeps the bitmap's label (in a 1 GiB guest 16384 is "1/16 guest" and
    262144 "whole guest"), the others are labelled "<N> pfns"."""
    pages = guest_mib * (1 << 20) // PAGE
    sizes = {"256 pfns": STOCK_PFNS, **{label: pages // share for label, share in SEED_BITMAPS.items()}}
    if curve:
        taken = set(sizes.values())
        sizes.update({f"{n} pfns": n for n in CURVE_PFNS if n not in taken and n <= pages})
    return dict(sorted(sizes.items(), key=lambda item: item[1]))


def interleaved(labels: Sequence[str], guest_index: int) -> list[str]:
    """The sizes in an order rotated per guest, so no size always runs
    first in a fresh guest or last in a tired host minute."""
    k = guest_index % len(labels)
    return list(labels[k:]) + list(labels[:k])


def guest_plan(labels: Sequence[str], guest_index: int, inflate_bytes: int) -> list[tuple[str, int]]:
    """(size label, bytes to inflate) for one fresh guest: every size at the
    full inflate, then a half-size inflate alternating between the two
    extremes."""
    steps = [(k, inflate_bytes) for k in interleaved(labels, guest_index)]
    steps.append(("256 pfns" if guest_index % 2 == 0 else "whole guest", inflate_bytes // 2))
    return steps


# -- measure ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Sample:
    """One inflate and deflate with the variant loaded.  ``inflate`` and the
    deflate's fields are None when the inflate did not reach its target."""

    guest: int
    label: str
    size_bytes: int
    probe_line: str
    up: BalloonResult
    qemu_cpu_s: float  # QEMU's CPU seconds over the inflate
    inflate: DirectionTiming | None = None
    down: BalloonResult | None = None
    deflate: DirectionTiming | None = None
    # On a host under test: the host's work over the inflate, by thread kind
    host_work: HostWork | None = None

    @property
    def pages(self) -> int:
        return self.size_bytes // PAGE

    @property
    def inflate_s(self) -> float:
        """The inflate's time: QMP's view from this machine; on a host under
        test the driver's span, on L1's clock (this machine's clock there
        reads L1's emulation, and the move waited on 1 s events)."""
        if self.host_work is not None and self.inflate is not None:
            return self.inflate.span_ns / 1e9
        return self.up.seconds

    @property
    def deflate_s(self) -> float:
        """The deflate's time, as ``inflate_s``."""
        assert self.down is not None
        if self.host_work is not None and self.deflate is not None:
            return self.deflate.span_ns / 1e9
        return self.down.seconds


def measure_inflate(
    vm: Any,
    mover: BalloonMover,
    driver: VariantDriver,
    guest: int,
    label: str,
    pfns: int,
    size_bytes: int,
    host: QemuThreads | None = None,
) -> Sample:
    """Load the variant at ``pfns`` per request, inflate ``size_bytes``, read
    the driver's counters, deflate back.  ``host``: the guest's QEMU in a
    host under test, whose threads give QEMU's CPU seconds and the host's
    work on L1's clock (this machine's QEMU is then L1's, all of it)."""
    probe_line = driver.load(pfns)
    ram = mover.ctl.ram_bytes()
    if host is not None:
        before = host.read()
        up = mover.move(ram - size_bytes, stall_s=stall_s(pfns)).host
        after = host.read()
        sample = Sample(
            guest, label, size_bytes, probe_line, up, after.run_s - before.run_s, host_work=after.minus(before)
        )
    else:
        cpu0 = qemu_cpu_s(vm.pid)
        up = mover.move(ram - size_bytes, stall_s=stall_s(pfns)).host
        sample = Sample(guest, label, size_bytes, probe_line, up, qemu_cpu_s(vm.pid) - cpu0)
    if not up.reached:
        return sample
    inflate = driver.timing()["inflate"]
    down = mover.move(ram, stall_s=stall_s(pfns)).host
    deflate = driver.timing()["deflate"] if down.reached else None
    return dataclasses.replace(sample, inflate=inflate, down=down, deflate=deflate)


# -- the fit ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Inflate:
    guest: int  # index of the fresh guest (the independent unit)
    pages: int
    requests: int
    seconds: float


def _ols(rows: Sequence[Inflate]) -> np.ndarray:
    a = np.array([[1.0, r.requests, r.pages] for r in rows])
    y = np.array([r.seconds for r in rows])
    scale = np.linalg.norm(a, axis=0)
    coef, *_ = np.linalg.lstsq(a / scale, y, rcond=None)
    return coef / scale


def _resample_fit(sample: Sequence[Inflate]) -> np.ndarray | None:
    """The fit of one resample, or None where its sizes and request counts
    cannot tell the three costs apart."""
    b = np.array([[1.0, r.requests, r.pages] for r in sample])
    return _ols(sample) if np.linalg.matrix_rank(b) == 3 else None


def fit_costs(rows: Sequence[Inflate], resamples: int = 2000, seed: int = 12) -> dict[str, Any]:
    """seconds = fixed + requests x per_request + pages x per_page, least
    squares; 95 % intervals by resampling whole guests (the independent
    units) with replacement and refitting."""
    if len({r.pages for r in rows}) < 2 or len({r.requests for r in rows}) < 2:
        raise ValueError("the fit needs inflates of two sizes and two request counts")
    a = np.array([[1.0, r.requests, r.pages] for r in rows])
    if np.linalg.matrix_rank(a) < 3:
        raise ValueError("requests and pages move together: the costs are not identifiable")
    point = _ols(rows)
    guests = sorted({r.guest for r in rows})
    by_guest = {g: [r for r in rows if r.guest == g] for g in guests}
    rng = random.Random(seed)
    draws = []
    # Few guests draw few distinct samples (1 guest: one; 3: 27 orders), so
    # each is fitted once: the same rows in the same order give the same
    # numbers.  The refits were most of the CPU of a record's fits (2000
    # resamples x 4 fits, 0.9 s for 3 guests, 0.1 s with this).
    fitted: dict[tuple[int, ...], np.ndarray | None] = {}
    for _ in range(resamples):
        drawn = tuple(rng.choices(guests, k=len(guests)))
        if drawn not in fitted:
            fitted[drawn] = _resample_fit([r for g in drawn for r in by_guest[g]])
        fit = fitted[drawn]
        if fit is not None:
            draws.append(fit)
    residual = np.array([r.seconds for r in rows]) - a @ point
    out: dict[str, Any] = {
        "n_inflates": len(rows),
        "n_guests": len(guests),
        "residual_rms_s": float(np.sqrt(np.mean(residual**2))),
        "ci": "95 %, percentile bootstrap over guests" + (" (few guests: coarse)" if len(guests) < 5 else ""),
    }
    for i, name in enumerate(("fixed_s", "per_request_s", "per_page_s")):
        values = sorted(float(d[i]) for d in draws)
        low = values[int(0.025 * (len(values) - 1))] if values else math.nan
        high = values[int(math.ceil(0.975 * (len(values) - 1)))] if values else math.nan
        out[name] = {"value": float(point[i]), "low": low, "high": high}
    return out


def requests_for(pages: int, pfns: int) -> int:
    return math.ceil(pages / pfns)


# -- record ----------------------------------------------------------------
COST_KEYS = ("fixed_s", "per_request_s", "per_page_s")
# Per size, in this order: host-timed inflate, the driver's share waiting
# for the host, QEMU's CPU seconds over the inflate, host-timed deflate.
SIZE_METRICS = ("inflate_s", "host_wait_share", "qemu_cpu_s", "deflate_s")
# Per size, on a host under test only: the host's share of the driver's span.
HOST_METRICS = ("host_share",)


def size_metrics(on_host: bool) -> tuple[str, ...]:
    """The metrics recorded per size, in order."""
    return SIZE_METRICS + HOST_METRICS if on_host else SIZE_METRICS


# (metric, measure, cost key, factor to the unit, unit): the fitted costs
# recorded, each guest's own fit its replicate.  QEMU's CPU seconds are
# what a loaded shared host leaves measurable: wall time there carries
# every other guest's load (docs/balloon.md).
FIT_RECORDS = (
    ("per_request_us", "inflate", "per_request_s", 1e6, "us"),
    ("per_page_ns", "inflate", "per_page_s", 1e9, "ns"),
    ("qemu_cpu_per_request_us", "qemu_cpu", "per_request_s", 1e6, "us"),
    ("qemu_cpu_per_page_ns", "qemu_cpu", "per_page_s", 1e9, "ns"),
    ("deflate_per_request_us", "deflate", "per_request_s", 1e6, "us"),
    ("deflate_per_page_ns", "deflate", "per_page_s", 1e9, "ns"),
    # The same fit on the driver's own span (its first request's page
    # allocation to its last ack), read with the guest's clock: on the
    # icount clock a count of guest instructions, which the host's load
    # does not reach (the row in table.py: what decides the primary
    # there).
    ("driver_per_page_ns", "driver", "per_page_s", 1e9, "ns"),
)


@dataclasses.dataclass(frozen=True)
class Fits:
    """The same fit on five measures of the same moves: host-timed inflate
    seconds, the driver's wait for the host alone (QEMU's side: per request
    the kick and exit, per page the discard), QEMU's CPU seconds (robust to
    other guests' load), host-timed deflate seconds, and the driver's
    whole span on the guest's clock."""

    inflate: dict[str, Any]
    host_wait: dict[str, Any]
    qemu_cpu: dict[str, Any]
    deflate: dict[str, Any]
    driver: dict[str, Any]


@dataclasses.dataclass
class RequestSizeRun:
    """The samples of every guest, and the run's records."""

    sizes: dict[str, int]  # label -> PFNs per request
    inflate_bytes: int  # the full inflate
    samples: list[Sample] = dataclasses.field(default_factory=list)
    # measure -> each guest's own fit (its cost keys), one per guest
    per_guest_fit: dict[str, list[dict[str, float]]] = dataclasses.field(
        default_factory=lambda: {"inflate": [], "qemu_cpu": [], "deflate": [], "driver": []}
    )

    def add_guest(self, samples: list[Sample]) -> None:
        """One guest's samples, and its own fits when they can be made."""
        self.samples += samples
        for measure, rows in (
            ("inflate", self.rows(samples)),
            ("qemu_cpu", self.cpu_rows(samples)),
            ("deflate", self.deflate_rows(samples)),
            ("driver", self.driver_rows(samples)),
        ):
            try:
                fit = fit_costs(rows, resamples=0)
            except ValueError:
                continue
            self.per_guest_fit[measure].append({k: fit[k]["value"] for k in COST_KEYS})

    @staticmethod
    def rows(samples: Sequence[Sample]) -> list[Inflate]:
        """Host-timed seconds of every inflate."""
        return [Inflate(s.guest, s.pages, i.requests, s.inflate_s) for s in samples if (i := s.inflate)]

    @staticmethod
    def cpu_rows(samples: Sequence[Sample]) -> list[Inflate]:
        """QEMU's CPU seconds over every inflate."""
        return [Inflate(s.guest, s.pages, i.requests, s.qemu_cpu_s) for s in samples if (i := s.inflate)]

    @staticmethod
    def driver_rows(samples: Sequence[Sample]) -> list[Inflate]:
        """The driver's span of every inflate, on the guest's clock."""
        return [Inflate(s.guest, s.pages, i.requests, i.span_ns / 1e9) for s in samples if (i := s.inflate)]

    @staticmethod
    def deflate_rows(samples: Sequence[Sample]) -> list[Inflate]:
        """Host-timed seconds of every deflate (the variant leaks at most
        its PFNs per request in one request, as it fills)."""
        return [
            Inflate(s.guest, s.pages, d.requests, s.deflate_s)
            for s in samples
            if (d := s.deflate) and (down := s.down) and down.reached
        ]

    def full(self, label: str) -> list[Sample]:
        """The full-size inflates at one size, in guest order."""
        return [s for s in self.samples if s.label == label and s.size_bytes == self.inflate_bytes]

    def requests(self, guest: int, direction: str = "inflate") -> dict[str, int]:
        """Requests each size sent for the full move in one guest."""
        out = {}
        for k in self.sizes:
            s = next(s for s in self.full(k) if s.guest == guest)
            timing = s.inflate if direction == "inflate" else s.deflate
            assert timing is not None
            out[k] = timing.requests
        return out

    @property
    def on_host(self) -> bool:
        """Whether every inflate read a host under test's threads."""
        return bool(self.samples) and all(s.host_work is not None for s in self.samples if s.inflate)

    def runs(self, label: str) -> list[dict[str, Any]]:
        out = []
        for s in self.full(label):
            assert s.inflate is not None and s.down is not None and s.deflate is not None
            host: dict[str, Any] = {}
            if (work := s.host_work) is not None:
                i = s.inflate
                host = {
                    "host_work_s": dataclasses.asdict(work),
                    "host_breakdown_pct": work.breakdown(i.span_ns / 1e9, i.alloc_ns / 1e9, i.wait_ns / 1e9),
                }
            out.append(
                {
                    **host,
                    "guest": s.guest,
                    "seconds": s.inflate_s,
                    "resolution_s": s.up.resolution_s,
                    "qemu_cpu_s": s.qemu_cpu_s,
                    "requests": s.inflate.requests,
                    "pfns": s.inflate.pfns,
                    "driver_span_s": s.inflate.span_ns / 1e9,
                    "host_wait_s": s.inflate.wait_ns / 1e9,
                    "alloc_s": s.inflate.alloc_ns / 1e9,
                    "breakdown_pct": s.inflate.breakdown(),
                    "deflate_s": s.deflate_s,
                    "deflate_resolution_s": s.down.resolution_s,
                    "deflate_requests": s.deflate.requests,
                    "deflate_breakdown_pct": s.deflate.breakdown(),
                }
            )
        return out

    def fits(self) -> Fits:
        done = [(s, s.inflate) for s in self.samples if s.inflate]
        return Fits(
            inflate=fit_costs(self.rows(self.samples)),
            host_wait=fit_costs([Inflate(s.guest, s.pages, i.requests, i.wait_ns / 1e9) for s, i in done]),
            qemu_cpu=fit_costs(self.cpu_rows(self.samples)),
            deflate=fit_costs(self.deflate_rows(self.samples)),
            driver=fit_costs(self.driver_rows(self.samples)),
        )

    def records(
        self,
        settings: dict[str, Any],
        driver: dict[str, Any],
        probe_line: str,
        taint: int,
        fits: Fits | None = None,
    ) -> list[Measurement]:
        """The run's records; ``fits`` as ``fits()`` returned them, if at hand.
        Per size (variant ``per_request`` = its label, ``pfns`` = its PFNs per
        request): ``SIZE_METRICS``; then the fitted costs of ``FIT_RECORDS``."""
        fits = fits or self.fits()
        fit = fits.inflate
        # The transfer model with these measured costs (negative fits read as 0),
        # predicting the seed's 16 GiB guest: a model, labelled so.
        model = transfer_model.CostModel(
            per_request_s=max(fit["per_request_s"]["value"], 0.0),
            per_page_s=max(fit["per_page_s"]["value"], 0.0),
            fixed_s=max(fit["fixed_s"]["value"], 0.0),
        )
        seed_model = {
            "label": "model: the seed's 15-of-16 GiB inflate predicted from this run's fitted costs",
            "ms": {t.scheme: round(model.seconds(t) * 1e3, 1) for t in transfer_model.seed_schemes()},
        }
        common = {
            "taint": taint,
            "taint_flags": taint_flags(taint),
            "driver": driver,
            "driver_probe": probe_line,
            "mechanism": "PFN arrays of the given coverage per request, not a "
            "bitmap (the bitmap protocol was never merged into Linux or QEMU)",
            "fit": fit,
            "host_wait_fit": fits.host_wait,
            "qemu_cpu_fit": fits.qemu_cpu,
            "deflate_fit": fits.deflate,
            "driver_fit": fits.driver,
            "seed_model": seed_model,
        }

        def per_guest(
            metric: str, unit: str, values: list[float], extra: dict[str, Any], variant: dict[str, Any] | None = None
        ) -> Measurement:
            """A lower-is-better record, one replicate per fresh guest."""
            return Measurement(
                scenario=SCENARIO,
                metric=metric,
                unit=unit,
                better="lower",
                replicates=[[v] for v in values],
                samples=[],
                variant=variant or {},
                settings=settings,
                extra=extra,
            )

        out = []
        for label, pfns in self.sizes.items():
            runs = self.runs(label)
            extra = {
                **common,
                "pfns_per_request": pfns,
                "inflates": runs,
                "requests_median": descriptive.median([r["requests"] for r in runs]),
                "pfns": runs[0]["pfns"],
                "gbps_median": descriptive.median([self.inflate_bytes / r["seconds"] / 1e9 for r in runs]),
                "breakdown_pct_median": {
                    k: descriptive.median([r["breakdown_pct"][k] for r in runs]) for k in runs[0]["breakdown_pct"]
                },
                "deflate_s_median": descriptive.median([r["deflate_s"] for r in runs]),
                "deflate_requests_median": descriptive.median([r["deflate_requests"] for r in runs]),
                "qemu_cpu_s_median": descriptive.median([r["qemu_cpu_s"] for r in runs]),
            }
            if self.on_host:
                extra["host_breakdown_pct_median"] = {
                    k: descriptive.median([r["host_breakdown_pct"][k] for r in runs])
                    for k in runs[0]["host_breakdown_pct"]
                }
            variant = {"per_request": label, "pfns": pfns}
            host_metrics = (
                ()
                if not self.on_host
                else (
                    (
                        "host_share",
                        "%",
                        [r["host_breakdown_pct"]["host_pct"] for r in runs],
                        "on the host under test's clock (L1): the CPU of the guest QEMU's threads other than "
                        "its vCPUs (the virtqueue handler, address translation, madvise) and of its vCPU threads "
                        "outside the guest (KVM's exits, QEMU's exit handling), read per thread in L1, over the "
                        "driver's span of the inflate; the move waited on QEMU's events, not polls",
                    ),
                )
            )
            for metric, unit, values, timed in (
                (
                    "inflate_s",
                    "s",
                    [r["seconds"] for r in runs],
                    "on the host under test's clock (L1): the driver's span, from its first request's page "
                    "allocation to the host's last ack, the guest's work and the host's on L1's one CPU"
                    if self.on_host
                    else None,
                ),
                (
                    "host_wait_share",
                    "%",
                    [r["breakdown_pct"]["host_wait_pct"] for r in runs],
                    "in the driver, guest clock: from adding the request to the virtqueue "
                    "to its ack (the kick and QEMU's work on it), over the span from the first request's "
                    "page allocation to the last ack",
                ),
                (
                    "qemu_cpu_s",
                    "s",
                    [r["qemu_cpu_s"] for r in runs],
                    "CPU seconds of all the guest QEMU's threads in the host under test over the inflate "
                    "(schedstat, on L1's clock)"
                    if self.on_host
                    else "CPU seconds of all QEMU's threads over the inflate (schedstat): what it cost the host, "
                    "whatever else competed for the cores",
                ),
                (
                    "deflate_s",
                    "s",
                    [r["deflate_s"] for r in runs],
                    "the driver's span on the host under test's clock (L1), the same pages given back"
                    if self.on_host
                    else "host-timed QMP, the same pages given back",
                ),
                *host_metrics,
            ):
                out.append(per_guest(metric, unit, values, {**extra, "timed": timed} if timed else extra, variant))
        pooled_fits = {
            "inflate": fits.inflate,
            "qemu_cpu": fits.qemu_cpu,
            "deflate": fits.deflate,
            "driver": fits.driver,
        }
        for metric, measure, key, factor, unit in FIT_RECORDS:
            pooled = pooled_fits[measure]
            out.append(
                per_guest(
                    metric,
                    unit,
                    [f[key] * factor for f in self.per_guest_fit[measure]],
                    {
                        "fit": pooled,
                        "measure": measure,
                        "value": pooled[key]["value"] * factor,
                        "low": pooled[key]["low"] * factor,
                        "high": pooled[key]["high"] * factor,
                        "model": "seconds = fixed + requests x per_request "
                        "+ pages x per_page; samples are each guest's own fit, value/low/high the pooled fit "
                        "with its bootstrap CI over guests",
                    },
                )
            )
        return out

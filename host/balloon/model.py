"""Transfer-cost reference model of virtio-balloon inflation (claim balloon-bitmap).

What the guest sends the host for a set of ballooned PFNs, as PFN arrays
(mainline: 256 PFNs a request) or as the seed's bitmaps (B bytes cover 8 B
PFNs), and the cost ``fixed + requests * per_request + pages * per_page``
that ``calibrate`` fits to real inflates, saying when a coefficient cannot
be identified.  docs/balloon.md, "The transfer-cost model".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

PAGE_SIZE = 4096  # virtio-balloon works in 4 KiB pages (VIRTIO_BALLOON_PFN_SHIFT 12)
ARRAY_PFNS_MAX = 256  # VIRTIO_BALLOON_ARRAY_PFNS_MAX
PFN_BYTES = 4  # the array holds __virtio32 PFNs
BITS_PER_LONG = 64
BITMAP_EXTRA_BYTES = 2 * 8  # the seed's "+ 2 * sizeof(unsigned long)"
SEED_BITMAP_BYTES = (32 * 1024, 64 * 1024, 512 * 1024)

# Seed 003: "filling the balloon to 15GB with a 16GB RAM VM"
SEED_MS = {32 * 1024: 2031.0, 64 * 1024: 1507.0, 512 * 1024: 1237.0}
SEED_GUEST_GIB = 16
SEED_BALLOON_GIB = 15
# Seed 003's breakdown before the bitmap: "sending PFNs to host (68.3%)"
SEED_SENDING_SHARE = 0.683

GIB_PAGES = (1 << 30) // PAGE_SIZE


@dataclasses.dataclass(frozen=True)
class PfnRanges:
    """A set of PFNs as sorted, disjoint, non-adjacent half-open ranges
    (a 15 GiB balloon is 4 million PFNs: ranges keep that cheap)."""

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]]) -> PfnRanges:
        merged: list[list[int]] = []
        for start, end in sorted((int(s), int(e)) for s, e in ranges):
            if start < 0 or end < start:
                raise ValueError(f"bad PFN range [{start}, {end})")
            if start == end:
                continue
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return cls(tuple((s, e) for s, e in merged))

    @classmethod
    def contiguous(cls, start: int, count: int) -> PfnRanges:
        return cls.of([(start, start + count)])

    @classmethod
    def from_pfns(cls, pfns: Iterable[int]) -> PfnRanges:
        values = np.unique(np.fromiter((int(p) for p in pfns), dtype=np.int64))
        if values.size == 0:
            return cls(())
        if values[0] < 0:
            raise ValueError("PFNs are not negative")
        breaks = np.nonzero(np.diff(values) != 1)[0]
        starts = np.concatenate(([values[0]], values[breaks + 1]))
        ends = np.concatenate((values[breaks] + 1, [values[-1] + 1]))
        return cls(tuple(zip(starts.tolist(), ends.tolist(), strict=True)))

    @property
    def pages(self) -> int:
        return sum(e - s for s, e in self.ranges)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """What one inflate sends to the host under one scheme."""

    scheme: str  # "array256" or "bitmap<bytes>"
    pages: int
    requests: int
    bytes: int


def array_transfer(pfns: PfnRanges | int) -> Transfer:
    """Mainline: 256-entry arrays of 32-bit PFNs, one request per full array
    (layout does not matter, so a page count is accepted too)."""
    pages = pfns if isinstance(pfns, int) else pfns.pages
    return Transfer("array256", pages, math.ceil(pages / ARRAY_PFNS_MAX), PFN_BYTES * pages)


def bitmap_windows(pfns: PfnRanges, bitmap_bytes: int) -> int:
    """Number of windows of ``8 * bitmap_bytes`` PFNs, laid from the lowest
    PFN rounded down to BITS_PER_LONG, that hold at least one PFN."""
    if bitmap_bytes <= 0 or bitmap_bytes % (BITS_PER_LONG // 8):
        raise ValueError(f"bitmap size {bitmap_bytes} is not a positive multiple of 8 bytes")
    if not pfns.ranges:
        return 0
    span = 8 * bitmap_bytes
    base = pfns.ranges[0][0] // BITS_PER_LONG * BITS_PER_LONG
    windows = 0
    last = -1  # highest window index already counted
    for start, end in pfns.ranges:
        first_w = (start - base) // span
        last_w = (end - 1 - base) // span
        windows += last_w - max(first_w, last + 1) + 1 if last_w > last else 0
        last = max(last, last_w)
    return windows


def bitmap_transfer(pfns: PfnRanges, bitmap_bytes: int) -> Transfer:
    requests = bitmap_windows(pfns, bitmap_bytes)
    return Transfer(f"bitmap{bitmap_bytes}", pfns.pages, requests, requests * (bitmap_bytes + BITMAP_EXTRA_BYTES))


@dataclasses.dataclass(frozen=True)
class CostModel:
    """seconds = fixed_s + requests * per_request_s + pages * per_page_s"""

    per_request_s: float
    per_page_s: float
    fixed_s: float = 0.0

    def seconds(self, transfer: Transfer) -> float:
        return self.fixed_s + transfer.requests * self.per_request_s + transfer.pages * self.per_page_s


@dataclasses.dataclass(frozen=True)
class Observation:
    """One real inflate: pages moved, the requests the driver sent, seconds."""

    pages: int
    requests: int
    seconds: float

    @classmethod
    def of_array_inflate(cls, pages: int, seconds: float) -> Observation:
        return cls(pages, array_transfer(pages).requests, seconds)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Least-squares fit of the cost model to real inflates.

    ``per_request_s`` / ``per_page_s`` are None when the data cannot tell
    them apart (``identifiable`` False); ``combined_per_page_s`` (= per_page
    + per_request / 256, the cost of one page moved by PFN arrays) is always
    measured."""

    fixed_s: float
    combined_per_page_s: float
    per_request_s: float | None
    per_page_s: float | None
    identifiable: bool
    reason: str
    residual_rms_s: float
    n: int

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


# Columns whose scaled singular values fall below this are treated as one.
_COLLINEAR = 1e-3


def calibrate(observations: Sequence[Observation]) -> Calibration:
    """Fit seconds = fixed + requests*c_req + pages*c_page, all >= 0.

    Identifiability is decided on the design matrix, not assumed: with the
    columns scaled to unit norm, a smallest singular value under 1e-3 of the
    largest means requests and pages (or the intercept) move together, and
    only the combined per-page cost is reported."""
    if len(observations) < 2 or len({o.pages for o in observations}) < 2:
        raise ValueError("calibration needs inflates of at least two different sizes")
    y = np.array([o.seconds for o in observations], dtype=float)
    pages = np.array([o.pages for o in observations], dtype=float)
    requests = np.array([o.requests for o in observations], dtype=float)

    # The always-identifiable fit: seconds = fixed + pages * combined.
    # Non-negative least squares: no cost is negative, and on a noisy host
    # an unconstrained intercept does go below zero.
    simple = np.column_stack([np.ones_like(pages), pages])
    fixed, combined = _nnls(simple, y)
    residual = y - simple @ np.array([fixed, combined])

    full = np.column_stack([np.ones_like(pages), requests, pages])
    scaled = full / np.linalg.norm(full, axis=0)
    sv = np.linalg.svd(scaled, compute_uv=False)
    ratio = float(sv[-1] / sv[0])
    if len(observations) >= 3 and ratio >= _COLLINEAR:
        f3, c_req, c_page = _nnls(full, y)
        res3 = y - full @ np.array([f3, c_req, c_page])
        return Calibration(
            fixed_s=float(f3),
            combined_per_page_s=float(c_page + c_req / ARRAY_PFNS_MAX),
            per_request_s=float(c_req),
            per_page_s=float(c_page),
            identifiable=True,
            reason=f"requests and pages vary independently (singular value ratio {ratio:.2g})",
            residual_rms_s=float(np.sqrt(np.mean(res3**2))),
            n=len(observations),
        )
    why = (
        "requests = pages/256 in every inflate (PFN arrays are always full), so the "
        "per-request and per-page costs are collinear"
        if ratio < _COLLINEAR
        else "fewer than three inflates"
    )
    return Calibration(
        fixed_s=float(fixed),
        combined_per_page_s=float(combined),
        per_request_s=None,
        per_page_s=None,
        identifiable=False,
        reason=f"not identifiable: {why} (singular value ratio {ratio:.2g}); "
        "only per_page + per_request/256 is measured",
        residual_rms_s=float(np.sqrt(np.mean(residual**2))),
        n=len(observations),
    )


def _nnls(a: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0 (columns scaled first so
    seconds-per-page and seconds-per-inflate are solved on equal terms)."""
    from scipy.optimize import nnls

    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, y)
    return [float(c) for c in coef / scale]


def seed_guest_pfns(guest_gib: int = SEED_GUEST_GIB, balloon_gib: int = SEED_BALLOON_GIB) -> PfnRanges:
    """The PFNs a balloon of ``balloon_gib`` takes in a QEMU pc guest of
    ``guest_gib`` (RAM below 4 GiB capped at 3 GiB, the rest from 4 GiB up).

    Assumption, stated because the seed does not give it: the balloon ends
    up holding all but the lowest ``guest_gib - balloon_gib`` GiB (the page
    allocator hands out ZONE_NORMAL, then the top of DMA32, first)."""
    if not 0 < balloon_gib < guest_gib:
        raise ValueError("balloon must be smaller than the guest")
    low = min(guest_gib, 3) * GIB_PAGES
    ram = [(0, low)]
    if guest_gib > 3:
        ram.append((4 * GIB_PAGES, (4 + guest_gib - 3) * GIB_PAGES))
    keep = (guest_gib - balloon_gib) * GIB_PAGES  # kept lowest pages
    out = []
    for start, end in ram:
        cut = max(start, min(end, start + keep))
        keep -= cut - start
        if cut < end:
            out.append((cut, end))
    return PfnRanges.of(out)


def seed_schemes(pfns: PfnRanges | None = None) -> list[Transfer]:
    """array256 and the seed's three bitmaps for the seed's 15-of-16 GB inflate."""
    pfns = pfns or seed_guest_pfns()
    return [array_transfer(pfns)] + [bitmap_transfer(pfns, b) for b in SEED_BITMAP_BYTES]


def seed_implied_per_window_s() -> float:
    """The per-request cost the seed's own three bitmap timings imply under
    this model (least-squares slope of ms over request count)."""
    transfers = {t.scheme: t for t in seed_schemes()}
    r = np.array([transfers[f"bitmap{b}"].requests for b in SEED_BITMAP_BYTES], dtype=float)
    t = np.array([SEED_MS[b] / 1000 for b in SEED_BITMAP_BYTES])
    slope, _ = np.polyfit(r, t, 1)
    return float(slope)


def predict_seed(cal: Calibration) -> dict[str, Any]:
    """Predicted seconds and speedups for the seed's inflate, side by side
    with the seed's milliseconds.  When per-request cost is not identifiable
    three splits of the measured combined cost are given: all per page
    (lower bound on any bitmap's gain), all per request (upper bound), and
    the split the seed's breakdown implies (68.3% of the time "sending PFNs
    to host", taken as per request)."""
    transfers = seed_schemes()
    b = cal.combined_per_page_s
    if cal.identifiable:
        assert cal.per_request_s is not None and cal.per_page_s is not None
        splits = {"calibrated": CostModel(cal.per_request_s, cal.per_page_s, cal.fixed_s)}
    else:
        splits = {
            "all_per_page": CostModel(0.0, b, cal.fixed_s),
            "all_per_request": CostModel(b * ARRAY_PFNS_MAX, 0.0, cal.fixed_s),
            "seed_breakdown": CostModel(
                SEED_SENDING_SHARE * b * ARRAY_PFNS_MAX, (1 - SEED_SENDING_SHARE) * b, cal.fixed_s
            ),
        }
    out: dict[str, Any] = {
        "pfn_layout": "pc guest, 16 GiB (3 GiB below 4 GiB), balloon holds all but the lowest 1 GiB",
        "transfers": {t.scheme: {"requests": t.requests, "bytes": t.bytes, "pages": t.pages} for t in transfers},
        "seed_ms": {f"bitmap{k}": v for k, v in SEED_MS.items()},
        "seed_gbps": {f"bitmap{k}": seed_gbps(v) for k, v in SEED_MS.items()},
        "seed_speedup_vs_32k": {f"bitmap{k}": SEED_MS[32 * 1024] / v for k, v in SEED_MS.items()},
        "seed_implied_per_request_ms": 1000 * seed_implied_per_window_s(),
        "calibration": cal.to_json(),
        "predictions": {},
    }
    for name, model in splits.items():
        ms = {t.scheme: 1000 * model.seconds(t) for t in transfers}
        base = ms["bitmap32768"]
        out["predictions"][name] = {
            "model": dataclasses.asdict(model),
            "ms": ms,
            "speedup_vs_32k": {k: base / v for k, v in ms.items() if k.startswith("bitmap")},
            "speedup_vs_array": {k: ms["array256"] / v for k, v in ms.items() if k.startswith("bitmap")},
        }
    return out


def seed_gbps(ms: float, balloon_gib: int = SEED_BALLOON_GIB) -> float:
    """The seed's figure as GB/s (decimal GB; the seed's "15GB" read as GiB)."""
    return balloon_gib * (1 << 30) / (ms / 1000) / 1e9


def side_by_side(prediction: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (scheme, seed ms, predicted ms per split, seed vs predicted
    speedup over 32 KB) for a terminal table or docs."""
    rows = []
    preds = prediction["predictions"]
    for scheme in ("array256", "bitmap32768", "bitmap65536", "bitmap524288"):
        seed = prediction["seed_ms"].get(scheme)
        seed_s = f"{seed:.0f}" if seed else "-"
        pred = "  ".join(f"{name}={p['ms'][scheme]:.0f}" for name, p in preds.items())
        seed_up = prediction["seed_speedup_vs_32k"].get(scheme)
        model_up = "  ".join(
            f"{name}={p['speedup_vs_32k'][scheme]:.3f}" for name, p in preds.items() if scheme in p["speedup_vs_32k"]
        )
        rows.append((scheme, seed_s, pred, f"seed={seed_up:.3f}  {model_up}" if seed_up else "-"))
    return rows

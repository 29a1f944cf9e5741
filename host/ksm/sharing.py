"""Many identical guests under host KSM: how much merges across guests.

KSM's main use is many similar guests on one host.  Guests started from one
warm-start snapshot (or booted from one image) hold the same kernel, the
same unpacked initramfs and much the same page cache.  ksmd merges two kinds
of pages in them:

- ``I``: pages one guest holds several times itself (merged even when it
  runs alone);
- ``U``: distinct contents every guest holds (merged once across all of them).

With ``n`` guests, KSM's ``pages_sharing`` (the pages saved: mappings beyond
the first of each KSM page) should be

    saved(n) = (n - 1) * U + n * I

``SharingModel.fit`` takes ``I`` from one guest alone and ``U`` from two
guests, and predicts any ``n``; the many-guest scenario (scenarios.py)
checks the prediction for its largest ``n`` against ksmd.

``pages_shared`` and ``pages_sharing`` are host-wide.  They are this
scenario's alone only when no other process holds merged pages, which
``foreign_pages`` checks: the pages mapped to KSM pages
(``pages_shared + pages_sharing``) must equal the sum of our QEMU processes'
``ksm_merging_pages``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from memqual.host.core.errors import Timeout
from memqual.host.ksm.controller import KsmDriver

PAGE_MIB = 4096 / (1 << 20)


@dataclasses.dataclass(frozen=True)
class SharingPoint:
    """KSM's steady state with ``guests`` guests up."""

    guests: int
    pages_shared: int
    pages_sharing: int
    merging: tuple[int, ...]  # each QEMU's ksm_merging_pages
    full_scans: int  # full scans it took to settle
    seconds: float  # time it took to settle

    @property
    def saved_mib(self) -> float:
        return self.pages_sharing * PAGE_MIB

    @property
    def foreign_pages(self) -> int:
        """Pages mapped to KSM pages by processes other than our QEMUs."""
        return self.pages_shared + self.pages_sharing - sum(self.merging)

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"saved_mib": self.saved_mib, "foreign_pages": self.foreign_pages}


@dataclasses.dataclass(frozen=True)
class SharingModel:
    intra_pages: float  # I: what one guest saves alone
    common_pages: float  # U: distinct contents all guests share

    @classmethod
    def fit(cls, one: SharingPoint, two: SharingPoint) -> SharingModel:
        if (one.guests, two.guests) != (1, 2):
            raise ValueError(f"fit needs the 1- and 2-guest points, not {one.guests} and {two.guests}")
        intra = float(one.pages_sharing)
        return cls(intra_pages=intra, common_pages=two.pages_sharing - 2 * intra)

    def saved_pages(self, guests: int) -> float:
        if guests < 1:
            raise ValueError("guests must be at least 1")
        return (guests - 1) * self.common_pages + guests * self.intra_pages

    def to_json(self) -> dict[str, float]:
        return {"intra_pages": self.intra_pages, "common_pages": self.common_pages}


def settle(
    ksm: KsmDriver,
    merging: Callable[[], Sequence[int]],
    guests: int,
    timeout_s: float,
    quiet_scans: int = 2,
    tolerance: float = 0.01,
    clock: Callable[[], float] = time.monotonic,
) -> SharingPoint:
    """Wait full scan by full scan until ``pages_sharing`` has moved by no
    more than ``tolerance`` (relative) for ``quiet_scans`` scans in a row,
    and is not zero; Timeout with the last readings otherwise."""
    start = clock()
    scans = 0
    history: list[int] = []
    while True:
        remaining = timeout_s - (clock() - start)
        if remaining <= 0:
            raise Timeout(
                f"host KSM did not settle with {guests} guests in {timeout_s:.0f} s "
                f"({scans} full scans; pages_sharing {history[-6:]})"
            )
        counters = ksm.wait_full_scans(1, remaining)
        scans += 1
        history.append(counters.pages_sharing)
        if len(history) > quiet_scans and history[-1] > 0:
            window = history[-(quiet_scans + 1) :]
            if max(window) - min(window) <= tolerance * max(window):
                return SharingPoint(
                    guests=guests,
                    pages_shared=counters.pages_shared,
                    pages_sharing=counters.pages_sharing,
                    merging=tuple(merging()),
                    full_scans=scans,
                    seconds=clock() - start,
                )

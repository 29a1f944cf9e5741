"""Many identical guests under host KSM: how much merges across guests.

With n guests, pages_sharing should be (n - 1) * U + n * I (U: contents
every guest holds, I: pages a guest holds several times itself);
``SharingModel.fit`` takes I from one guest and U from two, and
``run_many_guests`` checks the prediction for its largest n against ksmd,
with ``foreign_pages`` checking no other process merged.  docs/ksm.md,
"Many identical guests".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from memqual.host.core import descriptive
from memqual.host.core.errors import Timeout
from memqual.host.core.polling import poll
from memqual.host.core.record import Measurement
from memqual.host.ksm.controller import KsmDriver
from memqual.host.ksm.scenarios import MERGE_KNOBS, SCAN_TIMEOUT_S, Guest, KsmHost, base_settings
from memqual.host.ksm.sysfs import KsmCounters

log = logging.getLogger(__name__)

PAGE_MIB = 4096 / (1 << 20)

# Many guests.  512 MiB guests hold about 150 MiB resident after a warm start.
# The guest count and the timed re-merges: the profile's row.
MANY_GUEST_MIB = 512
REMERGE_SHARE = 0.9  # a re-merge is timed to this share of the settled saving
# Settled = pages_sharing still for this many full scans (about 0.4 s here):
# a page merges only once its content was the same on two visits, so a
# guest still settling after its start merges over several scans.
SETTLE_QUIET_SCANS = 10


class PausableGuest(Guest, Protocol):
    """A KSM guest that QMP can stop and continue."""

    def qmp(self, command: str, **arguments: Any) -> Any: ...


@contextlib.contextmanager
def paused(vms: Sequence[PausableGuest], hold: bool) -> Iterator[None]:
    """The guests stopped (QMP ``stop``) while the host's ksmd works, when
    ``hold``; continued after, also on an error.  Under icount with
    sleep=off an idle guest never sleeps: it runs its timers back to back,
    takes a whole host CPU and rewrites its pages as fast as the host runs
    it, so ksmd (nice 5) starves and the count never settles."""
    if not hold:
        yield
        return
    stopped: list[PausableGuest] = []
    try:
        for vm in vms:
            vm.qmp("stop")
            stopped.append(vm)
        yield
    finally:
        for vm in stopped:
            vm.qmp("cont")


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
    history: list[int] = []

    def quiet() -> KsmCounters | None:
        """One more full scan (the wait is KSM's: no pause between them)."""
        counters = ksm.wait_full_scans(1, max(0.0, timeout_s - (clock() - start)))
        history.append(counters.pages_sharing)
        if len(history) > quiet_scans and history[-1] > 0:
            window = history[-(quiet_scans + 1) :]
            if max(window) - min(window) <= tolerance * max(window):
                return counters
        return None

    polled = poll(
        quiet,
        timeout_s,
        0,
        what=f"host KSM settled with {guests} guests",
        clock=clock,
        on_timeout=lambda seen: Timeout(
            f"host KSM did not settle with {guests} guests in {timeout_s:.0f} s "
            f"({seen.polls} full scans; pages_sharing {history[-6:]})"
        ),
    )
    return SharingPoint(
        guests=guests,
        pages_shared=polled.value.pages_shared,
        pages_sharing=polled.value.pages_sharing,
        merging=tuple(merging()),
        full_scans=polled.polls,
        seconds=clock() - start,
    )


# -- the scenario ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ManyGuestsRun:
    """Identical guests added one by one: each count's settled point, then
    timed re-merges of them all from nothing."""

    points: list[SharingPoint]
    remerge_s: list[float]
    remerge_cpu_s: list[float]
    saved_mib: list[float]  # the settled saving, then after each re-merge
    started_warm: list[bool]
    smart_scan: int | None
    paused_while_settling: bool = False

    @property
    def guests(self) -> int:
        return len(self.points)

    @property
    def settled(self) -> SharingPoint:
        return self.points[-1]

    @property
    def model(self) -> SharingModel:
        return SharingModel.fit(self.points[0], self.points[1])

    @property
    def predicted(self) -> float:
        return self.model.saved_pages(self.guests)

    @property
    def alone(self) -> int:
        """What the first guest merged alone."""
        return self.points[0].merging[0]

    @property
    def per_guest(self) -> float:
        """What each guest merged, the median, with all of them."""
        return descriptive.median(list(self.settled.merging))

    @property
    def foreign(self) -> float:
        """The largest share of the merged pages that were not these guests'."""
        return max(abs(p.foreign_pages) / max(1, p.pages_shared + p.pages_sharing) for p in self.points)

    def records(self) -> list[Measurement]:
        settings = base_settings(
            guest_mib=MANY_GUEST_MIB,
            guests=self.guests,
            **MERGE_KNOBS,
            smart_scan=self.smart_scan,
            settle_quiet_scans=SETTLE_QUIET_SCANS,
            guests_paused_while_settling=self.paused_while_settling,
        )
        extra = {
            "points": [p.to_json() for p in self.points],
            "model": self.model.to_json()
            | {"predicted_saved_pages": self.predicted, "measured_saved_pages": self.settled.pages_sharing},
            "merged_per_guest_alone": self.alone,
            "merged_per_guest_many": self.per_guest,
            "started_warm": self.started_warm,
            "foreign_share": self.foreign,
        }
        # The saving with all the guests (every sample); each smaller
        # count's saving once (its point) and the re-merge times differ from
        # it only in what the fields below say (replicates=[]: regrouped
        # from their own samples, not copied from the saving's).
        saved = Measurement(
            scenario="ksm.many_guests",
            metric="saved_mib",
            unit="MiB",
            better="higher",
            samples=self.saved_mib,
            variant={"guests": self.guests},
            settings=settings,
            extra=extra,
        )
        points_saved = [
            dataclasses.replace(
                saved, samples=[point.saved_mib], replicates=[], variant={"guests": n}, extra=point.to_json()
            )
            for n, point in enumerate(self.points[:-1], start=1)
        ]
        remerge = dataclasses.replace(
            saved,
            metric="remerge_s",
            unit="s",
            better="lower",
            samples=self.remerge_s,
            replicates=[],
            settings=settings | {"share": REMERGE_SHARE},
            extra={"ksmd_cpu_s": self.remerge_cpu_s, "summary": descriptive.summarize(self.remerge_s).to_json()},
        )
        return [*points_saved, saved, remerge]


def run_many_guests(
    ksm: KsmHost,
    boot: Callable[[], PausableGuest],
    guests: int,
    remerges: int,
    note: Callable[[str], None] = log.info,
    pause: bool = False,
) -> ManyGuestsRun:
    """Boot ``guests`` guests one by one (``boot`` gives the next), settle
    host KSM after each, then unmerge everything and time ``remerges``
    merges from nothing to REMERGE_SHARE of the settled saving.  With
    ``pause`` (the icount clock) the guests are stopped whenever ksmd
    works: each point is then the saving of guests at rest."""
    points: list[SharingPoint] = []
    vms: list[PausableGuest] = []

    def merging() -> list[int]:
        return [ksm.process(vm.pid).merging_pages for vm in vms]

    # smart_scan off: with it, a page that found no twin while its guest ran
    # alone is skipped on most later scans, and so is the later guest's twin
    # once it fails a few times; the two are rarely looked at in the same
    # scan, and the 2-guest point settled at 11.9-16.0 k merged pages per
    # guest instead of the 18.7 k that a third, fresh guest then brought
    # (docs/ksm.md).
    smart_scan = {"smart_scan": 0} if ksm.fs.read_int_or_none("smart_scan") is not None else {}
    ksm.set(**MERGE_KNOBS, **smart_scan, run=1)
    for n in range(1, guests + 1):
        vms.append(boot())
        with paused(vms, pause):
            points.append(settle(ksm, merging, n, SCAN_TIMEOUT_S, quiet_scans=SETTLE_QUIET_SCANS))
        note(f"{n} guests: {points[-1].to_json()}")
    settled = points[-1]
    remerge_s: list[float] = []
    remerge_cpu_s: list[float] = []
    saved_mib = [settled.saved_mib]
    for repeat in range(remerges):
        with paused(vms, pause):
            again = remerge(ksm, merging, settled.pages_sharing, remerge_s, remerge_cpu_s)
        saved_mib.append(again.saved_mib)
        note(
            f"re-merge {repeat + 1}/{remerges}: {remerge_s[-1]:.2f} s to {100 * REMERGE_SHARE:.0f}%, "
            f"settled at {again.saved_mib:.1f} MiB saved"
        )
    return ManyGuestsRun(
        points=points,
        remerge_s=remerge_s,
        remerge_cpu_s=remerge_cpu_s,
        saved_mib=saved_mib,
        started_warm=[bool(vm.started_warm) for vm in vms],
        smart_scan=ksm.fs.read_int_or_none("smart_scan"),
        paused_while_settling=pause,
    )


def remerge(
    ksm: KsmHost,
    merging: Callable[[], Sequence[int]],
    settled_pages: int,
    remerge_s: list[float],
    remerge_cpu_s: list[float],
) -> SharingPoint:
    """Unmerge everything, time a merge from nothing to REMERGE_SHARE of
    ``settled_pages`` (appended to ``remerge_s`` and ``remerge_cpu_s``),
    and settle again."""
    guests = len(merging())
    ksm.set(run=2)
    ksm.wait_until(lambda: sum(merging()) == 0, SCAN_TIMEOUT_S, "unmerging the guests")
    ksm.set(run=0)
    before = ksm.counters()
    ksm.set(run=1)
    ksm.wait_until(
        lambda: ksm.counters().pages_sharing >= REMERGE_SHARE * settled_pages,
        SCAN_TIMEOUT_S,
        f"a re-merge to {REMERGE_SHARE:.0%} of {settled_pages} pages",
        poll_s=0.005,
    )
    after = ksm.counters()
    remerge_s.append(after.taken_s - before.taken_s)
    if before.ksmd_cpu_s is not None and after.ksmd_cpu_s is not None:
        remerge_cpu_s.append(after.ksmd_cpu_s - before.ksmd_cpu_s)
    return settle(ksm, merging, guests, SCAN_TIMEOUT_S, quiet_scans=SETTLE_QUIET_SCANS)

"""What KSM and the balloon do to a guest whose RAM is 2 MiB hugetlbfs
pages, beside the same guest on anonymous memory: KSM merges nothing; the
balloon gives back only whole 2 MiB pages, counted by the host pool's free
pages; free page reporting is the control; the inflate's time is measured
on both backings.  The procedures drive the balloon through ``Balloon``
and read the pool through a callable.  docs/hugetlbfs.md says why."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from memqual.host.core.errors import GuestError
from memqual.host.core.polling import poll
from memqual.host.core.record import Measurement
from memqual.host.hugetlbfs.pool import PAGE_BYTES

MIB = 1 << 20
GUEST_PAGE = 4096  # what the balloon moves: a guest tracker counts these
GUEST_MIB = 512
TOUCH_MIB = 320  # touched (and freed) in the guest first: the pages the balloon then takes are faulted in
SMALL_MIB = 1  # less than one huge page: no whole page can be in it
LARGE_MIB = 192
INFLATE_DEADLINE_S = 120.0
REPORT_DEADLINE_S = 60.0  # the guest reports 2 s after memory is freed; a busy TCG host is slower
# Of the touched huge pages, back by reporting: the control's bar.  Two
# quick runs had 124-125 of 160 back in 1.6 s; one ./qualify (load 2-3)
# only 32 in 60 s.  Without reporting none come back.
REPORT_SHARE = 0.10
BACKINGS = ("hugetlbfs", "anon")
# The guest kernel's own driver sends VIRTIO_BALLOON_ARRAY_PFNS_MAX pages a
# request: 256 in Debian's 6.1 and 6.12, but a patched kernel may change
# it (docs/patches/0001), and nothing in the guest reports it.  Its
# records say whose driver it was, not a size memqual did not see.
KERNELS_OWN = "kernel's own"
LARGE_REQUEST_PFNS = 4096  # the driver variant's (host/balloon/driver.py): 8 huge pages a request


class ScenarioFailed(GuestError):
    """The balloon did not reach its target: nothing to count."""


class Reached(Protocol):
    @property
    def reached(self) -> bool: ...
    @property
    def seconds(self) -> float: ...
    @property
    def moved_bytes(self) -> int: ...


class Balloon(Protocol):
    def ram_bytes(self) -> int: ...
    def reach(self, target_bytes: int, deadline_s: float = ...) -> Reached: ...


class Timed(Protocol):
    @property
    def seconds(self) -> float: ...


class Tracker(Protocol):
    """A move timed inside the guest (host/balloon/agent.py's GuestTracker),
    armed before the move starts."""

    def result(self) -> Timed: ...
    def cancel(self) -> None: ...


# Arms a tracker in the guest for an inflate of this many 4 KiB pages.
Track = Callable[[int], Tracker]


@dataclasses.dataclass(frozen=True)
class Inflate:
    """One inflate of ``asked_bytes``: what moved, how long it took, and the
    pool's free huge pages before the touch, before the inflate and after
    it (None on anonymous memory)."""

    backing: str
    asked_bytes: int
    moved_bytes: int
    seconds: float
    free_before: int | None
    free_after: int | None
    free_untouched: int | None = None
    # Timed inside the guest (None: not tracked).  Under a host under test
    # on icount the guest's clock is L1's instruction count.
    guest_seconds: float | None = None

    @property
    def faulted_pages(self) -> int | None:
        """Huge pages the touch faulted in and kept: what the balloon could give back."""
        if self.free_untouched is None or self.free_before is None:
            return None
        return self.free_untouched - self.free_before

    @property
    def returned_pages(self) -> int | None:
        if self.free_before is None or self.free_after is None:
            return None
        return self.free_after - self.free_before

    @property
    def whole_pages_at_most(self) -> int:
        """The most whole huge pages the moved 4 KiB pages could cover."""
        return self.moved_bytes // PAGE_BYTES


def inflate(
    balloon: Balloon,
    size_bytes: int,
    backing: str,
    free_pages: Callable[[], int] | None = None,
    touch: Callable[[], None] | None = None,
    deadline_s: float = INFLATE_DEADLINE_S,
    track: Track | None = None,
) -> Inflate:
    """Touch guest memory (``touch``), inflate by ``size_bytes`` counting
    the pool's free pages around it (timed inside the guest too, given
    ``track``), then deflate again."""
    ram = balloon.ram_bytes()
    untouched = free_pages() if free_pages else None
    if touch is not None:
        touch()
    # Armed before the count: the tracker's start in the guest (an SSH
    # session, a process) may fault in a huge page, which the count would
    # then take for one the inflate cost the pool (seen on L1: -1).
    tracker = track(size_bytes // GUEST_PAGE) if track else None
    before, result = counted_reach(balloon, ram - size_bytes, deadline_s, free_pages, tracker)
    guest_s = tracker_seconds(tracker, result)
    if not result.reached:
        raise ScenarioFailed(f"the balloon stopped short of {size_bytes >> 20} MiB on {backing} memory")
    after = free_pages() if free_pages else None
    back = balloon.reach(ram, deadline_s=deadline_s)
    if not back.reached:
        raise ScenarioFailed(f"the balloon did not deflate again on {backing} memory")
    return Inflate(backing, size_bytes, result.moved_bytes, result.seconds, before, after, untouched, guest_s)


def counted_reach(
    balloon: Balloon,
    target_bytes: int,
    deadline_s: float,
    free_pages: Callable[[], int] | None,
    tracker: Tracker | None,
) -> tuple[int | None, Reached]:
    """The pool's free pages, then the move; an armed ``tracker`` is
    cancelled when either fails (it would wait for pages never given)."""
    try:
        before = free_pages() if free_pages else None
        return before, balloon.reach(target_bytes, deadline_s=deadline_s)
    except BaseException:
        if tracker is not None:
            tracker.cancel()
        raise


def tracker_seconds(tracker: Tracker | None, result: Reached) -> float | None:
    """The move's time in the guest; None untracked, or when the move
    stopped short (its tracker cancelled: it waits for pages never given)."""
    if tracker is None:
        return None
    if not result.reached:
        tracker.cancel()
        return None
    return tracker.result().seconds


def returned_record(
    small: Inflate | None, large: list[Inflate], settings: dict[str, object], pfns: int | None = None
) -> Measurement:
    """The share of what the balloon took that came back as whole huge
    pages, per large inflate at ``pfns`` pages a request (None: the guest
    kernel's own driver, whatever its size); the sub-page inflate's count
    beside it."""
    return Measurement(
        scenario="hugetlbfs.balloon",
        metric="returned_fraction",
        unit="1",
        better="higher",
        samples=[(i.returned_pages or 0) * PAGE_BYTES / i.moved_bytes for i in large],
        variant={"backing": "hugetlbfs", "pfns_per_request": KERNELS_OWN if pfns is None else pfns},
        settings=settings,
        extra={
            "returned_pages": [i.returned_pages for i in large],
            "moved_bytes": [i.moved_bytes for i in large],
            "whole_pages_at_most": [i.whole_pages_at_most for i in large],
            "faulted_pages": [i.faulted_pages for i in large],
            "small_inflate_bytes": small.moved_bytes if small else None,
            "small_returned_pages": small.returned_pages if small else None,
        },
    )


def time_record(inflates: list[Inflate], backing: str, settings: dict[str, object]) -> Measurement:
    """The inflate's host-timed seconds on one backing (wall clock: QMP
    polls by the host)."""
    return Measurement(
        scenario="hugetlbfs.balloon",
        metric="inflate_s",
        unit="s",
        better="lower",
        samples=[i.seconds for i in inflates],
        variant={"backing": backing},
        settings=settings,
        extra={"moved_bytes": [i.moved_bytes for i in inflates]},
    )


def guest_time_record(inflates: list[Inflate], backing: str, settings: dict[str, object]) -> Measurement:
    """The inflate's seconds timed inside the guest (balloon_agent track):
    under a host under test on icount, L1's instructions, the host's work
    for the inflate included, which no load of this machine moves."""
    return Measurement(
        scenario="hugetlbfs.balloon",
        metric="inflate_guest_s",
        unit="s",
        better="lower",
        samples=[i.guest_seconds for i in inflates if i.guest_seconds is not None],
        variant={"backing": backing},
        settings=settings,
        extra={"moved_bytes": [i.moved_bytes for i in inflates], "host_s": [i.seconds for i in inflates]},
    )


def ksm_record(backing: str, agent_pages: int, grown: int, baseline: int, settings: dict[str, object]) -> Measurement:
    """QEMU's merged pages past the baseline over the agent's identical
    pages, after full scans (host/ksm's merge procedure)."""
    return Measurement(
        scenario="hugetlbfs.ksm",
        metric="merged_fraction",
        unit="1",
        better="higher",
        samples=[max(grown, 0) / agent_pages],
        variant={"backing": backing},
        settings=settings,
        extra={"agent_pages": agent_pages, "grown_pages": grown, "baseline_pages": baseline},
    )


@dataclasses.dataclass(frozen=True)
class Reported:
    """Free page reporting after a touch and free: the pool's free pages
    once the touch had faulted them in, and once ``min_pages`` came back."""

    touched_pages: int
    free_touched: int
    free_after: int
    seconds: float

    @property
    def returned_pages(self) -> int:
        return self.free_after - self.free_touched


def reported(
    free_pages: Callable[[], int],
    touch: Callable[[], None],
    touched_mib: int = TOUCH_MIB,
    share: float = REPORT_SHARE,
    deadline_s: float = REPORT_DEADLINE_S,
    interval_s: float = 0.1,
) -> Reported:
    """Touch and free ``touched_mib`` in a guest with free page reporting
    on; wait until ``share`` of its huge pages are back in the pool."""
    touch()
    touched = free_pages()
    pages = touched_mib * MIB // PAGE_BYTES
    wanted = max(1, int(share * pages))

    def enough_back() -> int | None:
        now = free_pages()
        return now if now - touched >= wanted else None

    back = poll(
        enough_back,
        deadline_s,
        interval_s,
        what=f"{wanted} huge pages back by free page reporting",
        on_timeout=lambda _: ScenarioFailed(
            f"free page reporting gave back {free_pages() - touched} of {pages} touched huge pages "
            f"within {deadline_s:.0f} s (wanted {wanted})"
        ),
    )
    return Reported(pages, touched, back.value, back.elapsed_s)


def reported_record(found: Reported, settings: dict[str, object]) -> Measurement:
    return Measurement(
        scenario="hugetlbfs.free_page_reporting",
        metric="returned_pages",
        unit="pages",
        better="higher",
        samples=[float(found.returned_pages)],
        variant={"backing": "hugetlbfs"},
        settings=settings,
        extra={"touched_pages": found.touched_pages, "seconds": found.seconds},
    )

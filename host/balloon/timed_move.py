"""One balloon move, timed by the host and, when asked, inside the guest:
the loop every measurement of a move goes through.

Arm the guest's tracker, send the target and poll until it is met, stalls
or the deadline passes; on a stall give the balloon back over QMP at once;
return a typed ``Move``.  docs/balloon.md, "host/balloon/timed_move.py", says why
each step is built so."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from memqual.host.balloon.agent import GuestTiming, GuestTracker
from memqual.host.balloon.device import EVENT_STALL_S, PAGE, BalloonController, BalloonResult, expected_actual
from memqual.host.balloon.l1_moves import L1Moves
from memqual.host.core import clock
from memqual.host.core.qemu import MARK_ADDRESS, MARK_PORT

log = logging.getLogger("memqual.balloon")
# The guest tracker's sleep between reads away from the two ends it times.
TRACK_PERIOD_US = 1000
# A 2 GiB inflate under a loaded 2-core TCG host takes about 10 s.
DEADLINE_S = 120.0
# Stopped short when ``actual`` has not moved for this long.  Short on
# purpose: a guest held at its floor starts killing processes (measured: a
# 64 MiB target on a 1 GiB guest held for 3 s cost the guest its SSH
# server), and the driver retries every 200 ms when out of pages: 3 retries.
STALL_S = 0.6
# A deflate has no floor: standing still there is a starved vCPU, not the end.
DEFLATE_STALL_S = 2.0
# How the host side of a move is timed, in a record's settings: two
# movers' records are not the same measurement.
POLLS_TIMING = "host polls query-balloon (perf_counter): 10 ms far from the target, ~1 ms near it"
EVENTS_TIMING = "host waits on QEMU's BALLOON_CHANGE events (perf_counter, at most one a second)"
# How a guest-timed move starts when L1 sends its target (BalloonMover.at_mark).
AT_MARK = "at the guest tracker's mark, L1 sends the target (HMP balloon, whole MiB)"
# Where the guest marks: L1's mark channel (host/core/qemu.py).
MARK = (MARK_ADDRESS, MARK_PORT)


@dataclasses.dataclass(frozen=True)
class Move:
    """One move of the balloon: ``host`` as QMP's polls saw it, ``guest`` as
    the guest's counters saw it (None when not tracked, or when the move
    stalled), and, after a stall, ``given_back``: the deflate to guest RAM
    that followed at once."""

    direction: str  # "inflate" or "deflate"
    pages_asked: int
    host: BalloonResult
    guest: GuestTiming | None = None
    given_back: BalloonResult | None = None

    @property
    def reached(self) -> bool:
        return self.host.reached

    def to_json(self) -> dict[str, Any]:
        return {
            "reached": self.host.reached,
            "stalled": self.host.stalled,
            "moved_bytes": self.host.moved_bytes,
            "actual_bytes": self.host.actual_bytes,
            "host_s": self.host.seconds,
            "host_resolution_s": self.host.resolution_s,
            "guest_s": self.guest.seconds if self.guest else None,
            "guest_resolution_s": self.guest.resolution_s if self.guest else None,
            "guest_polls": self.guest.polls if self.guest else None,
        }


@dataclasses.dataclass(eq=False)
class BalloonMover:
    """Moves one guest's balloon, each move timed by the host and, given the
    guest's SSH and a deployed ``balloon_agent``, inside the guest too."""

    ctl: BalloonController
    ssh: Any = None
    agent: str = ""
    # DEADLINE_S on the wall clock, longer under icount (clock.deadline_s).
    deadline_s: float = dataclasses.field(default_factory=lambda: clock.deadline_s(DEADLINE_S))
    track_period_us: int = TRACK_PERIOD_US
    # Wait on QEMU's events instead of polling (BalloonController.reach_by_events):
    # for moves whose host work QEMU's own threads are read for.
    by_events: bool = False
    # A host under test that sends a guest-timed move's target itself, at
    # the guest tracker's mark (host/balloon/l1_moves.py); the moves the
    # guest does not time still go by QMP.
    at_mark: L1Moves | None = None

    @property
    def host_timing(self) -> str:
        """How this mover's host side times a move, as a record's settings say it."""
        return EVENTS_TIMING if self.by_events else POLLS_TIMING

    @property
    def started(self) -> str:
        """How a guest-timed move starts, as a record's settings say it."""
        return AT_MARK if self.at_mark is not None else ""

    def move(self, target_bytes: int, stall_s: float | None = None, tracked: bool = True) -> Move:
        """Move the balloon until the guest keeps ``target_bytes``.  The guest
        times it too when this mover has an agent and ``tracked`` is True.
        ``stall_s``: STALL_S for an inflate, DEFLATE_STALL_S for a deflate
        unless given."""
        ctl = self.ctl
        ram = ctl.ram_bytes()
        start = ctl.actual()
        expected = expected_actual(ram, target_bytes)
        direction = "inflate" if expected < start else "deflate"
        pages = abs(start - expected) // PAGE
        if stall_s is None:
            stall_s = STALL_S if direction == "inflate" else DEFLATE_STALL_S
        if tracked and self.agent and pages and self.at_mark is not None:
            return self._at_mark(target_bytes, direction, pages, start)
        tracker = None
        if tracked and self.agent and pages:
            tracker = GuestTracker(self.ssh, self.agent, direction, pages, self.track_period_us, int(self.deadline_s))
        try:
            if self.by_events:
                host = ctl.reach_by_events(target_bytes, deadline_s=self.deadline_s)
            else:
                host = ctl.reach(target_bytes, deadline_s=self.deadline_s, stall_s=stall_s)
        except BaseException:
            if tracker is not None:
                tracker.cancel()
            raise
        if not host.reached:
            # QMP only until the balloon is back: no SSH to a guest at its floor.
            # A move that sent no event for EVENT_STALL_S came from a guest
            # that stopped (docs/host-under-test.md): its deflate is given
            # as long, not the whole deadline.
            back_s = min(self.deadline_s, EVENT_STALL_S) if self.by_events else self.deadline_s
            back = ctl.reach(ram, deadline_s=back_s)
            if tracker is not None:
                tracker.cancel()  # it waits for pages the guest never gave
            return Move(direction, pages, host, None, back)
        guest = tracker.result() if tracker is not None else None
        return Move(direction, pages, host, guest)

    def _at_mark(self, target_bytes: int, direction: str, pages: int, start: int) -> Move:
        """A guest-timed move whose target L1 sends at the tracker's mark:
        memqual sends nothing while the guest times it, and reads
        ``actual`` only once the guest has seen the last page move."""
        assert self.at_mark is not None
        ctl = self.ctl
        pending = self.at_mark.start(target_bytes, self.deadline_s)
        try:
            tracker = GuestTracker(
                self.ssh, self.agent, direction, pages, self.track_period_us, int(self.deadline_s), mark=MARK
            )
            guest = tracker.result()
            sent = pending.result(self.deadline_s)
            log.info(
                "L1 waited %.3f s of its clock for the tracker's mark, sent balloon %d at %.3f",
                sent.mark.waited_s,
                sent.sent.mib,
                sent.sent.at_s,
            )
        except BaseException:
            pending.cancel()  # the guest's test fails: its guest ends with it
            raise
        host = ctl.await_actual(target_bytes, start, deadline_s=min(self.deadline_s, EVENT_STALL_S))
        if not host.reached:
            back = ctl.reach(ctl.ram_bytes(), deadline_s=min(self.deadline_s, EVENT_STALL_S))
            return Move(direction, pages, host, None, back)
        return Move(direction, pages, host, guest)

"""The virtio-balloon device over QMP: targets, the timed reach, the floor,
guest statistics.

Takes anything with ``.qmp(command, **arguments)`` and ``.pid``.  The reach
is timed on the host by polling query-balloon (tightly only near the
target), never by QEMU's rate-limited BALLOON_CHANGE events; ``check_target``
refuses before QEMU what QEMU would refuse or silently change.
docs/balloon.md, "host/balloon/device.py: timing and odd targets".
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from memqual.host.balloon.rss import rss_kib
from memqual.host.core.errors import BadInput, GuestError, MemqualError, Timeout
from memqual.host.core.polling import Polled, poll

log = logging.getLogger(__name__)

PAGE = 4096
# QEMU stores guest-stats-polling-interval as uint32 seconds; larger is refused.
STATS_INTERVAL_MAX = 2**32 - 1
# QEMU rate-limits BALLOON_CHANGE to one event a second (monitor.c).
EVENT_PERIOD_S = 1.0
# A move waiting on events has stopped when none came for this long.  A
# second of a host under test's clock (at most one event's wait) takes
# 10-30 s of this machine's time with five emulated CPUs on its two; the
# guest that spun in L1 (docs/host-under-test.md) sent none for 4.6 min.
EVENT_STALL_S = 120.0
# Marker QEMU puts in guest-stats for a statistic the guest never sent.
STATS_UNSET = -1


class QmpMachine(Protocol):
    @property
    def pid(self) -> int: ...

    def qmp(self, command: str, **arguments: Any) -> Any: ...


@dataclasses.dataclass
class BalloonResult:
    """One balloon move as seen from the host.

    ``seconds`` runs from sending ``balloon`` to receiving the first
    ``query-balloon`` that shows ``expected_bytes``; when the guest stopped
    giving pages (``stalled``) it is the time of the last change and
    ``actual_bytes`` is the floor it reached."""

    target_bytes: int
    expected_bytes: int  # target rounded as QEMU does (whole 4 KiB pages)
    start_bytes: int
    actual_bytes: int
    reached: bool
    stalled: bool
    seconds: float
    resolution_s: float  # gap between the two polls around the reach time
    polls: int
    poll_period_s: float  # median gap between polls over the whole wait
    # What the guest took back while the balloon moved towards the target
    # (seen between two polls): with deflate-on-oom, the OOM notifier's
    # deflates.  A stall after that is a tug of war, not where it stopped.
    given_back_bytes: int = 0

    @property
    def moved_bytes(self) -> int:
        return abs(self.start_bytes - self.actual_bytes)

    @property
    def pages(self) -> int:
        return self.moved_bytes // PAGE

    @property
    def gbps(self) -> float:
        return self.moved_bytes / self.seconds / 1e9 if self.seconds > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class QemuAnswer:
    """What QEMU did with an unchecked ``balloon`` command."""

    accepted: bool
    error: str  # QEMU's error text when refused, else ""


@dataclasses.dataclass
class GuestStats:
    last_update: int
    stats: dict[str, int]

    @property
    def unset(self) -> list[str]:
        return [k for k, v in self.stats.items() if v == STATS_UNSET]


def expected_actual(ram_bytes: int, target_bytes: int) -> int:
    """The ``actual`` QEMU will report once the guest meets ``target``:
    QEMU asks for ``(ram - target) >> 12`` pages, clamping above RAM."""
    target = min(target_bytes, ram_bytes)
    return ram_bytes - ((ram_bytes - target) // PAGE) * PAGE


def check_target(target_bytes: int, ram_bytes: int) -> int:
    """memqual's own check, before asking QEMU: raise BadInput for what QEMU
    would refuse or silently change."""
    if isinstance(target_bytes, bool) or not isinstance(target_bytes, int):
        raise BadInput(f"balloon target {target_bytes!r} is not a whole number of bytes")
    if target_bytes <= 0:
        raise BadInput(
            f"balloon target {target_bytes} refused by memqual: QEMU refuses a target <= 0 "
            f'("... expects a size"); give 1..{ram_bytes} bytes'
        )
    if target_bytes > ram_bytes:
        raise BadInput(
            f"balloon target {target_bytes} refused by memqual: it is above guest RAM "
            f"({ram_bytes} bytes) and QEMU would silently clamp it to RAM; give at most {ram_bytes}"
        )
    return target_bytes


@dataclasses.dataclass(eq=False)
class BalloonController:
    """Drive one guest's balloon.  ``device_id`` is the balloon's ``id=``
    (``memqual.host.core.qemu.BalloonDevice.id``); the QOM path is found from it.
    ``clock`` and ``sleep`` are the host's unless a test fakes time."""

    machine: QmpMachine
    device_id: str | None = "balloon0"
    poll_pause_s: float = 0.0002
    far_pause_s: float = 0.01
    near_s: float = 0.05
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    # The guest QEMU's RSS in KiB: this machine's process by default; under
    # a host under test the QEMU in L1 (rss.l1_rss_reader).
    rss: Callable[[], int] | None = None
    # The host's THP counters (host_thp.l1_thp_reader), read around each
    # timed move where the host's huge pages move its cost: under a host
    # under test.  None: not read.
    host_thp: Callable[[], dict[str, int]] | None = None
    # Asked of QEMU once, on first use.
    _ram: int | None = dataclasses.field(default=None, init=False, repr=False)
    _qom_path: str | None = dataclasses.field(default=None, init=False, repr=False)

    # --- sizes -------------------------------------------------------------
    def ram_bytes(self) -> int:
        """Guest base RAM: what balloon targets are measured against
        (hotplugged DIMMs are not part of it)."""
        if self._ram is None:
            self._ram = int(self.machine.qmp("query-memory-size-summary")["base-memory"])
        return self._ram

    def actual(self) -> int:
        return int(self.machine.qmp("query-balloon")["actual"])

    def rss_kib(self) -> int:
        return self.rss() if self.rss is not None else rss_kib(self.machine.pid)

    # --- targets -----------------------------------------------------------
    def qemu_balloon(self, target_bytes: int) -> QemuAnswer:
        """Send ``balloon`` unchecked and report whether QEMU took it."""
        try:
            self.machine.qmp("balloon", value=target_bytes)
        except GuestError as exc:
            return QemuAnswer(False, str(exc))
        return QemuAnswer(True, "")

    def set_target(self, target_bytes: int) -> None:
        """Checked ``balloon``: BadInput before QEMU for odd targets; QEMU's
        own refusal (e.g. no balloon device) surfaces as BadInput too."""
        check_target(target_bytes, self.ram_bytes())
        answer = self.qemu_balloon(target_bytes)
        if not answer.accepted:
            raise BadInput(f"QEMU refused balloon target {target_bytes}: {answer.error}")

    def reach(
        self,
        target_bytes: int,
        deadline_s: float = 60.0,
        stall_s: float = 2.0,
        checked: bool = True,
    ) -> BalloonResult:
        """Set the target and poll until ``actual`` meets it.

        Stops short, ``stalled=True``, when ``actual`` has moved and then
        not changed for ``stall_s`` (the guest cannot give more: the floor).
        Raises Timeout if ``actual`` never moves before ``deadline_s``, or
        is still moving at the deadline."""
        ram = self.ram_bytes()
        start = self.actual()
        expected = expected_actual(ram, target_bytes)
        if checked:
            check_target(target_bytes, ram)
        # t0 just before the command: the reach time includes the command's
        # own round trip (the guest may start before QEMU answers).
        t0 = self.clock()
        answer = self.qemu_balloon(target_bytes)
        if not answer.accepted:
            raise BadInput(f"QEMU refused balloon target {target_bytes}: {answer.error}")
        prev_t = t0
        last_value = start
        last_change_t = t0
        gaps: list[float] = []
        given_back = 0
        value = start

        def moved() -> BalloonResult | None:
            """One query-balloon, timestamped on receipt: the result once
            ``actual`` meets the target or has stalled, else None."""
            nonlocal prev_t, last_value, last_change_t, given_back, value
            value = self.actual()
            now = self.clock()
            gaps.append(now - prev_t)
            if abs(expected - value) > abs(expected - last_value):
                given_back += abs(value - last_value)
            reached = value == expected
            if not reached and value != last_value:
                last_value, last_change_t = value, now
            elif reached or (last_value != start and now - last_change_t >= stall_s):
                seconds = now - t0 if reached else last_change_t - t0
                return BalloonResult(
                    target_bytes,
                    expected,
                    start,
                    value,
                    reached,
                    not reached,
                    seconds,
                    now - prev_t,
                    len(gaps),
                    statistics.median(gaps),
                    given_back,
                )
            prev_t = now
            return None

        def timed_out(polled: Polled[BalloonResult | None]) -> Timeout:
            how = "never moved" if last_value == start else f"still moving at {value} bytes"
            return Timeout(
                f"balloon target {target_bytes}: actual {how} from {start} after "
                f"{deadline_s:g} s ({polled.polls} polls); is virtio_balloon loaded in the guest?"
            )

        # The deadline counts from t0, before the command, as the reach time does.
        polled = poll(
            moved,
            max(0.0, deadline_s - (self.clock() - t0)),
            lambda: self._pause(start, value, expected, prev_t - t0),
            what=f"balloon target {target_bytes}",
            clock=self.clock,
            sleep=self.sleep,
            on_timeout=timed_out,
        )
        return polled.value

    def reach_by_events(self, target_bytes: int, deadline_s: float, stall_s: float = EVENT_STALL_S) -> BalloonResult:
        """Set the target and wait for QEMU's BALLOON_CHANGE events until
        ``actual`` meets it, with no query-balloon in between: QEMU does
        nothing for the wait but emit its events.  For a move whose host
        work is read from QEMU's own threads (a host under test's, on L1's
        clock), which polls would add to.  QEMU sends the event at most
        once a second, so ``seconds`` is this machine's coarse view (its
        resolution says so); a move that stops short, or sends no event
        for ``stall_s``, is ``stalled``."""
        # Machines with a monitor give events; the protocol asks only for commands.
        wait_event: Callable[[str, float], dict[str, Any] | None] | None = getattr(self.machine, "qmp_event", None)
        if wait_event is None:
            raise GuestError("this machine's monitor gives no events: the move cannot wait on them")
        ram = self.ram_bytes()
        check_target(target_bytes, ram)
        start = self.actual()
        expected = expected_actual(ram, target_bytes)
        events = 0
        # Events of a move no one waited on (one L1 sent: l1_moves.py) are
        # still queued: the first of them would end this wait at once.
        drop_events: Callable[[], None] | None = getattr(self.machine, "qmp_drop_events", None)
        if drop_events is not None:
            drop_events()
        t0 = self.clock()
        answer = self.qemu_balloon(target_bytes)
        if not answer.accepted:
            raise BadInput(f"QEMU refused balloon target {target_bytes}: {answer.error}")
        value = start
        while value != expected:
            left = min(deadline_s - (self.clock() - t0), stall_s)
            event = wait_event("BALLOON_CHANGE", left) if left > 0 else None
            if event is None:
                break
            events += 1
            value = int(event["data"]["actual"])
        seconds = self.clock() - t0
        if value != expected:
            value = self.actual()
        reached = value == expected
        return BalloonResult(
            target_bytes=target_bytes,
            expected_bytes=expected,
            start_bytes=start,
            actual_bytes=value,
            reached=reached,
            stalled=not reached,
            seconds=seconds,
            resolution_s=EVENT_PERIOD_S,  # an event's delay, not a poll's gap
            polls=events,
            poll_period_s=EVENT_PERIOD_S,
        )

    def await_actual(self, target_bytes: int, start_bytes: int, deadline_s: float) -> BalloonResult:
        """Poll until ``actual`` meets ``target_bytes``, set by someone else
        (the host under test itself, host/balloon/l1_moves.py), within
        ``deadline_s``; ``stalled`` when it does not.  The host timed
        nothing: ``seconds`` is this wait, and its resolution is the same."""
        expected = expected_actual(self.ram_bytes(), target_bytes)
        t0 = self.clock()
        # 50 ms: the period of a poll after the move, not a wait for an event
        polled = poll(
            lambda: self.actual() == expected,
            deadline_s,
            0.05,
            what=f"the balloon at {expected} bytes",
            clock=self.clock,
            sleep=self.sleep,
            raise_on_timeout=False,
        )
        seconds = self.clock() - t0
        value = expected if polled.met else self.actual()
        return BalloonResult(
            target_bytes=target_bytes,
            expected_bytes=expected,
            start_bytes=start_bytes,
            actual_bytes=value,
            reached=polled.met,
            stalled=not polled.met,
            seconds=seconds,
            resolution_s=seconds,
            polls=polled.polls,
            poll_period_s=seconds / max(polled.polls, 1),
        )

    def _pause(self, start: int, value: int, expected: int, elapsed: float) -> float:
        """Poll tightly only near the end.  Polling QMP every ~1 ms slows a
        TCG guest's inflation by about half (measured: 2.2-2.9 s with 12 ms
        polls against 3.3-4.1 s with 1.3 ms polls for the same 724 MiB), so
        far from the target we poll every ``far_pause_s`` and switch to
        ``poll_pause_s`` once the average rate so far predicts the target
        within ``near_s``.  Before the first move there is no rate: far."""
        moved = abs(value - start)
        if moved == 0 or elapsed <= 0:
            return self.far_pause_s
        eta = abs(expected - value) / (moved / elapsed)
        return self.poll_pause_s if eta <= self.near_s else self.far_pause_s

    # --- guest statistics --------------------------------------------------
    def qom_path(self) -> str:
        """QOM path of the balloon device.  With an id it is
        /machine/peripheral/<id>; otherwise search the anonymous devices."""
        if self._qom_path:
            return self._qom_path
        candidates: list[str] = []
        if self.device_id:
            candidates.append(f"/machine/peripheral/{self.device_id}")
        for parent in ("/machine/peripheral", "/machine/peripheral-anon"):
            try:
                children = self.machine.qmp("qom-list", path=parent)
            except GuestError:
                continue
            candidates += [f"{parent}/{c['name']}" for c in children if "virtio-balloon" in str(c.get("type", ""))]
        for path in candidates:
            try:
                props = {p["name"] for p in self.machine.qmp("qom-list", path=path)}
            except GuestError:
                continue
            if "guest-stats-polling-interval" in props:
                self._qom_path = path
                return path
        raise MemqualError(
            "no virtio-balloon device with guest-stats found in QOM "
            f"(looked at {', '.join(candidates) or 'nothing'}); boot with a balloon device"
        )

    def set_stats_interval(self, seconds: int) -> None:
        """qom-set guest-stats-polling-interval.  memqual refuses a negative
        or over-uint32 interval before QEMU (QEMU refuses both too: "timer
        value must be greater than zero" / "timer value is too big"); 0
        turns polling off."""
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= STATS_INTERVAL_MAX:
            raise BadInput(
                f"guest-stats polling interval {seconds!r} refused by memqual: "
                f"give whole seconds from 0 (off) to {STATS_INTERVAL_MAX}"
            )
        self.qemu_set_stats_interval(seconds)

    def qemu_set_stats_interval(self, seconds: int) -> None:
        """Unchecked qom-set; QEMU's refusal surfaces as BadInput with its text."""
        try:
            self.machine.qmp("qom-set", path=self.qom_path(), property="guest-stats-polling-interval", value=seconds)
        except GuestError as exc:
            raise BadInput(f"QEMU refused guest-stats polling interval {seconds}: {exc}") from exc

    def stats_interval(self) -> int:
        return int(self.machine.qmp("qom-get", path=self.qom_path(), property="guest-stats-polling-interval"))

    def guest_stats(self) -> GuestStats:
        raw = self.machine.qmp("qom-get", path=self.qom_path(), property="guest-stats")
        return GuestStats(int(raw.get("last-update", 0)), {k: int(v) for k, v in raw.get("stats", {}).items()})

    def wait_stats_update(self, after: int, deadline_s: float) -> GuestStats:
        """Wait (polling every 50 ms, with a deadline) for guest-stats whose
        last-update is newer than ``after``."""
        return poll(
            self.guest_stats,
            deadline_s,
            0.05,
            what="a guest-stats update",
            until=lambda stats: stats.last_update > after,
            clock=self.clock,
            sleep=self.sleep,
            on_timeout=lambda _: Timeout(
                f"guest-stats not updated after {after} within {deadline_s:g} s (polling interval set? driver loaded?)"
            ),
        ).value


@dataclasses.dataclass
class Floor:
    """Where the guest stopped giving pages, and the target memqual then
    backed off to so the guest has room to run (SSH, agents)."""

    floor_bytes: int  # the lowest actual reached when asked for far less
    safe_bytes: int  # floor + margin, the target left in place afterwards
    probe: BalloonResult  # the last probe
    backoff: BalloonResult
    probes: list[int]  # the floor each probe saw, in order
    given_back: list[int]  # what the guest took back during each probe


def find_floor(
    ctl: BalloonController,
    margin_bytes: int = 64 << 20,
    low_target_bytes: int = 1 << 20,
    stall_s: float = 1.0,
    deadline_s: float = 120.0,
    agree_bytes: int = 8 << 20,
    max_probes: int = 5,
    before_probe: Callable[[], None] | None = None,
    backoff_stall_s: float = 10.0,
) -> Floor:
    """Ask for far less than the guest can give, take the stall as the
    floor, and deflate by ``margin_bytes`` at once; repeat until two probes
    agree within ``agree_bytes``.

    Why at once: at the floor the guest sits on its min watermark; the
    balloon's own allocations never OOM-kill (__GFP_NORETRY), but the next
    kernel allocation does (seen: dropbear answering an SSH keepalive,
    kthreadd forking a kworker), and the OOM killer takes the SSH server,
    then panics the guest.  Short dwell makes that rare, not impossible:
    probe a guest with deflate-on-oom on when it must survive
    (docs/balloon.md).
    Why twice: on a loaded host a vCPU can be starved for longer than
    ``stall_s`` mid-inflate, which looks like a stall; a real floor is
    found again by a second probe starting from just above it.
    Only probes during which the guest gave nothing back count towards the
    two that agree: with deflate-on-oom, an allocation elsewhere in the
    guest at the floor deflates 1 MiB, the balloon takes it again, and the
    stall ends that tug of war anywhere.  Measured: the first probe of a
    fresh guest (from RAM) gave back 9-32 MiB in 30 of 31 boots (6.1 and
    6.12) and stopped 4-21 MiB above the later probes, which gave back
    nothing.
    The floor grows with guest size (about 150 MiB for 1 GiB, 300 for 4 GiB
    here): it is measured, never assumed.
    ``before_probe`` runs before each probe, with the balloon at RAM or at
    the last floor + margin: a floor compared between boots empties the
    guest's per-CPU free-page lists there (host/balloon/percpu.py says
    why), which the balloon cannot reach otherwise.
    The back-off waits out longer pauses (``backoff_stall_s``): a deflate
    has no floor, so a pause in it is a guest busy reclaiming at its min
    watermark (seen: 1 s without progress, under load), not an end."""
    probes: list[int] = []
    given_back: list[int] = []
    clean: list[int] = []  # the floors of the probes that gave nothing back
    while True:
        if before_probe is not None:
            before_probe()
        probe = ctl.reach(low_target_bytes, deadline_s=deadline_s, stall_s=stall_s)
        probes.append(probe.actual_bytes)
        given_back.append(probe.given_back_bytes)
        safe = min(ctl.ram_bytes(), probe.actual_bytes + margin_bytes)
        backoff = ctl.reach(safe, deadline_s=deadline_s, stall_s=backoff_stall_s)
        if not backoff.reached:
            raise GuestError(f"balloon did not deflate from its floor {probe.actual_bytes} to {safe} bytes")
        if probe.reached:
            return Floor(probe.actual_bytes, safe, probe, backoff, probes, given_back)
        if probe.given_back_bytes == 0:
            clean.append(probe.actual_bytes)
            if len(clean) >= 2 and abs(clean[-1] - clean[-2]) <= agree_bytes:
                return Floor(probe.actual_bytes, safe, probe, backoff, probes, given_back)
        if len(probes) >= max_probes:
            raise GuestError(
                f"balloon floor not found: {max_probes} probes disagree or were contested ({probes} bytes, "
                f"given back during each: {given_back}); host too loaded?"
            )


def wait_actual(
    ctl: BalloonController, predicate: Callable[[int], bool], deadline_s: float, period_s: float = 0.01
) -> tuple[int, float]:
    """Poll query-balloon until ``predicate(actual)``; (actual, seconds).
    For moves memqual did not ask for (driver unloaded, deflate on OOM)."""
    polled = poll(
        ctl.actual,
        deadline_s,
        period_s,
        what="a balloon move",
        until=predicate,
        clock=ctl.clock,
        sleep=ctl.sleep,
        on_timeout=lambda seen: Timeout(f"balloon actual stayed at {seen.value} bytes for {deadline_s:g} s"),
    )
    return polled.value, polled.elapsed_s


def wait_no_balloon(ctl: BalloonController, deadline_s: float, period_s: float = 0.05) -> float:
    """Poll query-balloon until QEMU says there is no balloon device (after
    ``device_del``); the seconds it took.  Timeout past the deadline."""

    def gone() -> bool:
        try:
            ctl.actual()
        except GuestError as exc:
            if "No balloon device" in str(exc):
                return True
            raise
        return False

    return poll(
        gone,
        deadline_s,
        period_s,
        what="the balloon device's removal",
        clock=ctl.clock,
        sleep=ctl.sleep,
        on_timeout=lambda _: Timeout(f"balloon device still present {deadline_s:g} s after device_del"),
    ).elapsed_s

"""The host's share of an inflate on a host under test, without one: L1's
per-thread readings parsed and subtracted, the seed's parts as shares, the
move that waits on QEMU's events, and the request-size records it adds."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from memqual.host.balloon import driver as bd
from memqual.host.balloon import host_share as hs
from memqual.host.balloon import request_size as rs
from memqual.host.balloon.device import BalloonController, BalloonResult
from memqual.host.core.errors import BadInput, GuestError


def stat_line(tid: int, comm: str, utime: int, stime: int, guest: int, run_ns: int) -> str:
    """A /proc/PID/task/TID/stat line with its schedstat, as L1 prints them."""
    fields = ["S"] + ["0"] * 50
    fields[11], fields[12], fields[40] = str(utime), str(stime), str(guest)
    return f"{tid} ({comm}) {' '.join(fields)}|{run_ns} 0 0"


def reading(vcpu=(0, 0, 0, 0), main=(0, 0, 0, 0)) -> hs.Reading:
    # QEMU without debug-threads names every thread alike: the ids tell.
    text = "\n".join([stat_line(100, "qemu-system-x86", *main), stat_line(101, "qemu-system-x86", *vcpu)])
    return hs.parse_reading(text, frozenset({101}))


def test_a_thread_name_with_spaces_and_parentheses_is_read_to_its_last_parenthesis():
    t = hs.parse_thread(stat_line(7, "odd) (name", 12, 3, 4, 999))
    assert (t.tid, t.comm, t.user_ticks, t.system_ticks, t.guest_ticks, t.run_ns) == (7, "odd) (name", 12, 3, 4, 999)
    assert not t.vcpu


@pytest.mark.parametrize("bad", ["", "7 (x) S 1 2", "7 (x) " + "0 " * 50, "x (y) " + "0 " * 50 + "|1"])
def test_what_is_not_a_threads_stat_is_refused(bad):
    with pytest.raises(GuestError, match="not a thread"):
        hs.parse_thread(bad)


@pytest.mark.parametrize("vcpus", [frozenset(), frozenset({1, 2})])
def test_a_qemu_without_its_vcpu_threads_is_not_the_guests(vcpus):
    with pytest.raises(GuestError, match="not every vCPU"):
        hs.parse_reading(stat_line(1, "qemu-system-x86", 0, 0, 0, 0), vcpus)


def test_the_work_between_readings_is_split_by_thread_kind():
    before = reading(vcpu=(100, 10, 80, 5), main=(20, 30, 0, 10**9))
    # vCPU: 50 more user ticks of which 40 guest, 7 system; main: 3 user, 9 system, 0.25 s run
    after = reading(vcpu=(150, 17, 120, 5), main=(23, 39, 0, 10**9 + 250_000_000))
    work = after.minus(before)
    assert work.guest_s == pytest.approx(0.40)
    assert work.vcpu_user_s == pytest.approx(0.10)
    assert work.kvm_s == pytest.approx(0.07)
    assert (work.loop_user_s, work.loop_system_s, work.loop_run_s) == pytest.approx((0.03, 0.09, 0.25))
    assert work.host_s == pytest.approx(0.25 + 0.07 + 0.10)
    # A thread that started between the readings counts from zero.
    newer = hs.Reading((*after.threads, hs.parse_thread(stat_line(102, "worker", 1, 1, 0, 5_000_000))))
    assert newer.minus(before).loop_run_s == pytest.approx(0.255)


def test_the_seeds_parts_are_shares_of_the_drivers_span():
    work = hs.HostWork(loop_run_s=0.05, loop_user_s=0.02, loop_system_s=0.01, kvm_s=0.5, vcpu_user_s=0.1, guest_s=0.3)
    parts = work.breakdown(span_s=1.0, alloc_s=0.4, wait_s=0.45)
    assert parts["allocating_pct"] == pytest.approx(40.0)
    # QEMU's user time from every thread: the handler runs where ioeventfd puts it.
    assert parts["handler_and_translation_pct"] == pytest.approx(12.0)
    assert parts["madvise_and_kick_pct"] == pytest.approx(33.0)
    assert parts["host_kernel_pct"] == pytest.approx(51.0)
    assert parts["guest_pct"] == pytest.approx(30.0)
    assert parts["host_pct"] == pytest.approx(65.0)
    # A wait shorter than QEMU's user time (ticks are samples) is not a negative share.
    assert work.breakdown(1.0, 0.2, 0.1)["madvise_and_kick_pct"] == 0.0


def test_the_threads_are_read_with_the_pid_as_an_argument_never_in_the_script():
    calls = []

    def run(argv, timeout, check):
        calls.append(argv)
        return SimpleNamespace(status=0, stdout=stat_line(5, "qemu-system-x86", 1, 2, 1, 3) + "\n", stderr="")

    threads = hs.QemuThreads(SimpleNamespace(run=run), 4242, frozenset({5}))
    assert threads.read().run_s == pytest.approx(3e-9)
    assert calls[0][:2] == ["sh", "-c"] and "4242" not in calls[0][2] and calls[0][-1] == "4242"

    def gone(argv, timeout, check):
        return SimpleNamespace(status=1, stdout="", stderr="no such file")

    with pytest.raises(GuestError, match="gone"):
        hs.QemuThreads(SimpleNamespace(run=gone), 4242, frozenset({5})).read()


# -- the move that waits on events ------------------------------------------------
class EventMachine:
    """QMP with the balloon's events: ``actual`` steps through ``steps``."""

    pid = 0
    RAM = 1 << 30

    def __init__(self, steps: list[int], refuse: bool = False) -> None:
        self.steps, self.refuse, self.actual, self.queries = list(steps), refuse, self.RAM, 0

    def qmp(self, command: str, **arguments: object) -> object:
        if command == "query-memory-size-summary":
            return {"base-memory": self.RAM}
        if command == "query-balloon":
            self.queries += 1
            return {"actual": self.actual}
        if command == "balloon":
            if self.refuse:
                raise GuestError("No balloon device has been activated")
            return {}
        raise AssertionError(command)

    def qmp_event(self, name: str, deadline_s: float) -> dict[str, object] | None:
        assert name == "BALLOON_CHANGE" and deadline_s > 0
        if not self.steps:
            return None
        self.actual = self.steps.pop(0)
        return {"event": name, "data": {"actual": self.actual}}


def test_a_move_by_events_reaches_its_target_without_polling():
    target = EventMachine.RAM - (768 << 20)
    machine = EventMachine([EventMachine.RAM - (256 << 20), target])
    result = BalloonController(machine, device_id="balloon0").reach_by_events(target, deadline_s=30)
    assert result.reached and not result.stalled and result.actual_bytes == target
    assert result.polls == 2 and machine.queries == 1  # the start, then events alone


def test_a_move_by_events_that_stops_short_is_stalled_at_the_deadline():
    target = EventMachine.RAM - (768 << 20)
    machine = EventMachine([EventMachine.RAM - (100 << 20)])
    result = BalloonController(machine).reach_by_events(target, deadline_s=30)
    assert not result.reached and result.stalled and result.actual_bytes == EventMachine.RAM - (100 << 20)


def test_a_move_by_events_that_sends_no_event_for_its_stall_window_is_stalled_then():
    waits: list[float] = []

    class Silent(EventMachine):
        def qmp_event(self, name: str, deadline_s: float) -> dict[str, object] | None:
            waits.append(deadline_s)
            return super().qmp_event(name, deadline_s)

    target = EventMachine.RAM - (768 << 20)
    result = BalloonController(Silent([EventMachine.RAM - (1 << 20)])).reach_by_events(
        target, deadline_s=1200, stall_s=120
    )
    assert result.stalled and not result.reached
    assert waits == [120, 120]  # each wait is the stall window, not what is left of the deadline


def test_a_move_by_events_does_not_take_an_earlier_move_s_event():
    """A move L1 sent (at the guest's mark) leaves its events queued, the
    last one saying its target: the next move's wait drops them, or it
    would end at once on a stale "reached"."""

    class Queued(EventMachine):
        def __init__(self, stale: list[int], steps: list[int]) -> None:
            super().__init__(stale + steps)
            self.stale = len(stale)

        def qmp_drop_events(self) -> None:
            del self.steps[: self.stale]

    target = EventMachine.RAM - (768 << 20)
    machine = Queued([target], [EventMachine.RAM - (256 << 20), target])
    result = BalloonController(machine).reach_by_events(target, deadline_s=30)
    assert result.reached and result.polls == 2, "the stale event was taken for the move's end"


def test_a_move_by_events_refused_by_qemu_is_bad_input():
    with pytest.raises(BadInput, match="refused"):
        BalloonController(EventMachine([], refuse=True)).reach_by_events(1 << 29, deadline_s=1)


# -- the request-size records on a host under test -----------------------------------
def host_sample(guest: int, label: str, pfns: int, size_bytes: int, rng: random.Random) -> rs.Sample:
    pages = size_bytes // bd.PAGE
    requests = rs.requests_for(pages, pfns)
    span = 0.2 + requests * 1e-4 + pages * 5e-6 + rng.gauss(0, 1e-4)
    moved = BalloonResult(0, 0, 0, 0, True, False, 99.0, 1.0, 3, 1.0)
    timing = bd.DirectionTiming(requests, pages, int(0.1 * span * 1e9), int(0.5 * span * 1e9), 0, int(span * 1e9))
    work = hs.HostWork(
        loop_run_s=0.3 * span, loop_user_s=0.1 * span, loop_system_s=0.2 * span, kvm_s=0.05 * span,
        vcpu_user_s=0.0, guest_s=0.5 * span,
    )  # fmt: skip
    return rs.Sample(guest, label, size_bytes, "", moved, span, timing, moved, timing, host_work=work)


def test_on_a_host_under_test_the_inflate_is_the_drivers_span_and_the_hosts_share_is_recorded():
    sizes = rs.request_sizes(1024)
    inflate_bytes = 768 << 20
    run = rs.RequestSizeRun(sizes, inflate_bytes)
    rng = random.Random(3)
    for g in range(3):
        run.add_guest([host_sample(g, k, sizes[k], n, rng) for k, n in rs.guest_plan(list(sizes), g, inflate_bytes)])
    assert run.on_host
    records = run.records({}, {}, "", 0)
    assert [m.metric for m in records][: len(rs.size_metrics(True))] == list(rs.size_metrics(True))
    by = {(m.metric, m.variant.get("per_request")): m for m in records}
    share = by[("host_share", "256 pfns")]
    assert share.unit == "%" and [r[0] for r in share.replicates] == pytest.approx([35.0] * 3)
    assert "L1" in share.extra["timed"]
    # The inflate's seconds are the driver's span on L1's clock, not QMP's 99 s.
    assert all(r[0] < 10 for r in by[("inflate_s", "256 pfns")].replicates)
    parts = share.extra["host_breakdown_pct_median"]
    assert parts["host_kernel_pct"] == pytest.approx(25.0) and parts["allocating_pct"] == pytest.approx(10.0, abs=0.1)
    # Without a host under test nothing of it is recorded.
    plain = rs.RequestSizeRun(sizes, inflate_bytes)
    plain.samples = [s.__class__(**{**s.__dict__, "host_work": None}) for s in run.samples]
    assert not plain.on_host


def test_a_machine_whose_monitor_gives_no_events_cannot_move_by_them():
    class CommandsOnly:
        pid = 0

        def qmp(self, command: str, **arguments: object) -> object:
            raise AssertionError("nothing is asked of QEMU")

    with pytest.raises(GuestError, match="no events"):
        BalloonController(CommandsOnly()).reach_by_events(1 << 29, deadline_s=1)

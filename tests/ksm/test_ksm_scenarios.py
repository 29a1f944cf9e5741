"""memqual.host.ksm.scenarios: the KSM scenarios' procedures against a host
KSM whose counters follow a script (tests/support/fakes.py's FakeKsmHost: no guest,
no sysfs), and the records they give."""

from __future__ import annotations

import threading

import pytest
from fakes import FakeBackground, FakeClock, FakeGuest, FakeKsmHost, FakeShell

from memqual.host.core.errors import CapabilityMissing, Timeout
from memqual.host.core.qemu import MARK_ADDRESS, MARK_PORT
from memqual.host.core.ssh import CommandResult
from memqual.host.ksm import guest_ksm as gk
from memqual.host.ksm import merge as km
from memqual.host.ksm import scenarios as ks
from memqual.host.ksm import sharing, volatile
from memqual.host.ksm.procfs import ProcessKsm
from memqual.host.ksm.scancost import AbRun
from memqual.host.ksm.schedule import AnonHuge, AwaitMark, Mark, Outcome, ScanEnds, Schedule, SetKnob
from memqual.host.ksm.sysfs import KsmCounters
from memqual.host.ksm.volatile import VolatileGuest

PAGES = km.MERGE_MIB * 256
BASELINE = 100


def growing(per_scan: int, cap: int) -> FakeKsmHost:
    """QEMU merges ``per_scan`` pages a full scan past the baseline, up to ``cap``."""
    host = FakeKsmHost(merging=lambda h, pid: BASELINE + min(cap, per_scan * h.full_scans))
    host.set(run=1)
    return host


@pytest.mark.parametrize(
    ("per_scan", "cap", "scans", "grown", "reached_after_scans"),
    [
        (PAGES // 2, PAGES, 3, PAGES, 2),  # all merge, 90 % at the second scan
        (PAGES, PAGES, 3, PAGES, 1),  # all at the first
        (PAGES // 4, PAGES, 3, 3 * PAGES // 4, None),  # too slow: never 90 % in 3 scans
        (PAGES, PAGES // 2, 2, PAGES // 2, None),  # half the pages only
        (0, 0, 2, 0, None),  # nothing merges
    ],
)
def test_watch_merge_counts_growth_and_when_it_reached_the_target(per_scan, cap, scans, grown, reached_after_scans):
    host = growing(per_scan, cap)
    got, reached = km.watch_merge(host, 1, BASELINE, int(0.9 * PAGES), scans, clock=host.clock, sleep=host.sleep)
    assert got == grown
    assert host.full_scans == scans
    if reached_after_scans is None:
        assert reached is None
    else:
        # seen at the first poll after that scan ended
        assert reached == pytest.approx(reached_after_scans * host.scan_s, abs=km.MERGE_POLL_S + 1e-9)


def test_watch_merge_fails_when_ksmd_does_not_scan():
    host = FakeKsmHost(merging=lambda h, pid: PAGES)  # merged, yet run=0: no full scan ends
    with pytest.raises(ks.ScenarioFailed, match="did not finish 3 full scans within 2 s"):
        km.watch_merge(host, 1, 0, 1, 3, timeout_s=2, clock=host.clock, sleep=host.sleep)
    assert 2 <= host.now < 2.1  # the deadline, not sooner, not much later


def test_merge_record_says_the_agents_share_and_the_variant():
    proc = ProcessKsm(7, PAGES, {"ksm_rmap_items": "9"}, None)
    counters = KsmCounters(1.0, 3, 1, 2, 0, 0, None, None, None, None)
    run = km.MergeRun(PAGES, BASELINE, PAGES, 0.5, PAGES // 2, proc, counters, 0, {"bad_pages": "0"}, 0)
    record = run.record(mem_merge=False)
    assert (record.scenario, record.metric, record.samples) == ("ksm.merge", "merged_fraction", [0.5])
    assert record.variant == {"mem_merge": False}
    assert record.settings == {
        "guest_mib": ks.GUEST_MIB,
        "agent_mib": km.MERGE_MIB,
        "pages_to_scan": ks.MERGE_PAGES_TO_SCAN,
        "sleep_millisecs": ks.MERGE_SLEEP_MS,
        "full_scans": 3,
    }
    assert record.extra["qemu_ksm_stat"] == {"ksm_rmap_items": "9"}


def test_integrity_record_counts_the_bad_pages():
    run = km.IntegrityRun(PAGES, 0, PAGES, 10, 0, {"bad_pages": "2"}, {"bad_pages": "7"}, 1)
    record = run.record()
    assert (run.bad_pages, run.control_bad_pages) == (2, 7)
    assert (record.scenario, record.metric, record.samples) == ("ksm.integrity", "bad_pages", [2.0])
    assert record.settings["tail_bytes"] == 96 and record.variant == {}


# saved(n) = (n - 1) U + n I with I = 1000, U = 5000: 1000, 7000, 13000;
# pages_shared + pages_sharing = what the QEMUs merge, less ``foreign``.
SHARING = {1: (100, 1000), 2: (5000, 7000), 3: (5000, 13000)}


def many_guests_host(foreign: int = 0) -> FakeKsmHost:
    def sharing(host: FakeKsmHost) -> tuple[int, int]:
        shared, saved = SHARING[host.guests]
        return shared + foreign, saved

    def merging(host: FakeKsmHost, pid: int) -> int:
        shared, saved = SHARING[host.guests]
        return (shared + saved) // host.guests

    return FakeKsmHost(merging=merging, sharing=sharing)


def run_many(
    host: FakeKsmHost, guests: int = 3, remerges: int = 2, pause: bool = False, booted: list[FakeGuest] | None = None
) -> sharing.ManyGuestsRun:
    vms = [] if booted is None else booted

    def boot() -> FakeGuest:
        host.guests += 1
        vms.append(FakeGuest(100 + host.guests, started_warm=host.guests > 1))
        return vms[-1]

    return sharing.run_many_guests(host, boot, guests, remerges, note=lambda line: None, pause=pause)


def test_many_guests_follow_the_model_and_record_each_count():
    host = many_guests_host()
    run = run_many(host)
    assert [p.pages_sharing for p in run.points] == [1000, 7000, 13000]
    assert (run.alone, run.per_guest, run.foreign) == (1100, 6000, 0)
    assert run.predicted == pytest.approx(13000)
    assert run.started_warm == [False, True, True]
    assert len(run.saved_mib) == 3 and len(run.remerge_s) == 2 == len(run.remerge_cpu_s)
    # smart_scan off while merging across guests
    assert host.knobs[0] == {**ks.MERGE_KNOBS, "smart_scan": 0, "run": 1}
    records = run.records()
    assert [(r.metric, r.variant, len(r.samples)) for r in records] == [
        ("saved_mib", {"guests": 1}, 1),
        ("saved_mib", {"guests": 2}, 1),
        ("saved_mib", {"guests": 3}, 3),
        ("remerge_s", {"guests": 3}, 2),
    ]
    assert {r.scenario for r in records} == {"ksm.many_guests"}
    assert records[-1].settings == records[-2].settings | {"share": sharing.REMERGE_SHARE}
    assert records[-2].settings["smart_scan"] == 0 and records[-2].settings["guests"] == 3


@pytest.mark.parametrize("pause", [False, True])
def test_many_guests_are_stopped_while_ksmd_works_only_when_asked(pause):
    host, vms = many_guests_host(), list[FakeGuest]()
    running_at_scan: list[list[bool]] = []
    wait = host.wait_full_scans

    def watched(n: int, timeout_s: float, poll_s: float = 0.005):
        running_at_scan.append([vm.running for vm in vms])
        return wait(n, timeout_s, poll_s)

    host.wait_full_scans = watched  # type: ignore[method-assign]  # the fake host, watched at each scan
    run = run_many(host, pause=pause, booted=vms)
    assert running_at_scan
    if pause:
        assert all(not any(running) for running in running_at_scan), "ksmd scanned while a guest ran"
    else:
        assert all(all(running) for running in running_at_scan)
    assert all(vm.running for vm in vms), "every guest runs again at the end"
    assert run.records()[-1].settings["guests_paused_while_settling"] is pause
    assert [p.pages_sharing for p in run.points] == [1000, 7000, 13000]


def test_paused_guests_run_again_after_an_error():
    vms = [FakeGuest(1), FakeGuest(2)]
    with pytest.raises(RuntimeError), sharing.paused(vms, True):
        assert not any(vm.running for vm in vms)
        raise RuntimeError("ksmd too slow")
    assert [vm.qmp_log for vm in vms] == [["stop", "cont"], ["stop", "cont"]]


@pytest.mark.parametrize(("foreign", "share"), [(0, 0.0), (11, 11 / 1111), (1000, 1000 / 2100)])
def test_many_guests_say_what_other_processes_merged(foreign, share):
    assert run_many(many_guests_host(foreign), remerges=0).foreign == pytest.approx(share)


@pytest.mark.parametrize(
    ("pages", "present", "thp", "advisor"),
    [
        ("4k", ("smart_scan",), {"enabled": "never"}, False),
        ("thp", ("smart_scan",), {"enabled": "madvise", "defrag": "madvise"}, False),
        ("4k", ("smart_scan", "advisor_mode"), {"enabled": "never"}, True),
    ],
)
def test_prepare_volatile_sets_thp_and_stops_ksmd(pages, present, thp, advisor):
    host = FakeKsmHost(present=present)
    volatile.prepare_volatile(host, pages)
    assert host.thp == [thp]
    expected: dict[str, int | str] = {**volatile.VOLATILE_KNOBS, "smart_scan": 1, "run": 0}
    if advisor:
        expected["advisor_mode"] = "none"
    assert host.knobs == [expected]


@pytest.mark.parametrize(("discarded", "left"), [([], 3), ([1], 2), ([2, 1], 0), ([5], 0)])
def test_retries_are_one_budget_over_the_guests(discarded, left):
    def guest(n: int) -> VolatileGuest:
        run = AbRun({0: [], 1: []}, [None] * n, 0, [])  # type: ignore[list-item]  # only their count matters
        return VolatileGuest(run, 0, True, 0.5, (0, 0), 0, 0.0)

    assert volatile.retries_left([guest(n) for n in discarded]) == left


def test_volatile_guest_on_thp_that_did_not_back_the_ram_is_a_missing_capability():
    shell = FakeShell(FakeBackground(["t=1 event=start pid=42", "t=2 event=dirty_start"]))
    with pytest.raises(CapabilityMissing, match="host THP did not back guest RAM"):
        volatile.volatile_guest(FakeKsmHost(), FakeGuest(1, ssh=shell), "thp", 0, 3, 1, 9)


@pytest.mark.parametrize(("smart_windows", "first"), [(1, 0), (5, 0), (5, 1)])
def test_volatile_guest_measures_its_smart_scan_windows_back_to_back(smart_windows, first):
    """One guest of the A/B sizing: one window without smart scan, and
    smart_windows windows of 9 whole scans with it, whichever comes first;
    ksmd is stopped again before the guest goes."""
    lines = ["t=1 event=start pid=42", "t=2 event=dirty_start", "t=3 event=dirty_done passes=200 duration_s=4.5"]
    shell = FakeShell(FakeBackground([*lines, "t=4 event=done status=0"]))
    host = FakeKsmHost()
    guest = volatile.volatile_guest(host, FakeGuest(1, ssh=shell), "4k", first, 3, 1, 3, smart_windows=smart_windows)
    assert [w.full_scans for w in guest.run.windows[0]] == [3]
    assert [w.full_scans for w in guest.run.windows[1]] == [volatile.SCANS_PER_WINDOW] * smart_windows
    assert [k["smart_scan"] for k in host.knobs if "smart_scan" in k][1:] == [first, 1 - first]
    assert host.run == 0
    settings = volatile.volatile_settings(1, 1, 3, smart_windows)
    assert settings.get("smart_windows") == (smart_windows if smart_windows > 1 else None)
    if smart_windows == 1:
        assert settings == volatile.volatile_settings(1, 1, 3), "one window a turn keeps the records' key"


def agent_shell(status: int, bad_pages: int = 0, control: int | None = None) -> FakeShell:
    """ksm_stress through fill, tail and verify (and a corrupted verify)."""
    lines = ["t=1 event=start pid=42", "t=2 event=fill_done", "t=3 event=tail_done"]
    lines.append(f"t=4 event=verify_done bad_pages={bad_pages}")
    if control is not None:
        lines.append(f"t=5 event=verify_done bad_pages={control}")
    return FakeShell(FakeBackground([*lines, f"t=6 event=done status={status}"]))


def agent_host(shell: FakeShell, per_scan: int, left_after_tails: int) -> FakeKsmHost:
    """QEMU merges ``per_scan`` pages a scan past the baseline until the agent
    writes its tails (its first SIGUSR1), then ``left_after_tails`` stay."""

    def merging(host: FakeKsmHost, pid: int) -> int:
        if any(argv[:2] == ["kill", "-USR1"] for argv in shell.ran):
            return BASELINE + left_after_tails
        return BASELINE + min(PAGES, per_scan * max(0, host.full_scans - 2))

    return FakeKsmHost(merging=merging)


@pytest.mark.parametrize(
    ("per_scan", "left", "grown", "agent_merged"),
    [
        (PAGES, 0, PAGES, PAGES),  # all the agent's
        (PAGES, 3000, PAGES, PAGES - 3000),  # 3000 merged pages were other guest pages
        (PAGES // 4, 0, 3 * PAGES // 4, 3 * PAGES // 4),  # too slow for 3 scans
    ],
)
def test_run_merge_attributes_what_left_the_count_to_the_agent(per_scan, left, grown, agent_merged):
    shell = agent_shell(status=0)
    host = agent_host(shell, per_scan, left)
    run = km.run_merge(host, FakeGuest(7, ssh=shell), clock=host.clock, sleep=host.sleep)
    assert (run.baseline, run.grown, run.agent_merged) == (BASELINE, grown, agent_merged)
    assert (run.bad_pages, run.agent_status) == (0, 0)
    assert host.knobs[0] == {**ks.MERGE_KNOBS, "run": 1}
    assert shell.started[0][0] == "/tmp/ksm_stress"


def test_run_integrity_reads_both_verifies_after_unmerging():
    shell = agent_shell(status=1, bad_pages=0, control=5)
    host = agent_host(shell, PAGES, 10)
    run = km.run_integrity(host, FakeGuest(7, ssh=shell), clock=host.clock, sleep=host.sleep)
    assert (run.merged, run.after_tail, run.unmerged) == (PAGES, 10, 0)
    assert (run.bad_pages, run.control_bad_pages, run.agent_status) == (0, 5, 1)
    assert host.run == 2  # run=2 unmerged


def test_run_integrity_fails_when_nothing_merged_to_break():
    shell = agent_shell(status=0)
    host = agent_host(shell, 0, 0)
    with pytest.raises(ks.ScenarioFailed, match="did not merge first"):
        km.run_integrity(host, FakeGuest(7, ssh=shell), clock=host.clock, sleep=host.sleep)


class GuestKsmShell:
    """A guest whose own ksmd ends a full scan at every read of full_scans
    (or never, ``stalled``) and merges ``merged`` of the agent's pages."""

    def __init__(self, merged: int, stalled: bool = False) -> None:
        lines = ["t=1 event=start pid=42", "t=2 event=fill_done", "t=3 event=verify_done bad_pages=0"]
        self.background = FakeBackground([*lines, "t=4 event=done status=0"])
        self.merged, self.stalled, self.scans = merged, stalled, 0
        self.ran: list[list[str]] = []
        self.written: dict[str, str] = {}

    def start(self, argv: list[str]) -> FakeBackground:
        return self.background

    def run(
        self, argv: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None
    ) -> CommandResult:
        self.ran.append(argv)
        out = ""
        if argv[:2] == ["sh", "-c"]:
            self.written[argv[5].rsplit("/", 1)[1]] = argv[4]
        elif argv == ["cat", f"{gk.GUEST_KSM_ROOT}/full_scans"]:
            self.scans += 0 if self.stalled else 1
            out = str(self.scans)
        elif argv == ["cat", f"{gk.GUEST_KSM_ROOT}/pages_sharing"]:
            out = str(self.merged - 1)
        elif argv == ["cat", "/proc/42/ksm_merging_pages"]:
            out = "0" if self.written.get("run") == "2" else str(self.merged)
        elif argv == ["uname", "-r"]:
            out = "6.1.0-test\n"
        return CommandResult(argv, 0, out, "", 0.0)


@pytest.mark.parametrize("merged", [0, 1000, gk.GUEST_KSM_MIB * 256])
def test_guest_ksm_reads_the_guests_own_counters(merged):
    shell = GuestKsmShell(merged)
    clock = FakeClock()
    run = gk.run_guest_ksm(FakeGuest(1, ssh=shell), "/tmp/ksm_stress", clock=clock, sleep=clock.sleep)
    assert (run.merged, run.pages_sharing, run.after_unmerge) == (merged, merged - 1, 0)
    assert (run.bad_pages, run.agent_status, run.guest_kernel) == (0, 0, "6.1.0-test")
    assert shell.written == {"pages_to_scan": "5000", "sleep_millisecs": "10", "run": "2"}
    record = run.record()
    assert record.samples == [merged / run.pages] and record.settings["full_scans"] == 3


def test_guest_ksm_fails_when_the_guests_ksmd_does_not_scan():
    clock = FakeClock()
    with pytest.raises(ks.ScenarioFailed, match="did not finish 3 full scans"):
        gk.run_guest_ksm(FakeGuest(1, ssh=GuestKsmShell(0, stalled=True)), "/a", clock=clock, sleep=clock.sleep)
    assert ks.SCAN_TIMEOUT_S <= clock.t <= ks.SCAN_TIMEOUT_S + gk.GUEST_KSM_POLL_S


class ScheduledHost(FakeKsmHost):
    """A host under test's KSM (host/ksm/schedule.py WholeSchedule) on the
    fake's script: a schedule's steps run in order; a wait for the guest's
    mark ends when ``marked`` says so, or is cancelled."""

    def __init__(self, marked: bool = True, huge_kib: int = 0) -> None:
        super().__init__()
        self.marked, self.huge_kib = marked, huge_kib
        self.cancelled = threading.Event()
        self.schedules: list[Schedule] = []

    def cancel_mark(self) -> None:
        self.cancelled.set()

    def run_schedule(self, schedule: Schedule, timeout_s: float) -> Outcome:
        self.schedules.append(schedule)
        ends, own, marks, huge = [], [], [], []
        for step in schedule.steps:
            if isinstance(step, AwaitMark):
                if not self.marked:
                    self.cancelled.wait(5)
                    raise Timeout("the host under test's KSM: a schedule ... (exited 6)")
                marks.append(Mark(self.now, self.now + 1.5))
            elif isinstance(step, AnonHuge):
                huge.append(self.huge_kib)
            elif isinstance(step, SetKnob):
                self.set(**{step.name: step.value})
            elif isinstance(step, ScanEnds):
                ends.append(tuple(self.scan_end_readings(step.count, timeout_s)))
            else:
                own.append(600)
        return Outcome(tuple(ends), tuple(own), tuple(marks), tuple(huge))


def test_on_a_host_under_test_the_agents_mark_starts_one_schedule():
    lines = ["t=1 event=start pid=42", "t=2 event=dirty_start", "t=3 event=dirty_done passes=200 duration_s=4.5"]
    shell = FakeShell(FakeBackground([*lines, "t=4 event=done status=0"]))
    host = ScheduledHost()
    guest = volatile.volatile_guest(host, FakeGuest(1, ssh=shell), "4k", 0, 3, 1, 3)
    assert len(host.schedules) == 1
    steps = host.schedules[0].steps
    assert steps[:3] == (AwaitMark(), AnonHuge(), SetKnob("run", 1)), "ksmd starts at the agent's mark"
    # the agent marks its dirtying for L1 and keeps its progress lines in the guest
    argv = shell.started[0]
    assert argv[:2] == ["sh", "-c"] and argv[4:6] == [MARK_ADDRESS, str(MARK_PORT)]
    assert argv[6:8] == ["dirty_start", "dirty_progress"], "marks its dirtying's start, keeps its progress lines"
    assert guest.mark_waited_s == 1.5 and guest.anon_huge_kib[0] == 0
    assert host.knobs[-1] == {"run": 0}, "ksmd stopped after the schedule"
    # its records never pair with those of a measurement paced from here
    paced, marked = volatile.volatile_settings(1, 1, 3), volatile.volatile_settings(1, 1, 3, from_mark=True)
    assert paced != marked and "started" in marked
    with pytest.raises(CapabilityMissing, match="did not back"):
        volatile.volatile_guest(ScheduledHost(), FakeGuest(1, ssh=shell), "thp", 0, 3, 1, 3)


def test_an_agent_that_never_dirties_ends_l1s_wait_for_its_mark():
    shell = FakeShell(FakeBackground(["t=1 event=start pid=42", "t=2 event=error reason=alloc"]))
    host = ScheduledHost(marked=False)
    with pytest.raises(ks.ScenarioFailed, match="never started dirtying.*reason=alloc"):
        volatile.volatile_guest(host, FakeGuest(1, ssh=shell), "4k", 0, 3, 1, 3)
    assert host.cancelled.is_set()

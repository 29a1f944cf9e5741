"""Tests that share the host on icount: a test whose every primary is a
count of its own guests' instructions, and which changes no host-wide
state, measures beside other such tests (the lock shared, A and B of a
block side by side in a job of their own); every other test keeps the
host to itself.  host/judge/clock_plan.py, host/run/block_jobs.py."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from fake_avocado import guest_kernel_args
from rich.console import Console

from memqual.e2e.base import beside_others
from memqual.host.cli import run as run_command
from memqual.host.cli.command import parser_for
from memqual.host.core import clock, probe, scenario
from memqual.host.core.knobs import KnobSet
from memqual.host.core.primary import COUNT, GUEST_CLOCK, HOST_CPU, HOST_WALL, Primary
from memqual.host.judge import clock_plan
from memqual.host.run import ab_run, blocks
from memqual.host.run import job as runjob
from memqual.host.run.config import JobOutcome
from memqual.host.run.config import TestOutcome as Outcome

TIMING = "test_balloon:BalloonTiming.test_inflate_deflate_1g"
DRIVER = "test_balloon_driver:BalloonDriver.test_request_size"
FAULT = "test_fault:FaultTest.test_anon"
FLOOR = "test_balloon:BalloonFloor.test_floor"
KSM_MERGE = "test_ksm:KsmTest.test_merge"
MEMSLOTS = "test_memslots_qemu:MemslotsQemu.test_layout_applied_checked_probed_and_traced"
# Read on L1's clock in L1: it runs only on a host under test, where every
# test's L1 is its own.
SLOTS_IN_L1 = "test_memslots_l1:MemslotsKvmInL1.test_errnos_and_slot_operation_times"


def test_today_the_balloon_timing_its_driver_and_the_fault_share_the_host_on_icount():
    assert clock_plan.beside_others_tests() == {TIMING, DRIVER, FAULT, SLOTS_IN_L1}


@pytest.mark.parametrize(
    ("instrument", "on_icount", "knobs", "shares"),
    [
        (GUEST_CLOCK, "", False, True),  # timed in the guest: guest instructions on icount
        (HOST_WALL, "m_guest", False, True),  # host-timed, but its guest's own figure decides it on icount
        (HOST_WALL, "", False, False),  # the host's wall clock: another guest's load is in it
        (HOST_CPU, "", False, False),  # ksmd's CPU time
        (COUNT, "", False, False),  # a count the host may pace (the floor's stall window)
        (GUEST_CLOCK, "", True, False),  # a host knob: host-wide state
    ],
)
def test_a_row_shares_the_host_only_when_its_guests_clock_decides_it_and_it_turns_no_knob(
    monkeypatch, instrument, on_icount, knobs, shares
):
    primary = Primary("m", "a test's", instrument=instrument, on_icount=on_icount)
    knob_set = (KnobSet("synthetic", "synthetic knobs", ()),) if knobs else ()
    assert clock_plan.shares_host(scenario.Scenario("synthetic.s", knobs=knob_set, primaries=(primary,))) is shares
    # No primary at all: nothing says what it measures, so it runs alone.
    assert not clock_plan.shares_host(scenario.Scenario("synthetic.other"))


@pytest.mark.parametrize(
    ("reference", "on", "beside"),
    [
        (FAULT, clock.icount(4), True),
        (FAULT, clock.parse("auto"), True),  # the plan puts it on icount
        (FAULT, clock.WALL_CLOCK, False),  # on the wall clock the host's load is in its time
        (TIMING, clock.icount(2), True),
        (FLOOR, clock.icount(4), False),  # a count paced by a host-timed stall window
        (FLOOR, clock.parse("auto"), False),
        (KSM_MERGE, clock.icount(4), False),  # ksmd is the host's: its knobs and its scans
        (MEMSLOTS, clock.icount(4), False),
    ],
)
def test_which_tests_measure_beside_others_on_which_clock(reference, on, beside):
    assert clock_plan.runs_beside_others(reference, on) is beside


def test_the_fault_runs_alone_once_the_host_times_it():
    rows = scenario.table()
    fault = next(row for row in rows if row.name == "fault.anon")
    assert clock_plan.runs_beside_others(FAULT, clock.icount())
    host_timed = dataclasses.replace(
        fault, primaries=tuple(dataclasses.replace(p, instrument=HOST_WALL) for p in fault.primaries)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scenario, "table", lambda: tuple(host_timed if row is fault else row for row in rows))
        assert not clock_plan.runs_beside_others(FAULT, clock.icount())


def test_a_test_process_shares_the_lock_only_on_icount(monkeypatch):
    monkeypatch.setenv("MEMQUAL_CLOCK", "icount:4")
    assert beside_others(FAULT)
    assert not beside_others(KSM_MERGE)
    monkeypatch.setenv("MEMQUAL_CLOCK", "wall")
    assert not beside_others(FAULT)


@pytest.mark.parametrize(
    ("cpus", "available_mib", "slots"),
    [(2, 23_000, 2), (8, 7_000, 2), (64, 500_000, 64), (1, 23_000, 1), (4, 1_000, 1)],
)
def test_a_slot_a_cpu_as_far_as_the_memory_goes(cpus, available_mib, slots):
    assert blocks.beside_others_slots(cpus, available_mib) == slots


def test_the_hosts_slots_come_from_its_meminfo(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    2000000 kB\n")
    assert blocks.host_slots(meminfo) == 1  # under 3 GiB: one guest at a time
    assert blocks.host_slots(tmp_path / "gone") == 1
    with pytest.raises(ValueError):
        blocks.beside_others_slots(0, 1000)


def test_a_name_avocado_lists_is_the_rows_reference():
    assert blocks.row_reference("e2e/test_fault.py:FaultTest.test_anon;b2-A") == FAULT
    assert blocks.row_reference("e2e/test_fault.py:FaultTest.test_anon") == FAULT


def test_a_block_of_a_shared_test_costs_one_run_not_two():
    state = ab_run.BlockedRun()
    name_shared, name_alone = FAULT_NAME, KSM_NAME
    times = [Outcome(f"{name_shared};b1-{arm}", "PASS", "", 60.0) for arm in "AB"]
    state.take(JobOutcome([], 0, None, "", times, {}), slots=2)
    alone = [Outcome(f"{name_alone};b1-{arm}", "PASS", "", 20.0) for arm in "AB"]
    state.take(JobOutcome([], 0, None, "", alone, {}))
    assert state.seconds_per_block({name_shared}) == pytest.approx(60.0)
    assert state.seconds_per_block({name_alone}) == pytest.approx(40.0)


def _record(scenario_name: str, metric: str) -> dict:
    return {
        "schema": "memqual.measurement/1",
        "scenario": scenario_name,
        "metric": metric,
        "unit": "ns",
        "better": "lower",
        "samples": [100.0, 101.0],
    }


FAULT_NAME, KSM_NAME = "e2e/test_fault.py:FaultTest.test_anon", "e2e/test_ksm.py:KsmTest.test_merge"
PLAN_TESTS = [
    {"name": FAULT_NAME, "status": "PASS", "records": [_record("fault.anon", "ns_per_page")]},
    {"name": KSM_NAME, "status": "PASS", "records": [_record("ksm.merge", "x")]},
]


def _run(tmp_path: Path, monkeypatch, fake, clock_text: str, slots: int) -> list[dict]:
    fake.plan(tests=PLAN_TESTS)
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    monkeypatch.setattr(probe, "resolve_accel", lambda requested: ("tcg", "no KVM here"))
    monkeypatch.setattr(blocks, "host_slots", lambda: slots)
    tests = tmp_path / "e2e"
    tests.mkdir()
    args = parser_for(run_command.COMMAND).parse_args(
        ["run", "--output", str(tmp_path / "out"), "--tests", str(tests), *guest_kernel_args(tmp_path)]
        + ["--clock", clock_text, "--rounds", "2"]
    )
    out = io.StringIO()
    runjob.run(run_command.config_from_args(args), Console(file=out, width=200))
    return [c for c in fake.calls() if "--json-variants-load" in c["argv"] and not _once(c["argv"])]


def _once(argv: list[str]) -> bool:
    """The once-per-arm job's filter (host/run/avocado.py selection_filters)."""
    return any(a.startswith("--filter-by-tags=") and ("kernel-checks" in a or "=boot" in a) for a in argv)


def _parallel_and_refs(call: dict) -> tuple[int, list[str]]:
    argv = call["argv"]
    return int(argv[argv.index("--max-parallel-tasks") + 1]), [a for a in argv if a.endswith("$")]


@pytest.mark.parametrize("clock_text", ["icount", "auto"])
def test_on_icount_the_shared_tests_run_side_by_side_in_a_job_of_their_own(tmp_path, monkeypatch, request, clock_text):
    calls = _run(tmp_path, monkeypatch, request.getfixturevalue("fake"), clock_text, slots=2)
    jobs = [_parallel_and_refs(c) for c in calls]
    assert jobs == [(2, [FAULT_NAME + "$"]), (1, [KSM_NAME + "$"])]


@pytest.mark.parametrize(("clock_text", "slots"), [("wall", 2), ("icount", 1)])
def test_on_the_wall_clock_or_one_cpu_every_test_runs_alone_in_one_job(
    tmp_path, monkeypatch, request, clock_text, slots
):
    calls = _run(tmp_path, monkeypatch, request.getfixturevalue("fake"), clock_text, slots=slots)
    ((parallel, refs),) = [_parallel_and_refs(c) for c in calls]
    assert parallel == 1


def test_the_runs_records_hold_both_jobs_tests(tmp_path, monkeypatch, request):
    _run(tmp_path, monkeypatch, request.getfixturevalue("fake"), "icount", slots=2)
    for arm in "AB":
        results = json.loads((tmp_path / "out" / arm / "results.json").read_text())
        assert {m["scenario"] for m in results["metrics"]} == {"fault.anon", "ksm.merge"}


def test_a_guest_test_holds_the_lock_shared_only_where_its_guests_count_what_it_measures(monkeypatch):
    from memqual.e2e.base import GuestTest
    from memqual.e2e.test_fault import FaultTest
    from memqual.e2e.test_ksm import KsmTest

    monkeypatch.setenv("MEMQUAL_CLOCK", "icount:4")
    assert not GuestTest.needs_the_host_alone(FaultTest("test_anon"))
    assert GuestTest.needs_the_host_alone(KsmTest("test_merge"))
    monkeypatch.setenv("MEMQUAL_CLOCK", "wall")
    assert GuestTest.needs_the_host_alone(FaultTest("test_anon"))


def test_under_a_host_under_test_a_ksm_test_shares_the_lock_on_icount_only(monkeypatch):
    """Its guests and the ksmd it drives are an L1 of its own: on icount a
    count of that L1's instructions; on the wall clock this machine's load
    moves it, so it runs alone.  A test that cannot run there runs alone
    (and skips)."""
    from memqual.e2e.base import GuestTest
    from memqual.e2e.test_ksm import KsmTest

    monkeypatch.setenv("MEMQUAL_HOST_KERNEL", "6.12.111+deb12-amd64")
    monkeypatch.setenv("MEMQUAL_CLOCK", "icount:0")
    assert not GuestTest.needs_the_host_alone(KsmTest("test_merge"))
    assert not GuestTest.needs_the_host_alone(KsmTest("test_volatile_scan_4k"))
    assert GuestTest.needs_the_host_alone(KsmTest("test_many_guests"))
    monkeypatch.setenv("MEMQUAL_CLOCK", "wall")
    assert GuestTest.needs_the_host_alone(KsmTest("test_merge"))

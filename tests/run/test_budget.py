"""A budget is a promise (host/run/budget.py), before the run starts: a
run whose once-per-arm checks and first blocks cannot fit its --budget is
refused in one line that names their measured cost
(host/run/block_costs.py) and the --budget or --only that would fit,
exit 2, with nothing made; the checks that no longer fit after the looks
are not run.  The run keeping it: tests/run/test_budget_kept.py.  Tests
listed by hand or by the fake avocado; no guest."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fake_avocado import guest_kernel_args, run_args
from one_line_errors import assert_one_line_error, in_process

from memqual.host.cli import run as run_command
from memqual.host.core import clock, scenario
from memqual.host.core.errors import BadInput
from memqual.host.core.nested import parse_host
from memqual.host.run import block_costs, budget
from memqual.host.run import blocks as run_blocks

# Every test of an ab profile's blocks here, as avocado names them (not the
# slot operations in L1, a test of a host under test alone), and the nine
# once-per-arm checks of a run of every scenario.
ON_A_HOST_UNDER_TEST_ONLY = "test_memslots_l1:"
BLOCK_TESTS = [
    "e2e/" + ref.replace(":", ".py:", 1) for ref in block_costs.COSTS if not ref.startswith(ON_A_HOST_UNDER_TEST_ONLY)
]
CHECKS = [
    "e2e/test_boot.py:Boot.test_ssh_echo_memory_cpus_drivers",
    "e2e/test_boot.py:Boot.test_guest_kernel_is_the_image_kernel",
    "e2e/test_boot.py:Boot.test_guest_clock_runs_at_the_hosts_rate",
    "e2e/test_boot.py:Boot.test_pc_machine_with_pci_devices",
    "e2e/test_boot.py:Panic.test_guest_panic_ends_qemu_at_once",
    "e2e/test_balloon.py:BalloonCorrectness.test_correctness",
    "e2e/test_balloon.py:BalloonFreePageReporting.test_reporting_off",
    "e2e/test_balloon.py:BalloonOomAndStats.test_stats_and_deflate_on_oom",
    "e2e/test_ksm.py:KsmTest.test_merge_off",
]


def _config(tmp_path: Path, *extra: str):
    return run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path), "--until-decided", *extra))


def _listing(blocks_of: list[str] = BLOCK_TESTS, checks: list[str] = CHECKS):
    def listing(config):
        return list(checks if config.selection == "once" else blocks_of)

    return listing


def test_every_block_test_of_the_ab_profile_has_a_measured_cost() -> None:
    """A new scenario's test needs its cost measured, as its primary needs
    its spreads: the estimate counts an unmeasured test as nothing."""
    tested = {row.e2e for row in scenario.table() if "ab" in row.tags and row.e2e}
    assert tested <= set(block_costs.COSTS), tested - set(block_costs.COSTS)
    assert all(c.icount_s is not None for c in block_costs.COSTS.values())


@pytest.mark.parametrize(
    ("extra", "refused", "fragments"),
    [
        # The issue's: every scenario on icount with 10 minutes: the checks
        # alone take 10.4, the first two blocks about 20.
        (
            ["--clock", "icount", "--budget", "10"],
            True,
            [
                "--budget 10 min cannot hold this run",
                "the 9 once-per-arm checks (about 10.4 min)",
                "the first 2 blocks of 13 tests",
                "on icount:4",
                "estimates measured 2026-12-02 to 2026-12-04",
                "give --budget 3",
                "or --only fault",
            ],
        ),
        (["--clock", "icount", "--budget", "40"], False, []),
        # The plan: the wall-clock tests and checks cost less.
        (["--clock", "auto", "--budget", "20"], False, []),
        (["--clock", "auto", "--budget", "5"], True, ["on auto:4", "give --budget 1"]),
    ],
)
def test_a_budget_that_cannot_hold_the_checks_and_first_blocks_is_refused(tmp_path, extra, refused, fragments):
    config = _config(tmp_path, *extra)
    if not refused:
        assert budget.refuse_unfit(config, "tcg", _listing()) is not None
        return
    with pytest.raises(BadInput) as caught:
        budget.refuse_unfit(config, "tcg", _listing())
    line = str(caught.value)
    assert "\n" not in line
    for fragment in fragments:
        assert fragment in line


def test_the_estimate_is_the_measured_costs_on_each_tests_clock(tmp_path, monkeypatch):
    """Blocks: each test's run on its clock, twice (A and B) or once when
    A and B share the host on icount, with the jobs' overhead; the checks
    at the reserve's rate; under a host under test, 4 times the blocks."""
    monkeypatch.setattr(run_blocks, "host_slots", lambda: 2)
    config = _config(tmp_path, "--clock", "icount", "--budget", "60")
    found = budget.refuse_unfit(config, "tcg", _listing())
    assert found is not None
    shared = {
        "test_balloon:BalloonTiming.test_inflate_deflate_1g",
        "test_balloon_driver:BalloonDriver.test_request_size",
    }
    shared.add("test_fault:FaultTest.test_anon")
    by_test = {run_blocks.row_reference(t.name): t for t in found.tests}
    assert {r for r, t in by_test.items() if t.together} == shared
    listed = {ref: c for ref, c in block_costs.COSTS.items() if not ref.startswith(ON_A_HOST_UNDER_TEST_ONLY)}
    one_block = sum(
        c.icount_s * (1 if ref in shared else 2) for ref, c in listed.items() if c.icount_s
    ) + run_blocks.job_overhead_s(2 * len(BLOCK_TESTS))
    assert found.blocks_s() == pytest.approx(2 * one_block)
    assert found.checks_s() == pytest.approx(run_blocks.checks_reserve_s(9, icount=True))
    # The run took 19.3 min for these two blocks on a quiet host.
    assert 18 * 60 < found.blocks_s() < 21 * 60
    hosted = dataclasses.replace(config, hosts=(parse_host("6.1.0-57-amd64", []),))
    on_host = budget.estimate(hosted, BLOCK_TESTS, CHECKS, slots=2)
    assert on_host.factor == block_costs.HOST_UNDER_TEST_FACTOR
    # on icount every test's guests run on hosts under test of their own: A and B side by side
    assert all(t.together for t in on_host.tests)
    measured = sum(c.icount_s or 0.0 for c in listed.values())
    assert on_host.blocks_s() == pytest.approx(2 * (4 * measured + run_blocks.job_overhead_s(2 * len(BLOCK_TESTS))))


@pytest.mark.parametrize(
    ("accel", "extra", "listing_fails"),
    [
        ("kvm", ["--budget", "1"], False),  # no cost is measured under KVM
        ("tcg", ["--clock", "icount", "--budget", "1"], True),  # avocado could not list the tests
    ],
)
def test_nothing_is_refused_where_the_cost_is_not_known(tmp_path, accel, extra, listing_fails):
    config = _config(tmp_path, *extra)
    listing = (lambda config: None) if listing_fails else _listing()
    assert budget.refuse_unfit(config, accel, listing) is None


def test_without_until_decided_there_is_no_budget_to_check(tmp_path):
    config = run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path)))
    assert budget.refuse_unfit(config, "tcg", _listing()) is None


def test_the_only_it_names_selects_whole_subjects_alone(tmp_path):
    """A subject is named only when --only SUBJECT selects exactly its
    tests here: a run given part of the balloon (its timing) is never told
    --only balloon, which would add the floor and free page reporting."""
    config = _config(tmp_path, "--clock", "icount", "--budget", "6")
    part = [n for n in BLOCK_TESTS if "BalloonFloor" not in n and "BalloonFreePage" not in n]
    found = budget.estimate(config, part, CHECKS, slots=1)
    assert "balloon" not in budget.whole_subjects(found)
    assert "fault" in budget.whole_subjects(found) and "ksm" in budget.whole_subjects(found)
    chosen = budget.fitting_subjects(found, 6 * 60)
    assert chosen and found.total_s(set(chosen)) <= 6 * 60
    # and none at all when nothing fits
    assert budget.fitting_subjects(found, 1.0) == []


@pytest.mark.parametrize(
    ("checks", "reserve_s", "budget_min", "elapsed_s", "runs"),
    [
        (9, 626.0, 10.0, 19.3 * 60, False),  # the issue's: past the budget already
        (9, 626.0, 30.0, 19.3 * 60, True),
        (9, 626.0, 30.0, 20.0 * 60, False),  # 10.0 left, 10.4 needed
        (0, 0.0, 1.0, 120.0, True),  # no check: nothing to skip
    ],
)
def test_the_checks_run_only_when_what_is_left_of_the_budget_holds_them(checks, reserve_s, budget_min, elapsed_s, runs):
    why = budget.checks_not_run(checks, reserve_s, budget_min, elapsed_s)
    assert (why is None) == runs
    if why is not None:
        assert why.startswith(f"the {checks} once-per-arm checks were not run: they take about 10.4 min")
        assert "--budget of" in why


def test_the_refusal_is_one_line_exit_2_with_nothing_left_behind(tmp_path, fake, monkeypatch, capsys):
    """Through the command: avocado lists the tests, the estimate refuses,
    and no output folder, build or job is made."""
    fake.plan(
        tests=[
            *({"name": n, "status": "PASS"} for n in BLOCK_TESTS),
            *({"name": n, "status": "PASS", "once": True} for n in CHECKS),
        ]
    )
    out = tmp_path / "out"
    argv = ["run", "--output", str(out), "--tests", str(tmp_path / "e2e"), *guest_kernel_args(tmp_path)]
    (tmp_path / "e2e").mkdir()
    result = in_process(
        [*argv, "--clock", "icount", "--until-decided", "--budget", "10"],
        {"MEMQUAL_STATE_DIR": str(tmp_path / "state")},
        monkeypatch,
        capsys,
    )
    assert_one_line_error(result, "--budget 10 min cannot hold this run", "give --budget")
    assert not out.exists() and not (tmp_path / "calls.jsonl").exists()  # no job started


def test_the_default_clock_reaches_the_run(tmp_path, monkeypatch):
    """Two arms under TCG without --clock: the run's config is on auto."""
    monkeypatch.setattr(run_command, "run_accel", lambda config: ("tcg", "TCG because no KVM"))
    args = run_args(tmp_path, *guest_kernel_args(tmp_path))
    config, chosen = run_command.planned(args, run_command.config_from_args(args))
    assert config.clock == clock.Clock(clock.AUTO, clock.DEFAULT_SHIFT) and "under TCG" in chosen.why

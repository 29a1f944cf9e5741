"""memqual run --until-decided: rounds are added until every metric is
decided (or the budget is spent), and the rounds each needed are reported.
A fake avocado (tests/run/test_runjob.py's) stands in for the scenarios."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from fake_avocado import guest_kernel_args, run_args
from fake_tracker import FakeTracker
from ksm_volatile_runs import ksm_records
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.core.errors import BadInput
from memqual.host.judge import until_decided as until
from memqual.host.judge import verdicts
from memqual.host.run import ab_run
from memqual.host.run import blocks as run_blocks
from memqual.host.run import job as runjob

# The host's drift from round to round, the same for A and B of a round.
DRIFT = {"1": 1.0, "2": 1.04, "3": 0.97, "4": 1.02, "5": 0.99, "6": 1.03, "7": 0.98, "8": 1.01, "9": 1.0, "10": 0.96}


def _rec(scenario: str, metric: str, value: float, scale_b: float = 1.0, drift: bool = False) -> dict:
    # One sample a round: one independent replicate a round, as a scenario
    # that measures in one guest per test gives.
    return {
        **({"round_scale": DRIFT} if drift else {}),
        "schema": "memqual.measurement/1",
        "scenario": scenario,
        "metric": metric,
        "unit": "s",
        "better": "lower",
        "settings": {"guest_mib": 1024},
        "samples": [value],
        "scale_B": scale_b,
    }


def run_memqual(tmp_path: Path, *extra: str) -> tuple[int, str]:
    buf = io.StringIO()
    status = runjob.run(
        run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path), *extra)),
        Console(file=buf, width=160),
    )
    return status, buf.getvalue()


PLAN = [
    {
        "name": "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g",
        "status": "PASS",
        "records": [
            _rec("balloon.deflate", "deflate_s", 1.0, scale_b=1.5, drift=True),
            _rec("balloon.inflate", "inflate_s", 2.0),
        ],
    }
]


PLAN2 = [
    *PLAN,
    {
        "name": "e2e/test_ksm.py:KsmTest.test_merge",
        "status": "PASS",
        "records": [_rec("ksm.merge", "merged_fraction", 0.9)],
    },
]


@pytest.fixture()
def tracker(monkeypatch):
    fake_tracker = FakeTracker()
    monkeypatch.setattr(ab_run, "make_tracker", lambda config=None: fake_tracker)
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    return fake_tracker


def test_blocks_are_added_only_for_the_undecided_scenarios_tests(tmp_path, fake, tracker):
    fake.plan(tests=PLAN2)
    status, out = run_memqual(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["stopped"] == "every primary decided" and summary["blocks"] == 4
    assert [b["block"] for b in summary["added_blocks"]] == [3, 4]
    calls = fake.calls()
    assert len(calls) == 3  # blocks 1-2, block 3, block 4 (no check listed: no once-per-arm job)
    for call, first in ((calls[1], "b3-A"), (calls[2], "b4-B")):
        argv = call["argv"]
        assert "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g$" in argv
        assert not any("test_ksm" in a for a in argv)
        variants = json.loads(Path(argv[argv.index("--json-variants-load") + 1]).read_text())
        assert variants[0]["variant_id"] == first and len(variants) == 2
    # records of every block reach the tracker: 3 per arm after 2 blocks, 2 more a block
    assert tracker.seen == [(1, 6, 6), (2, 8, 8), (3, 10, 10)]
    a = json.loads((tmp_path / "out" / "A" / "results.json").read_text())
    deflate = next(m for m in a["metrics"] if m["metric"] == "deflate_s")
    assert deflate["blocks"] == [1, 2, 3, 4]
    merge = next(m for m in a["metrics"] if m["metric"] == "merged_fraction")
    assert merge["blocks"] == [1, 2]


def test_a_once_per_arm_check_of_an_undecided_scenario_is_not_run_again(tmp_path, fake, tracker):
    """An off-control that records the undecided scenario runs once per arm
    only: the added blocks name the block test alone."""
    check = {
        "name": "e2e/test_balloon.py:BalloonFreePageReporting.test_reporting_off",
        "status": "PASS",
        "once": True,
        "records": [_rec("balloon.deflate", "deflate_off_s", 1.0)],
    }
    fake.plan(tests=[*PLAN2, check])
    status, _ = run_memqual(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert [b["tests"] for b in summary["added_blocks"]] == [
        ["e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g"]
    ] * 2
    a = json.loads((tmp_path / "out" / "A" / "results.json").read_text())
    off = next(m for m in a["metrics"] if m["metric"] == "deflate_off_s")
    assert off["blocks"] == [1], "the check ran once, in the once-per-arm job"
    calls = fake.calls()
    # blocks 1-2, blocks 3 and 4, then the checks: after the looks
    assert len(calls) == 4 and any("kernel-checks" in a for a in calls[-1]["argv"])
    assert not any("test_reporting_off" in a for c in calls[1:3] for a in c["argv"])


def test_the_checks_run_after_the_looks_with_their_time_kept_from_the_budget(tmp_path, fake, tracker):
    """The once-per-arm checks decide nothing: they run last, and the looks'
    clock is the budget less the checks' reserve (so each look's share of
    the budget is larger than on the whole budget's clock)."""
    check = {"name": "e2e/test_boot.py:Boot.test_ssh", "status": "PASS", "once": True}
    fake.plan(tests=[*PLAN2, check])
    status, out = run_memqual(tmp_path, "--until-decided", "--budget", "20")
    assert status == 0
    assert "the 1 once-per-arm checks run after the looks" in out
    calls = fake.calls()
    assert [any("kernel-checks" in a for a in c["argv"]) for c in calls] == [False, False, False, True]
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    reserve = run_blocks.checks_reserve_s(1)
    assert summary["checks_reserved_s"] == round(reserve, 1) and reserve > 0
    # the first look's fraction is of the budget less the reserve
    first = summary["look_wall_s"][0]
    assert tracker.fractions[0] == pytest.approx(first / (20 * 60 - reserve), abs=1e-3)


def test_checks_avocado_cannot_list_run_first(tmp_path, fake, tracker):
    """When avocado cannot list the checks, their cost is unknown: they run
    first, as without --until-decided, and nothing is kept for them."""
    check = {"name": "e2e/test_boot.py:Boot.test_ssh", "status": "PASS", "once": True}
    fake.plan(tests=[*PLAN2, check], list_fails=True)
    status, _ = run_memqual(tmp_path, "--until-decided")
    assert status == 0
    calls = fake.calls()
    assert any("kernel-checks" in a for a in calls[0]["argv"])
    assert not any("kernel-checks" in a for c in calls[1:] for a in c["argv"])
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["checks_reserved_s"] == 0.0


def test_a_look_after_which_no_block_fits_is_the_last_and_spends_the_rest(tmp_path, fake, tracker):
    """A budget that holds no block more than the first two: the first look
    is the last, so it may spend the whole alpha (fraction 1.0), and the
    run stops there."""
    tracker.decided_at = 99
    fake.plan(tests=PLAN2)
    status, _ = run_memqual(tmp_path, "--until-decided", "--budget", "0.01")
    assert status == 0
    assert tracker.fractions == [1.0]
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["stopped"].startswith("budget spent") and "spent the alpha left" in summary["stopped"]
    assert summary["blocks"] == 2 and len(fake.calls()) == 1  # blocks 1-2 (no check listed)


def test_looks_fall_on_the_budgets_clock_below_the_last(tmp_path, fake, tracker):
    """With room in the budget, each look passes the share of it spent so
    far, growing, below 1: the spending follows wall time."""
    fake.plan(tests=PLAN2)
    status, _ = run_memqual(tmp_path, "--until-decided", "--budget", "60")
    assert status == 0
    assert len(tracker.fractions) == 3
    assert all(0.0 < f < 1.0 for f in tracker.fractions)
    assert tracker.fractions == sorted(tracker.fractions)
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert len(summary["look_wall_s"]) == 3 and summary["look_wall_s"] == sorted(summary["look_wall_s"])


def test_a_scenario_that_cannot_be_decided_in_the_budget_gets_no_block(tmp_path, fake, tracker):
    """worth_a_block keeps nothing: the run stops at once, saying why,
    instead of spending the budget on a scenario it cannot decide."""
    tracker.decided_at = 99
    tracker.keep = set()
    fake.plan(tests=PLAN2)
    status, out = run_memqual(tmp_path, "--until-decided", "--budget", "60")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["stopped"].startswith("no undecided scenario can be decided in what is left of the budget")
    assert "balloon.deflate: needs more than 200 blocks" in summary["stopped"]
    assert "look 1: fake at " in out and "left out of further blocks: balloon.deflate" in out
    assert summary["blocks"] == 2 and len(fake.calls()) == 1  # blocks 1-2 (no check listed)


def test_a_spent_budget_stops_with_what_is_undecided(tmp_path, fake, tracker):
    fake.plan(tests=PLAN2)
    status, out = run_memqual(tmp_path, "--until-decided", "--budget", "0.0001")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["blocks"] == 2 and summary["stopped"].startswith("budget spent")
    assert len(fake.calls()) == 1  # blocks 1-2 (no check listed)


def test_decided_after_then_undecided_again_counts_from_the_last_time():
    m = until.MetricProgress("k", [(1, False, ""), (2, True, ""), (3, False, ""), (4, True, ""), (5, True, "")])
    assert m.deciding_look == 4 and m.decided


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--until-decided"], "compares two arms"),
        (["--budget", "10"], "--until-decided only"),
    ],
)
def test_bad_input(tmp_path, extra, message):
    with pytest.raises(BadInput, match=message):
        run_command.config_from_args(run_args(tmp_path, *extra))


def test_bad_budget(tmp_path):
    with pytest.raises(BadInput, match="minutes"):
        run_command.config_from_args(
            run_args(tmp_path, *guest_kernel_args(tmp_path), "--until-decided", "--budget", "-1")
        )


def _records(scale_b: float, n: int, spread: float, seed: int) -> tuple[list, list]:
    import numpy as np

    from memqual.host.core.record import Measurement

    rng = np.random.default_rng(seed)
    out: tuple[list, list] = ([], [])
    for block in range(1, n + 1):
        for side, factor in ((0, 1.0), (1, scale_b)):
            for scenario, metric, f in (
                ("balloon.deflate", "deflate_s", factor),
                ("balloon.inflate", "inflate_s", 1.0),
            ):
                out[side].append(
                    Measurement(
                        scenario=scenario,
                        metric=metric,
                        unit="s",
                        better="lower",
                        samples=[float(f * np.exp(rng.normal(0, spread)))],
                        blocks=[block],
                        arm="AB"[side],
                    )
                )
    return out


def test_a_decided_primary_stays_decided_and_its_scenario_needs_no_more_blocks():
    tracker = until.Tracker(threshold=0.05, alpha=0.01)
    a, b = _records(1.3, 6, 0.01, seed=3)
    done = False
    for look in range(1, 7):
        per_look = [r for r in a if r.blocks[0] <= look], [r for r in b if r.blocks[0] <= look]
        done = tracker.update(look, *per_look, fraction=look / 7).all_decided
        if tracker.metrics and "balloon.deflate" not in tracker.undecided_scenarios():
            break
    deflate = next(m for m in tracker.metrics.values() if m.scenario == "balloon.deflate")
    assert deflate.verdict == "slower" and deflate.decided
    frozen_at = deflate.decided_at
    # Blocks added after: the decision of that look stands.
    tracker.update(look + 1, a, b, fraction=(look + 1) / 7)
    assert deflate.decided_at == frozen_at and deflate.verdict == "slower"
    summary = tracker.to_json("test", 1.0)
    assert summary["primaries_decided"] + summary["primaries_undecided"] == 2
    assert isinstance(done, bool)


def test_once_its_alpha_is_spent_nothing_more_is_decided():
    tracker = until.Tracker(threshold=0.05, alpha=0.01)
    a, b = _records(1.3, 6, 0.01, seed=4)
    tracker.update(2, a[:8], b[:8], fraction=1.0)  # the last look spends it all
    assert tracker.alpha_left == pytest.approx(0.0)
    assert tracker.progress_line().startswith("look 2: alpha 0.01 spent, ")
    tracker.metrics.clear()
    assert tracker.update(6, a, b, fraction=1.0).all_decided is False and tracker.metrics == {}


@pytest.mark.parametrize(
    ("fractions", "levels"),
    [
        ([0.5, 1.0], [0.0025, 0.0075]),  # alpha t^2: a quarter by half the budget
        ([0.2, 0.4, 0.6], [0.0004, 0.0012, 0.0020]),
        ([0.5, 0.3], [0.0025, 0.0]),  # the clock never runs back
        ([1.5], [0.01]),  # past the budget: all of it, never more
        ([0.9, 1.0, 1.0], [0.0081, 0.0019, 0.0]),
    ],
)
def test_each_look_spends_alpha_on_the_budgets_clock(fractions, levels):
    tracker = until.Tracker(threshold=0.05, alpha=0.01)
    a, b = _records(1.0, 3, 0.01, seed=5)
    for look, fraction in enumerate(fractions, start=1):
        tracker.update(look, a, b, fraction=fraction)
    assert [look.level for look in tracker.looks] == pytest.approx(levels)
    assert sum(look.level for look in tracker.looks) <= 0.01 + 1e-12


def _progress(scenario: str, blocks: int, needed: int | None) -> until.MetricProgress:
    return until.MetricProgress(
        f"{scenario} m", [(1, False, "undecided")], scenario=scenario, blocks_needed=needed, blocks=blocks
    )


@pytest.mark.parametrize(
    ("needs", "left_s", "kept", "futile"),
    [
        # 600 s left at 60 s a block of each scenario kept: 10 blocks more.
        ({"a": (4, 8), "b": (4, 15)}, 600.0, {"a", "b"}, set()),
        # b needs more than 2x what it could have (4 + 600 // 40 = 19 alone): left out.
        ({"a": (4, 8), "b": (4, 60)}, 600.0, {"a"}, {"b"}),
        # no count up to 200 would decide c: left out whatever the budget.
        ({"a": (4, 8), "c": (4, None)}, 1e6, {"a"}, {"c"}),
        # one block is not enough to judge: kept, whatever the estimate.
        ({"d": (1, None), "e": (1, 500)}, 600.0, {"d", "e"}, set()),
        # beside a, b would not get the blocks it needs; a, the cheaper to decide, is kept.
        ({"a": (3, 10), "b": (3, 18)}, 300.0, {"a"}, {"b"}),
        # no time left at all: only what is decided already would be kept.
        ({"a": (4, 12)}, 0.0, set(), {"a"}),
    ],
)
def test_futility_keeps_what_the_budget_can_decide(needs, left_s, kept, futile):
    tracker = until.Tracker(threshold=0.05, alpha=0.01)
    for scenario, (blocks, needed) in needs.items():
        tracker.metrics[scenario] = _progress(scenario, blocks, needed)

    def block_s(scenarios: set[str]) -> float:
        return 20.0 + 20.0 * len(scenarios)  # a job's start and 20 s a scenario (A + B)

    assert tracker.worth_a_block(left_s, block_s) == kept
    assert set(tracker.futile) == futile
    # Left out for good: a later look does not take it back.
    assert not (tracker.worth_a_block(1e9, block_s) & futile)


def test_a_metric_whose_regimes_differ_is_not_frozen_and_its_scenario_runs_on():
    """KSM's cost between arms that dirtied 4x apart is not comparable: not a
    decision, so it is not frozen and its scenario still needs blocks."""

    def arm(rate: float, scale: float, seed: int) -> list:
        records = ksm_records(4.4, n=8, seed=seed, dirty_passes_per_scan=rate, cost_scale=scale)
        for r in records:
            r.blocks = [1 + i for i in range(len(r.replicates or []))]
        return records

    tracker = until.Tracker(threshold=0.05, alpha=0.01)
    tracker.update(8, arm(8.0, 1.0, 1), arm(32.0, 2.0, 2))
    cost = [m for k, m in tracker.metrics.items() if "ksmd_cpu_ns_per_page [pages=4k, smart_scan=1]" in k]
    assert cost and not cost[0].decided and cost[0].verdict.startswith("not comparable: dirtying rate A 8 vs B 32")
    assert "ksm.volatile_scan" in tracker.undecided_scenarios()
    # Its need is not judged: the scenario is not left out as futile.
    assert "ksm.volatile_scan" in tracker.worth_a_block(1e6, lambda scenarios: 60.0)


@pytest.mark.parametrize(("decisions", "status"), [(0, 0), (1, 1), (3, 3)])
def test_the_run_exits_as_its_sequential_decisions(tmp_path, fake, tracker, decisions, status):
    """A primary decided slower fails the run (1), a moved control says the
    host drifted (3): the looks' decisions, not the whole run's comparison
    at the full alpha after optional stopping.  comparison.json carries the
    looks' exit status; the whole run at full alpha is its descriptive
    part, with no exit status of its own (the 1.5x deflate of PLAN2 is
    slower there whatever the looks said)."""
    tracker.status = decisions
    fake.plan(tests=PLAN2)
    got, out = run_memqual(tmp_path, "--until-decided")
    assert got == status
    assert ("exit 1" in out) == (status == 1) and ("host drifted" in out) == (status == 3)
    compared = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert compared["exit_status"] == decisions and compared["decided_by"] == "the looks of --until-decided"
    assert compared["decisions"]["exit_status"] == decisions
    assert "exit_status" not in compared["descriptive"] and "descriptive only" in compared["descriptive"]["note"]
    deflate = next(m for m in compared["descriptive"]["metrics"] if m["metric"] == "deflate_s")
    assert deflate["verdict"] == "slower"
    page = (tmp_path / "out" / "comparison.html").read_text()
    assert f"exit {decisions}</span>" in page and "Descriptive: the whole run at full alpha" in page
    assert "the decisions (each metric at the look of --until-decided" in out


class ThreeLooks(until.Tracker):
    """The real Tracker, whose run stops after its third look and keeps
    the deflate scenario running until then (its own rules would stop a
    run of a fake's few blocks anywhere from look 1 on)."""

    def update(self, look, records_a, records_b, fraction=1.0):
        found = super().update(look, records_a, records_b, fraction)
        return dataclasses.replace(found, all_decided=look >= 3)

    def worth_a_block(self, left_s, block_s):
        return {"balloon.deflate"}


def test_an_ab_of_three_looks_compares_once_a_look_and_once_at_the_end(tmp_path, fake, monkeypatch):
    """The arms are compared at each look and once at the end, and every
    file and table of the run renders that one outcome: no comparison
    again, and nothing the run wrote read back (until-decided.json,
    comparison.json, or any JSON of the looks')."""
    from memqual.host.judge import comparison

    compared: list[int] = []  # the metrics of each comparison made
    whole = comparison._compared

    def counted(*args, **kwargs):
        found = whole(*args, **kwargs)
        compared.append(len(found[0]))
        return found

    read_back: list[str] = []
    read_text, loads = Path.read_text, json.loads

    def read(path, *args, **kwargs):
        if path.name in ("until-decided.json", "comparison.json"):
            read_back.append(str(path))
        return read_text(path, *args, **kwargs)

    def parsed(text, *args, **kwargs):
        found = loads(text, *args, **kwargs)
        if isinstance(found, dict) and {"look_times", "decided_by", "decisions"} & set(found):
            read_back.append("a JSON of the looks or the outcome")
        return found

    monkeypatch.setattr(ab_run, "make_tracker", lambda config=None: ThreeLooks(threshold=0.05, alpha=0.01))
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    monkeypatch.setattr(comparison, "_compared", counted)
    fake.plan(tests=PLAN2)
    with monkeypatch.context() as m:
        m.setattr(Path, "read_text", read)
        m.setattr(json, "loads", parsed)
        status, out = run_memqual(tmp_path, "--until-decided")
    assert status in (0, 1) and read_back == []
    assert len(compared) == 4 and all(compared), compared  # looks 1, 2, 3 and the end
    looks = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    outcome = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert len(looks["look_times"]) == 3 and looks["blocks"] == 4
    assert [x["look"] for x in outcome["decisions"]["looks"]] == [1, 2, 3]
    assert outcome["exit_status"] == status == outcome["decisions"]["exit_status"]
    # The table's rows are the looks' own figures: each decision's metric
    # and its verdict at its last look, as until-decided.json has them.
    tracked = {m["key"]: m for m in looks["metrics"]}
    for row in outcome["decisions"]["rows"]:
        assert row["verdict"] == tracked[row["key"]]["decision"]
        assert row["blocks"] == tracked[row["key"]]["at_look"]["n_blocks"]


PLAN3 = [
    *PLAN2,
    {
        "name": "e2e/test_memslots_kvm.py:MemslotsKvm.test_lookup_cost_by_slot_count",
        "status": "PASS",
        "records": [_rec("memslots.kvm_lookup", "access_ns", 20.0)],
    },
]
CONTROL_TEST = "e2e/test_memslots_kvm.py:MemslotsKvm.test_lookup_cost_by_slot_count"


def test_the_negative_controls_run_in_every_added_block_until_they_have_enough(tmp_path, fake, tracker):
    """Below MIN_CONTROL_BLOCKS blocks the controls' silence says nothing:
    each added block runs them beside the undecided scenario's test."""
    fake.plan(tests=PLAN3)
    status, out = run_memqual(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert [b["block"] for b in summary["added_blocks"]] == [3, 4]
    assert all(CONTROL_TEST in b["tests"] and b["controls"] for b in summary["added_blocks"])
    assert summary["controls"]["blocks"] == 4 and summary["controls"]["tests"] == [CONTROL_TEST]
    assert [x["blocks"] for x in summary["controls"]["looks"]] == [2, 3, 4]
    for call in fake.calls()[1:]:
        assert CONTROL_TEST + "$" in call["argv"]
    # The run says what the controls can tell: on 4 blocks of a fake, nothing.
    assert "cannot tell whether the host drifted" in out


def test_the_controls_leave_the_blocks_once_they_can_tell(tmp_path, fake, tracker, monkeypatch):
    """With enough blocks and 80 % power at the last look's alpha, the
    controls cost a block nothing more: later blocks run without them."""
    from memqual.host.judge import control_power

    tracker.decided_at = 5
    monkeypatch.setattr(ab_run, "MIN_CONTROL_BLOCKS", 3)
    enough = control_power.ControlPower(26, 3, True, 0.003, 0.1, 0.97, 100, 34, 0.02)
    monkeypatch.setattr(control_power, "of_look", lambda compared, at, threshold: (None, enough))
    fake.plan(tests=PLAN3)
    status, out = run_memqual(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert [(b["block"], b["controls"]) for b in summary["added_blocks"]] == [
        (3, True),
        (4, False),
        (5, False),
        (6, False),
    ]
    assert summary["controls"]["blocks"] == 3
    assert "they leave the further blocks" in out


def test_the_controls_power_is_simulated_once_a_look_at_the_runs_threshold(tmp_path, fake, monkeypatch):
    """Each look's figure of the controls' power, written in comparison.json
    and read by the rule that lets the controls leave the blocks, is one
    simulation at the run's --threshold; the run's end simulates its own
    (the best look's, the blocks needed)."""
    from memqual.host.judge import control_power

    events: list[str] = []
    thresholds: set[float] = set()
    short = control_power.ControlPower(1, 2, True, 0.003, 0.1, 0.5, 100, 34, 0.02)

    class Marked(ThreeLooks):
        def update(self, look, records_a, records_b, fraction=1.0):
            events.append("look")
            return super().update(look, records_a, records_b, fraction)

    def simulated(designs, *, alpha, threshold, **kwargs):
        events.append("simulation")
        thresholds.add(threshold)
        return dataclasses.replace(short, alpha=alpha)

    def marked_end(*args, **kwargs):
        events.append("end")
        return of_results(*args, **kwargs)

    of_results = ab_run.of_results
    monkeypatch.setattr(ab_run, "make_tracker", lambda config=None: Marked(threshold=0.07, alpha=0.01))
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    monkeypatch.setattr(ab_run, "of_results", marked_end)
    # Both of the look's readers want the figure from the first look on.
    monkeypatch.setattr(ab_run, "MIN_CONTROL_BLOCKS", 2)
    monkeypatch.setattr(control_power, "power", simulated)
    fake.plan(tests=PLAN3)
    status, _ = run_memqual(tmp_path, "--until-decided", "--threshold", "0.07")
    assert status in (0, 1)
    looks = " ".join(events[: events.index("end")]).split("look")[1:]
    assert [part.split() for part in looks] == [["simulation"]] * 3, events
    assert thresholds == {0.07}
    written = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert [x["blocks"] for x in written["controls"]["looks"]] == [2, 3, 4]


def test_each_metric_keeps_boundaries_from_its_looks_and_tests_on_the_increment_scale():
    """Through compare_runs, the recursion from 3 blocks (the
    mechanics; by default it starts at MIN_BLOCKS_SEQUENTIAL): a look on 2
    blocks takes its share as it is and keeps no boundary; from 3 blocks a
    metric's p' (what Holm ran on) is at most its raw p, and it keeps the
    boundary of its Bonferroni share, whose nominal level is above the
    share from the second boundary on (the looks' correlation)."""
    tracker = until.Tracker(threshold=0.05, alpha=0.01, min_blocks_sequential=3)
    a, b = _records(1.03, 8, 0.05, seed=5)
    seen: dict[int, list] = {}
    original = until.compare_so_far

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen[len(tracker.looks) + 1] = out
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(until, "compare_so_far", spy)
        for look in range(2, 9):
            per_look = [r for r in a if r.blocks[0] <= look], [r for r in b if r.blocks[0] <= look]
            tracker.update(look, *per_look, fraction=look / 9)
    inflate = next(m for m in tracker.metrics.values() if m.scenario == "balloon.inflate")
    assert not inflate.decided or inflate.decided_at is not None
    looks = [look for look, _, _, _ in inflate.boundaries]
    blocks = [n for _, n, _, _ in inflate.boundaries]
    assert blocks[0] == 3 and blocks == sorted(blocks)
    shares = {look.look: look.level / 2 for look in tracker.looks}  # two primaries
    for look, _, nominal, nominal_equivalence in inflate.boundaries[1:]:
        assert nominal > shares[look] and nominal_equivalence > shares[look]
    first = seen[1][0].comparison
    assert first.units == 2 and first.p_sequential is None
    for found in seen.values():
        for m in found:
            c = m.comparison
            if c.p_sequential is not None:
                assert c.p_sequential <= c.p_value and c.p_equivalence_sequential <= c.p_equivalence
    assert looks and tracker.to_json("test", 1.0)["metrics"][0]["boundaries"] is not None


def test_compare_alone_has_no_sequential_p():
    """memqual compare (one look, compare_runs with no sequence) reports
    what it did before the boundaries."""
    a, b = _records(1.3, 6, 0.01, seed=6)
    found = until.compare_so_far(a, b, threshold=0.05, alpha=0.01)
    assert found and all("p_sequential" not in m.to_json() for m in found)
    assert all(m.comparison.p_sequential is None for m in found)


def _look(rng_d: list[float]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    return [(i + 1, 1.0) for i in range(len(rng_d))], [(i + 1, float(math.exp(d))) for i, d in enumerate(rng_d)]


def test_a_crossing_inside_the_margin_is_changed_and_frozen_whatever_comes_after():
    """B 4.5 % slower with a tight spread: the difference crosses, the
    estimate is inside the 5 % margin and its interval reaches past it,
    so neither slower nor equivalent: ``changed``, frozen at that look
    (the recursion takes a crossed path as stopped).  Blocks that would
    then look equivalent do not re-decide it."""
    from memqual.host.run import calibrate

    tracker = until.Tracker(threshold=0.05, alpha=0.01, comparisons_of=calibrate._look_decisions)
    d = [0.044 + e for e in (0.004, -0.004, 0.003, -0.003)]
    tracker.update(4, *_look(d), fraction=0.7)
    (m,) = tracker.metrics.values()
    assert m.frozen == verdicts.CHANGED and m.decided and m.decided_at == 4
    assert "inside" in verdicts.verdict_meaning(verdicts.CHANGED, _stats_of(tracker, d))
    tracker.update(5, *_look([0.0] * 5), fraction=1.0)
    assert m.frozen == verdicts.CHANGED and m.history[-1] == (5, True, verdicts.CHANGED)
    assert tracker.exit_status() == 0  # inside the margin: no regression


def _stats_of(tracker: until.Tracker, d: list[float]) -> verdicts.MetricStats:
    from memqual.host.run import calibrate

    (m,) = calibrate._look_decisions(*_look(d), threshold=0.05, alpha=0.01)
    return m.comparison


def test_a_look_on_fewer_than_16_blocks_tests_at_its_share_and_keeps_no_boundary():
    """The t of 3-15 blocks is not normal enough for the recursion: those
    looks take the raw p (exact for a t) at their share; from 16 blocks on
    the boundaries start."""
    from memqual.host.run import calibrate

    tracker = until.Tracker(threshold=0.05, alpha=0.01, comparisons_of=calibrate._look_decisions)
    rng = np.random.default_rng(4)
    d = list(rng.normal(0.0, 0.3, 20))
    for k in range(3, 21):
        tracker.update(k, *_look(d[:k]), fraction=k / 20)
    (m,) = tracker.metrics.values()
    assert [n for _, n, _, _ in m.boundaries] == [16, 17, 18, 19, 20] and until.MIN_BLOCKS_SEQUENTIAL == 16


def _volatile_records(host_a: str | None, host_b: str | None, n: int = 6) -> tuple[list, list]:
    """ksmd's cost per page without smart scan on icount, B 4 % cheaper,
    each record's environment naming its host (None: this machine), with
    the regime it compares under (the guests' dirtying, alike on both)."""
    import numpy as np

    from memqual.host.core.record import Measurement

    rng = np.random.default_rng(7)
    variant = {"pages": "4k", "smart_scan": 0}
    out: tuple[list, list] = ([], [])
    for block in range(1, n + 1):
        level = rng.normal(0.0, 0.01)
        for side, (factor, host) in enumerate(((1.0, host_a), (0.96, host_b))):
            environment = {"clock": "icount:0", **({"host_under_test": host} if host else {})}
            value = 6500.0 * factor * float(np.exp(level + rng.normal(0.0, 0.005)))
            for metric, sample, of in (
                ("ksmd_cpu_ns_per_page", value, variant),
                ("dirty_passes_per_scan", 1200.0, {"pages": "4k"}),
            ):
                out[side].append(
                    Measurement(
                        scenario="ksm.volatile_scan",
                        metric=metric,
                        unit="ns",
                        better="lower",
                        variant=of,
                        samples=[sample],
                        blocks=[block],
                        arm="AB"[side],
                        environment=environment,
                    )
                )
    return out


@pytest.mark.parametrize(
    ("hosts", "margin", "faster"),
    [
        (("6.1.0-57-amd64 in TCG+SVM", "6.12.111+deb12-amd64 in TCG+SVM"), 0.01, True),
        ((None, None), 0.05, False),
    ],
    ids=["host-under-test", "this-machine"],
)
def test_a_look_judges_a_host_under_test_at_its_own_margin(hosts, margin, faster):
    """The looks of --until-decided compare records, not results files: an
    arm's records that all name a host under test get the primary's margin
    there (1 %), so B's 4 % cheaper ksmd is faster; the same records of
    this machine stay at its 5 %, where the step is inside the margin."""
    a, b = _volatile_records(*hosts)
    found = until.compare_so_far(a, b, threshold=0.05, alpha=0.01)
    cost = next(m for m in found if m.metric == "ksmd_cpu_ns_per_page")
    assert cost.comparison.margin == margin
    assert (cost.verdict == "faster") is faster, cost.verdict
    assert until.on_host_under_test(a) is (hosts[0] is not None)

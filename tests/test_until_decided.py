"""memqual run --until-decided: rounds are added until every metric is
decided (or the budget is spent), and the rounds each needed are reported.
A fake avocado (tests/test_runjob.py's) stands in for the scenarios."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import test_runjob
from ksm_volatile_runs import ksm_records
from rich.console import Console
from test_runjob import _args, guest_kernel_args

from memqual.host.cli import run as run_command
from memqual.host.core.errors import BadInput
from memqual.host.run import job as runjob
from memqual.host.run import rounds as run_rounds
from memqual.host.run.bisect import until

fake = test_runjob.fake  # the fixture, shared with test_runjob


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


def _run(tmp_path: Path, *extra: str) -> tuple[int, str]:
    buf = io.StringIO()
    status = runjob.run(
        run_command.config_from_args(_args(tmp_path, *guest_kernel_args(tmp_path), *extra)),
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


class FakeTracker:
    """Decides ksm.merge after the first look and balloon.deflate after the
    third: the run must add blocks for the balloon test alone."""

    planned_looks = 10
    decided_at = 3

    def __init__(self) -> None:
        self.looks: list[tuple[int, int, int]] = []

    def alpha_at(self, look):
        return 0.001 if look <= self.planned_looks else 0.0

    def update(self, look, records_a, records_b):
        self.looks.append((look, len(records_a), len(records_b)))
        return look >= self.decided_at

    def undecided_scenarios(self):
        return {"balloon.deflate"}

    def to_json(self, stopped, budget_min):
        return {"stopped": stopped, "budget_min": budget_min, "looks": len(self.looks)}


@pytest.fixture()
def tracker(monkeypatch):
    fake_tracker = FakeTracker()
    monkeypatch.setattr(run_rounds, "make_tracker", lambda: fake_tracker)
    monkeypatch.setattr(run_rounds, "prebuild", lambda kernels, console: None)
    return fake_tracker


def test_blocks_are_added_only_for_the_undecided_scenarios_tests(tmp_path, fake, tracker):
    fake.plan(tests=PLAN2)
    status, out = _run(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["stopped"] == "every primary decided" and summary["blocks"] == 4
    assert [b["block"] for b in summary["added_blocks"]] == [3, 4]
    calls = fake.calls()
    assert len(calls) == 4  # once-per-arm, blocks 1-2, block 3, block 4
    for call, first in ((calls[2], "b3-A"), (calls[3], "b4-B")):
        argv = call["argv"]
        assert "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g$" in argv
        assert not any("test_ksm" in a for a in argv)
        variants = json.loads(Path(argv[argv.index("--json-variants-load") + 1]).read_text())
        assert variants[0]["variant_id"] == first and len(variants) == 2
    # records of every block reach the tracker: 3 per arm after 2 blocks, 2 more a block
    assert tracker.looks == [(1, 6, 6), (2, 8, 8), (3, 10, 10)]
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
    status, _ = _run(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert [b["tests"] for b in summary["added_blocks"]] == [
        ["e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g"]
    ] * 2
    a = json.loads((tmp_path / "out" / "A" / "results.json").read_text())
    off = next(m for m in a["metrics"] if m["metric"] == "deflate_off_s")
    assert off["blocks"] == [1], "the check ran once, in the once-per-arm job"
    assert not any("test_reporting_off" in a for c in fake.calls()[2:] for a in c["argv"])


def test_no_block_is_added_once_every_planned_look_is_spent(tmp_path, fake, tracker, monkeypatch):
    """Past the last planned look no alpha is left: a block more could not
    decide anything, so the run stops there, not when the budget ends."""
    monkeypatch.setattr(run_rounds, "planned_looks", lambda left_s, block_s: 3)
    tracker.decided_at = 99
    fake.plan(tests=PLAN2)
    status, out = _run(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["stopped"] == "the 3 planned looks are spent"
    assert summary["blocks"] == 4 and [look for look, *_ in tracker.looks] == [1, 2, 3]


def test_a_spent_budget_stops_with_what_is_undecided(tmp_path, fake, tracker):
    fake.plan(tests=PLAN2)
    status, out = _run(tmp_path, "--until-decided", "--budget", "0.0001")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["blocks"] == 2 and summary["stopped"].startswith("budget spent")
    assert len(fake.calls()) == 2


def test_decided_after_then_undecided_again_counts_from_the_last_time():
    m = until.MetricProgress("k", [(1, False, ""), (2, True, ""), (3, False, ""), (4, True, ""), (5, True, "")])
    assert m.rounds_needed == 4 and m.decided


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--until-decided"], "compares two arms"),
        (["--budget", "10"], "--until-decided only"),
    ],
)
def test_bad_input(tmp_path, extra, message):
    with pytest.raises(BadInput, match=message):
        run_command.config_from_args(_args(tmp_path, *extra))


def test_bad_budget(tmp_path):
    with pytest.raises(BadInput, match="minutes"):
        run_command.config_from_args(_args(tmp_path, *guest_kernel_args(tmp_path), "--until-decided", "--budget", "-1"))


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
        done = tracker.update(look, *per_look)
        if tracker.metrics and "balloon.deflate" not in tracker.undecided_scenarios():
            break
    deflate = next(m for m in tracker.metrics.values() if m.scenario == "balloon.deflate")
    assert deflate.verdict == "slower" and deflate.decided
    frozen_at = deflate.decided_at
    # Blocks added after: the decision of that look stands.
    tracker.update(look + 1, a, b)
    assert deflate.decided_at == frozen_at and deflate.verdict == "slower"
    summary = tracker.to_json("test", 1.0)
    assert summary["primaries_decided"] + summary["primaries_undecided"] == 2
    assert isinstance(done, bool)


def test_past_the_planned_looks_nothing_more_is_decided():
    tracker = until.Tracker(threshold=0.05, alpha=0.01, planned_looks=3)
    a, b = _records(1.3, 6, 0.01, seed=4)
    assert tracker.alpha_at(4) == 0.0
    assert tracker.update(4, a, b) is False and tracker.metrics == {}


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


@pytest.mark.parametrize(
    ("left_s", "block_s", "looks"),
    [
        (1500.0, 400.0, 4),  # this look and 3 more blocks of every test
        (300.0, 400.0, 1),  # not one more block: all of alpha at this look
        (0.0, 400.0, 1),  # the budget already spent
        (-50.0, 400.0, 1),
        (1e6, 400.0, until.PLANNED_LOOKS),  # never more than the most planned
        (1500.0, 0.0, until.PLANNED_LOOKS),  # no test time known yet
    ],
)
def test_planned_looks_come_from_the_budget_and_a_block_of_every_test(left_s, block_s, looks):
    assert run_rounds.planned_looks(left_s, block_s) == looks


def test_the_run_plans_its_looks_before_the_first(tmp_path, fake, tracker):
    """A budget that holds no block more than the first two: one planned
    look, so that look may spend the whole alpha."""
    fake.plan(tests=PLAN2)
    status, _ = _run(tmp_path, "--until-decided", "--budget", "0.01")
    assert status == 0
    assert tracker.planned_looks == 1
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["stopped"].startswith("budget spent")
    assert summary["blocks"] == 2 and [look for look, *_ in tracker.looks] == [1]

"""memqual run --until-decided: rounds are added until every metric is
decided (or the budget is spent), and the rounds each needed are reported.
A fake avocado (tests/test_runjob.py's) stands in for the scenarios."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import test_runjob
from rich.console import Console
from test_runjob import _args, guest_kernel_args

from memqual.host import runjob
from memqual.host.bisect import until
from memqual.host.errors import BadInput

fake = test_runjob.fake  # the fixture, shared with test_runjob


def _rec(scenario: str, metric: str, value: float, scale_b: float = 1.0) -> dict:
    # One sample a round: one independent replicate a round, as a scenario
    # that measures in one guest per test gives.
    return {
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
        runjob.config_from_args(_args(tmp_path, *guest_kernel_args(tmp_path), *extra)), Console(file=buf, width=160)
    )
    return status, buf.getvalue()


PLAN = [
    {
        "name": "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g",
        "status": "PASS",
        "records": [_rec("balloon.deflate", "deflate_s", 1.0, scale_b=1.5), _rec("balloon.inflate", "inflate_s", 2.0)],
    }
]


def test_rounds_are_added_until_every_metric_is_decided(tmp_path, fake):
    fake.plan(tests=PLAN)
    status, out = _run(tmp_path, "--until-decided")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    by = {m["key"].split(" [")[0]: m for m in summary["metrics"]}
    # Unchanged and noiseless: its CI sits inside the band once it has 2 replicates a side.
    assert by["balloon.inflate inflate_s"]["rounds_needed"] == 2
    # 1.5x slower: significant over 2 metrics (Holm: alpha/2) only with 6 replicates a side (2/924).
    assert by["balloon.deflate deflate_s"]["rounds_needed"] == 6
    assert by["balloon.deflate deflate_s"]["verdict"] == "slower"
    assert summary["rounds"] == 6 and summary["stopped"] == "every metric decided"
    calls = [c["env"]["MEMQUAL_RUN_LABEL"] for c in fake.calls()]
    assert calls == ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B", "B", "A"]  # ABBA goes on
    # Every job's JUnit XML has its own file: OUTPUT/<label>/junit/round-N.xml.
    xunits = [c["argv"][c["argv"].index("--xunit") + 1] for c in fake.calls()]
    assert xunits[:3] == [
        str(tmp_path / "out" / "A" / "junit" / "round-1.xml"),
        str(tmp_path / "out" / "B" / "junit" / "round-1.xml"),
        str(tmp_path / "out" / "B" / "junit" / "round-2.xml"),
    ]
    assert len(set(xunits)) == 12
    comparison = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert comparison["regressions"] == 1
    assert "after 6 round(s)" in out and "until decided: 6 round(s)" in out


def test_a_spent_budget_stops_with_what_is_undecided(tmp_path, fake):
    fake.plan(tests=PLAN)
    status, out = _run(tmp_path, "--until-decided", "--budget", "0.0001")
    assert status == 0
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["rounds"] == 2 and summary["stopped"].startswith("budget spent")
    deflate = next(m for m in summary["metrics"] if m["key"].startswith("balloon.deflate"))
    assert deflate["state"] == "undecided" and deflate["rounds_needed"] is None
    assert "underpowered (needs" in deflate["verdict"]


def test_decided_after_then_undecided_again_counts_from_the_last_time():
    m = until.MetricProgress("k", [(1, False, ""), (2, True, ""), (3, False, ""), (4, True, ""), (5, True, "")])
    assert m.rounds_needed == 4 and m.decided


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--until-decided"], "compares two kernels"),
        (["--budget", "10"], "--until-decided only"),
    ],
)
def test_bad_input(tmp_path, extra, message):
    with pytest.raises(BadInput, match=message):
        runjob.config_from_args(_args(tmp_path, *extra))


def test_bad_budget(tmp_path):
    with pytest.raises(BadInput, match="minutes"):
        runjob.config_from_args(_args(tmp_path, *guest_kernel_args(tmp_path), "--until-decided", "--budget", "-1"))

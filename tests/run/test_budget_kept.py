"""A budget kept by a running run (host/run/ab_run.py with
host/run/budget.py and host/run/look_outputs.py), on the fake avocado:
checks that no longer fit are not run, and say why; the looks start no
block they cannot finish; after each look its decisions are on disk, so a
run ended later (SIGTERM, SIGKILL) keeps them."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_avocado import guest_kernel_args, run_args
from fake_qemu import alive
from fake_tracker import FakeTracker
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.judge.sequential_run import SequentialRun
from memqual.host.judge.until_decided import Tracker
from memqual.host.run import ab_run
from memqual.host.run import blocks as run_blocks
from memqual.host.run import job as runjob


@pytest.fixture()
def tracker(monkeypatch):
    fake_tracker = FakeTracker()
    monkeypatch.setattr(ab_run, "make_tracker", lambda config=None: fake_tracker)
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    return fake_tracker


def _rec(scenario_name: str, metric: str, value: float, scale_b: float = 1.0) -> dict:
    return {
        "schema": "memqual.measurement/1",
        "scenario": scenario_name,
        "metric": metric,
        "unit": "s",
        "better": "lower",
        "settings": {"guest_mib": 1024},
        "samples": [value],
        "scale_B": scale_b,
    }


PLAN: list[dict] = [
    {
        "name": "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g",
        "status": "PASS",
        "records": [_rec("balloon.deflate", "deflate_s", 1.0, 1.5), _rec("balloon.inflate", "inflate_s", 2.0)],
    },
    {"name": "e2e/test_boot.py:Boot.test_ssh", "status": "PASS", "once": True},
]

BLOCKS_PLAN = PLAN[:1]


def _run(tmp_path: Path, *extra: str) -> tuple[int, str]:
    buf = io.StringIO()
    config = run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path), *extra))
    return runjob.run(config, Console(file=buf, width=200)), buf.getvalue()


def test_checks_that_no_longer_fit_are_not_run_and_say_why(tmp_path, fake, tracker, monkeypatch):
    """The checks' reserve is past what is left after the looks: they are
    skipped, the run says so and until-decided.json keeps why (written
    from the looks, not read back)."""
    monkeypatch.setattr(run_blocks, "CHECK_RUN_S", 3600.0)
    fake.plan(tests=PLAN)
    read_back: list[str] = []
    read_text = Path.read_text

    def read(path, *args, **kwargs):
        if path.name == "until-decided.json":
            read_back.append(str(path))
        return read_text(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Path, "read_text", read)
        status, out = _run(tmp_path, "--until-decided", "--budget", "20")
    assert read_back == []
    assert status == 0
    assert not any("kernel-checks" in a for c in fake.calls() for a in c["argv"])
    assert "the 1 once-per-arm checks were not run" in out
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["finished"] is True and summary["checks"]["run"] is False
    assert "were not run" in summary["checks"]["why"]
    assert (tmp_path / "out" / "comparison.json").is_file()


def test_the_looks_start_no_block_they_cannot_finish(tmp_path, fake, tracker, monkeypatch):
    """A block of the undecided tests takes longer than what is left: the
    look after blocks 1-2 is the last, and no block 3 starts."""
    monkeypatch.setattr(ab_run.BlockedRun, "seconds_per_block", lambda self, names: 1500.0)
    fake.plan(tests=BLOCKS_PLAN)
    status, _ = _run(tmp_path, "--until-decided", "--budget", "20")
    assert status == 0
    assert len(fake.calls()) == 1  # blocks 1-2 alone
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["blocks"] == 2 and summary["stopped"].startswith("budget spent")
    assert "takes about 25" in summary["stopped"]


def test_each_look_leaves_its_decisions_on_disk(tmp_path, fake, tracker, monkeypatch):
    """After every look until-decided.json, each arm's results.json and
    comparison.json are there, unfinished; the run's end rewrites them."""
    seen: list[tuple[int, bool, bool]] = []
    original = ab_run.look_outputs.write_look

    def spy(config, *args):
        original(config, *args)
        summary = json.loads((config.output / "until-decided.json").read_text())
        compared = json.loads((config.output / "comparison.json").read_text())
        results = json.loads((config.output / "A" / "results.json").read_text())
        assert any(m["metric"] == "deflate_s" for m in results["metrics"])
        seen.append((summary["looks"], summary["finished"], compared["finished"]))

    monkeypatch.setattr(ab_run.look_outputs, "write_look", spy)
    fake.plan(tests=BLOCKS_PLAN)
    status, _ = _run(tmp_path, "--until-decided")
    assert status == 0
    assert seen == [(1, False, False), (2, False, False), (3, False, False)]
    summary = json.loads((tmp_path / "out" / "until-decided.json").read_text())
    assert summary["finished"] is True
    assert "finished" not in json.loads((tmp_path / "out" / "comparison.json").read_text())


@pytest.mark.parametrize(
    ("finished", "why"),
    [(True, ""), (False, ""), (True, "the 1 once-per-arm checks were not run: they take about 60.0 min")],
)
def test_the_looks_file_says_whether_the_run_finished_and_why_checks_were_not_run(finished, why):
    """until-decided.json of a look (unfinished) or of the end, with the
    checks the budget left out, gives the same back to another process."""
    tracker = Tracker(threshold=0.05, alpha=0.01)
    looks = SequentialRun(tracker, "stopped", 20.0, 2, finished=finished, checks_not_run=why)
    data = json.loads(json.dumps(looks.to_json()))
    assert data["finished"] is finished and ("checks" in data) == bool(why)
    back = SequentialRun.from_json(data)
    assert (back.finished, back.checks_not_run) == (finished, why)


# The fake tracker's decisions, with each look's comparison made as a
# Tracker makes it: the interim comparison.json is built from that one.
KILLED_RUN = textwrap.dedent(
    """\
    import dataclasses, io, pathlib, sys
    from rich.console import Console
    from fake_avocado import guest_kernel_args, run_args
    from fake_tracker import FakeTracker
    from memqual.host.cli import run as run_command
    from memqual.host.judge import until_decided
    from memqual.host.run import job as runjob
    from memqual.host.run import ab_run

    class Comparing(FakeTracker):
        def update(self, look, records_a, records_b, fraction=1.0):
            found = super().update(look, records_a, records_b, fraction)
            now = until_decided.compare_so_far(records_a, records_b, threshold=self.threshold, alpha=self.alpha)
            return dataclasses.replace(found, compared=tuple(now))

    ab_run.make_tracker = lambda config=None: Comparing()
    ab_run.prebuild = lambda kernels, console: None
    tmp = pathlib.Path(sys.argv[1])
    args = run_args(tmp, *guest_kernel_args(tmp), "--until-decided")
    runjob.run(run_command.config_from_args(args), Console(file=io.StringIO()))
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_ended_after_its_first_look_keeps_what_it_decided(tmp_path, fake, sig):
    """A run ended in its third block (the first added, after look 1), by
    SIGTERM or by SIGKILL that lets nothing clean up: look 1's decisions,
    each arm's results and the comparison are on disk and read.  A real
    process, ended for real: some seconds, as the run's own tests take."""
    fake.plan(tests=BLOCKS_PLAN, hang_at_call=2)
    hang = tmp_path / "hang.pid"
    support = Path(__file__).resolve().parent.parent / "support"
    env = {
        **os.environ,
        "FAKE_HANG": str(hang),
        "MEMQUAL_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": os.pathsep.join([str(support), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    hanging = 0
    try:
        deadline = time.monotonic() + 60
        while not (hang.exists() and hang.read_text().endswith("\n")):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run did not reach its third block"
            time.sleep(0.05)  # polling a file the fake writes
        hanging = int(hang.read_text())
        proc.send_signal(sig)
        proc.wait(timeout=20)
        output = tmp_path / "out"
        summary = json.loads((output / "until-decided.json").read_text())
        assert summary["finished"] is False and summary["looks"] == 1 and summary["blocks"] == 2
        assert summary["stopped"] == "not finished: look 1 was the last taken"
        compared = json.loads((output / "comparison.json").read_text())
        assert compared["finished"] is False and "look 1" in compared["note"]
        assert {row["metric"] for row in compared["decisions"]["rows"]} >= {"deflate_s", "inflate_s"}
        for arm in ("A", "B"):
            results = json.loads((output / arm / "results.json").read_text())
            deflate = next(m for m in results["metrics"] if m["metric"] == "deflate_s")
            assert deflate["blocks"] == [1, 2]
    finally:
        if hanging and alive(hanging):
            os.kill(hanging, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()

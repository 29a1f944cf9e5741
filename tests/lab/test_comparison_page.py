"""python -m memqual.lab.comparison_page (lab/comparison_page.py): a
finished run's page rendered again from its directory, deciding as the run
did."""

from __future__ import annotations

import json

import comparison_pages as cp
import pytest

from memqual.host.judge import primaries
from memqual.host.judge.exit_status import ExitStatus
from memqual.host.judge.sequential_run import SequentialRun
from memqual.host.judge.verdicts import SLOWER
from memqual.lab import comparison_page


def _write(tmp_path, run, summary=True):
    for side, res in (("A", run.a), ("B", run.b)):
        (tmp_path / side).mkdir()
        (tmp_path / side / "results.json").write_text(json.dumps(res.to_json()))
    if summary:
        (tmp_path / "until-decided.json").write_text(json.dumps(run.summary))


def test_the_page_of_a_run_dir_shows_the_looks_decisions_and_their_exit_status(tmp_path, capsys):
    run = cp.run(cp.PRIMARIES[:2] + cp.controls(3, 0.02), blocks=5, trials=50)
    _write(tmp_path, run)
    assert comparison_page.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # The looks decided balloon.deflate slower (5.8x): the run's status, 1.
    assert run.table.exit_status == 1 and "exit status of the decisions: 1" in out
    html = (tmp_path / "comparison.html").read_text()
    assert "exit 1</span>" in html and "The looks of --until-decided" in html and "power alone" in html


def test_without_looks_the_page_is_one_comparison(tmp_path, capsys):
    run = cp.run(cp.PRIMARIES[:2] + cp.controls(3, 0.02), blocks=4, trials=50)
    _write(tmp_path, run, summary=False)
    page = tmp_path / "elsewhere.html"
    assert comparison_page.main([str(tmp_path), "--html", str(page)]) == 0
    assert "decided by one comparison" in page.read_text()


def test_a_dir_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert comparison_page.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "A/results.json" in err
    assert not (tmp_path / "comparison.html").exists()


@pytest.mark.parametrize(
    ("summary", "status"),
    [
        ({"controls_flagged": ["c"], "metrics": []}, ExitStatus.HOST_DRIFTED),
        ({"metrics": [{"key": "k", "role": primaries.PRIMARY, "state": "decided", "verdict": SLOWER}]}, 1),
        ({"metrics": [{"key": "k", "role": primaries.EXPLORATORY, "state": "decided", "verdict": SLOWER}]}, 0),
        ({"metrics": [{"key": "k", "role": primaries.PRIMARY, "state": "undecided", "verdict": SLOWER}]}, 0),
    ],
)
def test_a_finished_runs_looks_give_the_trackers_status(summary, status):
    """The page's exit status is the looks' as the run's Tracker gave it,
    read back from until-decided.json by the one exit rule."""
    looks = SequentialRun.from_json({"threshold": 0.05, "alpha": 0.01, **summary})
    assert looks.exit_status == status


def test_a_looks_file_that_is_not_a_runs_is_one_line_and_exit_2(tmp_path, capsys):
    run = cp.run(cp.PRIMARIES[:1], blocks=3, trials=20)
    _write(tmp_path, run, summary=False)
    (tmp_path / "until-decided.json").write_text(json.dumps({"metrics": [{"key": "k"}]}))
    assert comparison_page.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "until-decided.json: not the JSON memqual run writes" in err

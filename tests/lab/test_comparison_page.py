"""python -m memqual.lab.comparison_page (lab/comparison_page.py): a
finished run's page rendered again from its directory, deciding as the run
did."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import comparison_pages as cp
import pytest
from fake_avocado import ksm_record, run_args
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.core import scenario
from memqual.host.core.profiles import AB
from memqual.host.judge import primaries
from memqual.host.judge.exit_status import ExitStatus
from memqual.host.judge.sequential_run import SequentialRun
from memqual.host.judge.verdicts import SLOWER
from memqual.host.run import host_scope
from memqual.host.run import job as runjob
from memqual.images.built_kernels import BuiltKernel
from memqual.images.kernel_arms import PatchArms
from memqual.images.kernel_patches import Patch
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


def _host_patch_run(tmp_path: Path) -> host_scope.HostPatchRun:
    """What run --host-patch would have built for a patch of mm/ksm.c (no build)."""
    source = "linux-source-6.1 6.1.192-3"
    a, b = (
        BuiltKernel(f"6.1.192-memqual-{x * 16}", "6.1.192", tmp_path / x, source, "0" * 64, (), (), "gcc", "0" * 16)
        for x in "ab"
    )
    patch = Patch(tmp_path / "0001-ksm.patch", b"", "f" * 64, "mm/ksm: scan less", ("mm/ksm.c",))
    arms = PatchArms(a, b, (patch,), ("CONFIG_KSM: n -> y",), ("kernel/mm/ksm.o: differs",))
    scope = host_scope.host_scope_of(("mm/ksm.c",), scenario.table(), AB)
    return host_scope.HostPatchRun(arms, scope, ("debian:6.1",), ("images/host.config",))


def _card(page: str) -> str:
    """The patch card of a comparison page, with the arms' lines above it."""
    start = page.index("<p class='sub'><b>")
    return page[start : page.index("</div>", page.index("<div class='card'>", start)) + len("</div>")]


def test_a_host_patch_run_s_page_rendered_again_has_the_run_s_host_patch_card(
    tmp_path: Path, fake, figures_not_drawn: None
) -> None:
    """The run's own page (host/run/ab_run.py, from comparison.json's
    ``host_patch``) and the lab's, from host-patch.json as run --host-patch
    writes it (host/cli/host_patch.py): the same arms' names and card."""
    fake.plan(tests=[{"name": "e2e/test_ksm.py:KsmTest.test_merge", "status": "PASS", "records": ksm_record(4.0)}])
    run = _host_patch_run(tmp_path)
    hosts = ["--host-kernel", run.arms.a.name, "--host-kernel", run.arms.b.name]
    config = dataclasses.replace(
        run_command.config_from_args(run_args(tmp_path, *hosts)), scope=run.scope.test_scope("e2e"), host_patch=run
    )
    runjob.run(config, Console(file=io.StringIO(), width=200))
    (config.output / "host-patch.json").write_text(json.dumps(run.to_json(), indent=2))
    again = tmp_path / "again.html"
    assert comparison_page.main([str(config.output), "--html", str(again)]) == 0
    ran = _card((config.output / "comparison.html").read_text())
    assert "The host patch under test" in ran and "What ran: the host patch touches host code ksm.merge" in ran
    assert f"B host 6.1.192-memqual-{'b' * 16} (+ mm/ksm: scan less)" in ran
    assert _card(again.read_text()) == ran


def test_a_patch_record_that_is_not_a_runs_is_one_line_and_exit_2(tmp_path, capsys):
    run = cp.run(cp.PRIMARIES[:1], blocks=3, trials=20)
    _write(tmp_path, run, summary=False)
    (tmp_path / "host-patch.json").write_text(json.dumps({"a": {}}))
    assert comparison_page.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "host-patch.json: not the JSON memqual run writes" in err

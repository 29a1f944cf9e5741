"""memqual writes each job's wall time against its test runs' own
(host/run/avocado.py JobTime) into the job's directory: the figure the
planner's per-job overhead (host/run/blocks.py job_overhead_s) is checked
against."""

import io
import json
import sys
import textwrap

import pytest
from rich.console import Console

from memqual.host.run import avocado as run_avocado_job
from memqual.host.run import config as run_config

# A stand-in for `avocado run`: one job directory whose two tests took
# 1.5 s and 2.0 s by Avocado's count, made in a fraction of that.
FAKE_AVOCADO = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys, time
    argv = sys.argv[1:]
    job = os.path.join(argv[argv.index("--job-results-dir") + 1], "job-2026-12-02T06.00-fake")
    os.makedirs(job)
    tests = [dict(name="t.py:T.test_%d" % i, status="PASS", time_elapsed=s) for i, s in enumerate((1.5, 2.0))]
    time.sleep(0.2)
    json.dump(dict(tests=tests, total=2, **{{"pass": 2}}), open(os.path.join(job, "results.json"), "w"))
    """
)


def test_the_overhead_is_wall_time_less_the_test_runs_own():
    runs = [run_config.TestOutcome("a", "PASS", "", 100.0), run_config.TestOutcome("b", "PASS", "", 69.1)]
    t = run_avocado_job.job_time(188.3, runs)
    assert t.test_runs == 2
    assert t.overhead_s == 188.3 - 169.1
    assert t.to_json()["overhead_per_test_run_s"] == round((188.3 - 169.1) / 2, 3)


def test_a_test_run_without_a_time_counts_as_none_of_it():
    t = run_avocado_job.job_time(5.0, [run_config.TestOutcome("a", "ERROR", "", None)])
    assert (t.test_runs, t.tests_s, t.overhead_s) == (1, 0.0, 5.0)


def test_a_job_of_no_test_runs_has_no_per_run_figure():
    assert run_avocado_job.job_time(1.0, []).to_json()["overhead_per_test_run_s"] is None


def test_run_avocado_writes_the_jobs_time_beside_its_results(tmp_path, monkeypatch):
    script = tmp_path / "avocado"
    script.write_text(FAKE_AVOCADO.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("MEMQUAL_AVOCADO", str(script))
    tests = tmp_path / "e2e"
    tests.mkdir()
    config = run_config.RunConfig(output=tmp_path / "out", tests=tests)
    job = run_avocado_job.run_avocado(config, tmp_path / "out" / "avocado", None, Console(file=io.StringIO()))
    assert job.job_dir is not None
    written = json.loads((job.job_dir / run_avocado_job.JOB_TIME).read_text())
    assert written["test_runs"] == 2
    assert written["tests_s"] == 3.5
    # Measured, not assumed: this job took far less than its tests claim.
    assert 0.2 <= written["wall_s"] < 3.5
    assert written["overhead_s"] == pytest.approx(written["wall_s"] - 3.5, abs=0.002)

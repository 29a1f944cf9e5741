"""memqual export --kcidb: the KCIDB JSON of a run validates with kcidb-io
and carries every metric (number and unit), every claim verdict and the
environment.  The run is made by memqual run against a fake avocado."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from fake_avocado import FAKE_AVOCADO, ksm_record, run_args
from kcidb_io import schema
from rich.console import Console

from memqual.host.cli import main as cli
from memqual.host.cli import run as run_command
from memqual.host.report import export
from memqual.host.run import job as runjob


@pytest.fixture()
def results_file(tmp_path: Path, monkeypatch) -> Path:
    script = tmp_path / "avocado"
    script.write_text(FAKE_AVOCADO.format(python=sys.executable))
    script.chmod(0o755)
    plan = {
        "tests": [
            {"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": ksm_record(7.8)},
            {"name": "e2e/test_balloon.py:Balloon.test_inflate", "status": "CANCEL", "reason": "no balloon"},
        ]
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    monkeypatch.setenv("MEMQUAL_AVOCADO", str(script))
    monkeypatch.setenv("FAKE_PLAN", str(tmp_path / "plan.json"))
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls.jsonl"))
    console = Console(file=io.StringIO(), width=120)
    assert runjob.run(run_command.config_from_args(run_args(tmp_path)), console) == 0
    return tmp_path / "out" / "results.json"


def test_the_export_validates_and_carries_metrics_claims_and_environment(results_file, tmp_path, capsys):
    out = tmp_path / "kcidb.json"
    assert cli.main(["export", "--kcidb", str(out), str(results_file)]) == 0
    assert "validated with kcidb-io" in capsys.readouterr().out
    data = json.loads(out.read_text())
    schema.LATEST.validate(data)  # what a KCIDB submitter checks
    assert schema.LATEST.is_valid(data)
    results = json.loads(results_file.read_text())
    tests = data["tests"]
    metric_tests = [t for t in tests if t["misc"].get("key")]
    assert len(metric_tests) == len(results["metrics"])
    for t in metric_tests:
        m = next(m for m in results["metrics"] if m["key"] == t["misc"]["key"])
        assert t["status"] == "DONE"
        assert t["number"] == {"value": m["summary"]["median"], "unit": m["unit"]}
        assert t["path"].startswith("memqual.ksm.volatile_scan.")
    paths = {t["path"] for t in metric_tests}
    assert {f"memqual.ksm.volatile_scan.ksmd_cpu_ns_per_page.pages-4k_smart_scan-{v}" for v in (0, 1)} <= paths
    claims = {t["path"]: t for t in tests if t["path"].startswith("memqual.claims.")}
    assert len(claims) == len(results["claims"])
    assert claims["memqual.claims.ksm-volatile-4k"]["status"] == "PASS"  # reproduced
    assert claims["memqual.claims.ksm-volatile-4k"]["number"]["unit"] == "x"
    assert claims["memqual.claims.balloon-bitmap"]["status"] == "SKIP"  # not measurable here
    e2e = {t["path"]: t["status"] for t in tests if t["path"].startswith("memqual.e2e.")}
    assert e2e == {
        "memqual.e2e.test_ksm.Ksm.test_volatile": "PASS",
        "memqual.e2e.test_balloon.Balloon.test_inflate": "SKIP",
    }
    env = tests[0]["environment"]["misc"]
    assert env["host_kernel"] == "6.18.0-fake"
    assert all(t["build_id"] == data["builds"][0]["id"] for t in tests)
    assert data["builds"][0]["checkout_id"] == data["checkouts"][0]["id"]
    # The same run exported twice has the same ids: KCIDB merges, not doubles.
    again = export.to_kcidb(results)
    assert [t["id"] for t in again["tests"]] == [t["id"] for t in tests]
    assert len({t["id"] for t in tests}) == len(tests)


def test_data_the_schema_rejects_is_an_error_not_a_file(results_file):
    data = export.to_kcidb(json.loads(results_file.read_text()))
    data["tests"][0]["status"] = "MAYBE"
    with pytest.raises(export.ExportInvalid, match="rejects the export at tests/0/status"):
        export.validate(data)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "--kcidb", "out.json", "missing.json"], "no such results file"),
        (["export", "--kcidb", "out.json", "--origin", "Mem Qual", "__RESULTS__"], "KCIDB origins"),
        (["export", "--kcidb", "no/such/dir/out.json", "__RESULTS__"], "no such directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, results_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [str(results_file) if a == "__RESULTS__" else a for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_paths_hold_only_what_kcidb_allows():
    assert (
        export._path("memqual", "balloon.free_page_reporting", "rss_return_s", "free_page_reporting-True")
        == "memqual.balloon.free_page_reporting.rss_return_s.free_page_reporting-True"
    )
    assert export._path("memqual", "e2e", "test_x:Class.test_y?") == "memqual.e2e.test_x_Class.test_y"

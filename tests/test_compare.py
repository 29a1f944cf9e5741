"""`memqual compare` on synthetic results files."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from host import claims, compare, report
from host.errors import BadInput
from host.record import Measurement


def _records(scan_rate: float = 1000.0, inflate_s: float = 0.8, seed: int = 1) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    return [
        Measurement(
            scenario="ksm.volatile_scan", metric="pages_per_s", unit="pages/s", better="higher",
            variant={"smart_scan": 1}, settings={"pages_to_scan": 4000},
            samples=list(scan_rate * (1 + rng.normal(0, 0.01, 6))), environment={"guest_kernel_sha256": f"k{seed}"},
        ),
        Measurement(
            scenario="balloon.inflate", metric="inflate_s", unit="s", better="lower",
            samples=list(inflate_s * (1 + rng.normal(0, 0.01, 6))),
        ),
    ]


def _results(tmp_path, name: str, records: list[Measurement]) -> str:
    res = report.build_results(claims.evaluate(claims.load(), records), records, host_fallback=False)
    path = tmp_path / f"{name}.json"
    report.write_results(res, path)
    return str(path)


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    compare.register(parser.add_subparsers())
    args = parser.parse_args(["compare", *argv])
    return args.handler(args)


def test_same_distribution_is_no_difference_and_exit_0(tmp_path, capsys):
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", _records(seed=2))
    assert _run([a, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["regressions"] == 0
    assert {m["verdict"] for m in out["metrics"]} == {"no difference"}
    assert out["environment_differences"]["guest_kernel_sha256"] == {"a": "k1", "b": "k2"}


def test_a_deliberately_slowed_run_is_flagged_with_exit_1(tmp_path, capsys):
    # B scanned at 60 % of A's rate (as with a smaller pages_to_scan).
    a = _results(tmp_path, "a", _records(scan_rate=1000.0, seed=1))
    b = _results(tmp_path, "b", _records(scan_rate=600.0, seed=2))
    assert _run([a, b, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    by = {m["metric"]: m for m in out["metrics"]}
    assert by["pages_per_s"]["verdict"] == "slower"
    assert by["pages_per_s"]["ratio"] == pytest.approx(0.6, rel=0.03)
    assert by["pages_per_s"]["p_value"] < 0.01
    assert by["inflate_s"]["verdict"] == "no difference"
    # The table form says the same, variants visible (not eaten as markup).
    assert _run([a, b]) == 1
    out = capsys.readouterr().out
    assert "slower" in out and "[smart_scan=1]" in out


def test_html_page_names_the_regression_and_plots_every_ratio(tmp_path, capsys):
    a = _results(tmp_path, "a", _records(scan_rate=1000.0, seed=1))
    b = _results(tmp_path, "b", _records(scan_rate=600.0, seed=2))
    page = tmp_path / "out" / "comparison.html"
    assert _run([a, b, "--html", str(page)]) == 1
    assert f"wrote {page}" in capsys.readouterr().out
    text = page.read_text()
    assert "1 metric(s) slower beyond 5%" in text
    assert "ksm.volatile_scan pages_per_s [smart_scan=1]" in text
    assert text.count("data:image/png;base64,") == 1  # the forest plot, inline: one self-contained file
    assert "guest_kernel_sha256" in text  # what differs between the environments
    # Nothing from a results file reaches the page unescaped.
    assert "<script" not in text


def test_lower_is_better_metrics_get_faster_right(tmp_path, capsys):
    a = _results(tmp_path, "a", _records(inflate_s=0.8, seed=1))
    b = _results(tmp_path, "b", _records(inflate_s=0.5, seed=2))
    assert _run([a, b, "--json"]) == 0
    by = {m["metric"]: m for m in json.loads(capsys.readouterr().out)["metrics"]}
    assert by["inflate_s"]["verdict"] == "faster"


def test_the_threshold_decides_what_counts(tmp_path):
    a = _results(tmp_path, "a", _records(scan_rate=1000.0, seed=1))
    b = _results(tmp_path, "b", _records(scan_rate=970.0, seed=2))  # 3 % slower, real
    assert _run([a, b, "--threshold", "0.05"]) == 0
    assert _run([a, b, "--threshold", "0.01"]) == 1


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.unlink(), "no such results file"),
        (lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]), "truncated"),
        (lambda p: p.write_text(p.read_text().replace("memqual.results/1", "memqual.results/0")), "another memqual version"),
        (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "memqual_version": "0.0.1"})), "same version"),
        (lambda p: p.write_text(json.dumps({"schema": "memqual.results/1"})), "missing or of the wrong type"),
    ],
)
def test_unusable_files_are_bad_input_in_one_line(tmp_path, damage, message):
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", _records(seed=2))
    from pathlib import Path

    damage(Path(b))
    with pytest.raises(BadInput, match=message) as info:
        _run([a, b])
    assert "\n" not in str(info.value)
    assert info.value.exit_status == 2


def test_different_scenario_sets_are_bad_input(tmp_path):
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", _records(seed=2)[:1])
    with pytest.raises(BadInput, match="only in A: balloon.inflate"):
        _run([a, b])


def test_mismatched_metrics_are_bad_input(tmp_path):
    recs_b = _records(seed=2)
    recs_b[0].metric = "pages_per_cpu_s"  # same scenarios, another metric
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", recs_b)
    with pytest.raises(BadInput, match="mismatched metrics: 1 only in A, 1 only in B"):
        _run([a, b])


def test_a_changed_setting_is_compared_and_reported(tmp_path, capsys):
    # The "deliberately slowed" run: a smaller pages_to_scan, 40 % slower.
    recs_b = _records(scan_rate=600.0, seed=2)
    recs_b[0].settings = {"pages_to_scan": 100}
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", recs_b)
    assert _run([a, b, "--json"]) == 1
    by = {m["metric"]: m for m in json.loads(capsys.readouterr().out)["metrics"]}
    assert by["pages_per_s"]["verdict"] == "slower"
    assert by["pages_per_s"]["settings_changed"] == {"pages_to_scan": {"a": 4000, "b": 100}}
    assert _run([a, b]) == 1
    assert "pages_to_scan: 4000 -> 100" in capsys.readouterr().out


def test_bad_threshold_is_an_argparse_error():
    with pytest.raises(SystemExit) as info:
        _run(["a.json", "b.json", "--threshold", "2"])
    assert info.value.code == 2

"""results.json, report.html and the terminal tables from synthetic records."""

from __future__ import annotations

import io
import json
import math
import re
from typing import Any

import pytest
from rich.console import Console

from memqual.host.core.environment import FINGERPRINT_KEYS
from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import REPRODUCED
from memqual.host.judge.results import (
    SCHEMA,
    Results,
    build_results,
    environment_fingerprint,
    load_results,
    metrics_of,
    write_results,
)
from memqual.host.report import claim_lines, report, terminal


def _rec(
    variant: dict, samples: list[float], metric: str = "ksmd_cpu_ns_per_page", unit: str = "ns", **kw
) -> Measurement:
    base: dict[str, Any] = dict(
        scenario="ksm.volatile_scan",
        metric=metric,
        unit=unit,
        better="lower",
        claim="ksm-volatile-4k",
        settings={"pages_to_scan": 4000},
    )
    base.update(kw)
    # Every sample from its own fresh guest: independent replicates.
    return Measurement(variant=variant, samples=samples, replicates=[[x] for x in samples], **base)


def _records() -> list[Measurement]:
    env = {"host_kernel": "6.18.0", "qemu": "7.2.15", "accel": "tcg", "guest_kernel_sha256": "ab" * 32}
    return [
        _rec({"smart_scan": 0, "pages": "4k"}, [0.80, 0.82, 0.79, 0.81, 0.80], environment=env),
        _rec({"smart_scan": 1, "pages": "4k"}, [0.10, 0.11, 0.10, 0.105, 0.10], environment=env),
        _rec(
            {"smart_scan": 0, "pages": "4k"},
            [0.80, 0.82, 0.79, 0.81, 0.80],
            metric="ksmd_cpu_s_per_full_scan",
            unit="s",
            environment=env,
        ),
        _rec(
            {"smart_scan": 0, "pages": "4k"},
            [1.0, 2.0, 3.0],
            metric="full_scans_per_s",
            better="higher",
            unit="1/s",
            environment={**env, "host_kernel": "6.18.1"},
        ),
    ]


@pytest.fixture()
def results() -> Results:
    recs = _records()
    return build_results(evaluate(load(), recs), recs, run={"profile": "quick"}, host_fallback=False)


def test_fingerprint_keeps_disagreements():
    env = environment_fingerprint(_records(), host_fallback=False)
    assert env["qemu"] == "7.2.15"
    assert env["host_kernel"] == "6.18.0"  # the most common value...
    assert sorted(env["host_kernel_all"]) == ["6.18.0", "6.18.1"]  # ...and every value seen
    assert env["guest_kernel_sha256"] == "ab" * 32
    assert env["kvm_nr_memslots"] is None  # no record said: null, and said so
    assert env["environment_sources"]["kvm_nr_memslots"].startswith("unknown")
    assert list(env)[: len(FINGERPRINT_KEYS)] == list(FINGERPRINT_KEYS)


def test_host_fallback_fills_what_no_record_said():
    env = environment_fingerprint([], host_fallback=True)
    assert env["host_kernel"]  # platform.release() always answers
    assert env["environment_sources"]["host_kernel"].startswith("host")


def test_results_round_trip_and_hold_every_claim(results, tmp_path):
    path = write_results(results, tmp_path / "results.json")
    loaded = load_results(path).to_json()
    assert loaded["schema"] == SCHEMA
    assert [c["id"] for c in loaded["claims"]] == [c.id for c in load()]
    ksm = next(c for c in loaded["claims"] if c["id"] == "ksm-volatile-4k")
    assert ksm["verdict"] == REPRODUCED
    # Paired units: the geometric mean of each guest's own B / A.
    off, on = [0.80, 0.82, 0.79, 0.81, 0.80], [0.10, 0.11, 0.10, 0.105, 0.10]
    assert ksm["measured"] == pytest.approx(math.prod(b / a for a, b in zip(on, off, strict=True)) ** (1 / 5))
    assert ksm["ci"][0] <= ksm["measured"] <= ksm["ci"][1]
    assert ksm["samples"]["b"] == [0.80, 0.82, 0.79, 0.81, 0.80]
    assert loaded["scenarios"] == ["ksm.volatile_scan"]
    assert len(loaded["metrics"]) == 4  # one per (metric, variant) of _records()
    assert "NaN" not in path.read_text()


def test_two_records_of_one_metric_are_both_kept():
    recs = _records()
    keys = [m.key for m in metrics_of(recs + recs[:1])]
    assert len(keys) == 5 and len(set(keys)) == 5
    assert sum(k.endswith(" #2") for k in keys) == 1


def test_kernbench_table_is_mean_and_stdev_per_variant(results):
    tables = terminal.kernbench_tables(results)
    assert len(tables) == 1
    title, columns, rows = tables[0]
    assert title == "ksm.volatile_scan  pages_to_scan=4000"
    assert columns == ["pages=4k, smart_scan=0", "pages=4k, smart_scan=1"]
    by_metric = {row[0]: row[1:] for row in rows}
    assert by_metric["full_scans_per_s (1/s)"] == ["2 (1)", ""]  # mean 2, stdev 1, no smart_scan=1 record
    # Seconds below 1 read better as ms: 0.804 s (0.0114) -> 804 (11.4).
    assert by_metric["ksmd_cpu_s_per_full_scan (ms)"][0] == "804 (11.4)"


def test_terminal_tables_name_every_claim_and_its_verdict(results):
    buf = io.StringIO()
    terminal.print_tables(results, Console(file=buf, width=140, force_terminal=False))
    out = buf.getvalue()
    for c in results.claims:
        assert c.id in out
    assert "mean (stdev)" in out
    # The records name no clock (written before records did): the clock column says so.
    assert re.search(r"ksm-volatile-4k\s+│\s+successor\s+│\s+not recorded\s+│\s+reproduced[^│]*│\s+7\.811x \[", out)


def test_html_is_self_contained_with_a_plot_per_measured_claim(results, tmp_path):
    path = report.write_html(results, tmp_path / "report.html")
    html = path.read_text()
    assert "<script" not in html and not re.search(r"src=['\"]https?:", html)
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    measured = [c for c in results.claims if c.data["measured"] is not None]
    groups = {(m.scenario, m.metric) for m in results.metrics}
    assert len(images) == len(measured) + len(groups)  # claim plots + distributions
    import base64

    assert base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    for c in results.claims:
        assert f"id='{c.id}'" in html
    assert "not measurable" in html and "reproduced" in html
    # Each card starts with its evidence class and what was measured, once.
    assert "Evidence (successor): ksmd&#39;s CPU time per page covered" in html
    assert "Evidence: not measurable. " in html and "What would measure it:" in html
    assert "pages_to_scan=4000" in html


def test_a_directory_or_a_foreign_json_is_not_a_results_file(tmp_path):
    with pytest.raises(BadInput, match="is a directory"):
        load_results(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "memqual.measurement/1"}))
    with pytest.raises(BadInput, match="a measurement record, not a results.json"):
        load_results(other)


def test_the_memslot_card_shows_the_nic_path_and_the_layouts_no_2011_host_ran():
    from pathlib import Path

    from memqual.host.memslots import guest_layouts as G
    from memqual.host.memslots import qemu_layout as Q

    views = json.loads((Path(__file__).parents[1] / "data" / "guest-flatviews.json").read_text())["configs"]
    recs = [
        G.layout_record(name, [Q.FlatRange(*r) for r in views[name]["ranges"]], views[name]["settings"])
        for name in ("pc-rtl8139", "pc-64-dimms")
    ]
    res = build_results(evaluate(load(), recs), recs, run={"profile": "quick"}, host_fallback=False)
    html = report.render_html(res)
    assert "at the NIC BAR: A, B, B / A" in html and "4, 35, 8.750x" in html
    assert "refused (more than 32 user slots): not counted" in html
    # Neither is the seed's guest: listed, not deciding.
    assert "layout of the guest seed 000 describes was read in this run" in html


def _scenario_results() -> Results:
    """Results of the KSM and balloon scenarios' own record builders, fed
    synthetic raw measurements (tests/judge/test_claims_scenarios.py)."""
    from balloon_records import balloon_records
    from ksm_volatile_runs import ksm_records

    recs = ksm_records(4.4, skip_share=73 / 88) + ksm_records(5.5, skip_share=0.885, pages="thp")
    recs += balloon_records(0.0)
    return build_results(evaluate(load(), recs), recs, run={"profile": "quick"}, host_fallback=False)


def test_cards_show_the_analogue_class_the_tcg_qualifier_and_smart_scans_ceiling(tmp_path):
    html = report.write_html(_scenario_results(), tmp_path / "report.html").read_text()
    assert "Evidence (analogue): Inflates of 768 of 1024 MiB timed by the host" in html
    assert html.count("class='qualifier'") == 4  # both balloon and both KSM claims, under TCG
    assert "This verdict holds under TCG on this host, saying nothing about KVM" in html
    assert html.count("class='ceiling'") == 2  # both KSM claims
    assert "out of reach at this run&#39;s skip share 0.8295" in html  # the 4 KiB band (from 6x)
    assert "out of its reach by design, whatever the workload" in html  # THP's band (from 12x)
    assert "whatever the workload at most 9x" in html


def test_a_published_figure_in_ms_is_drawn_in_seconds_on_a_seconds_axis():
    bitmap = next(c for c in _scenario_results().claims if c.id == "balloon-bitmap")
    a, b = bitmap.data["a"], bitmap.data["b"]
    assert (a["unit"], a["published_unit"], a["published"]) == ("s", "ms", 1237)
    assert claim_lines.published_on_axis(a, a["unit"]) == pytest.approx(1.237)
    assert claim_lines.published_on_axis(b, b["unit"]) == pytest.approx(2.031)
    assert claim_lines.published_on_axis({"published": 5.0, "published_unit": "%"}, "s") is None


def test_a_hostile_name_in_a_results_file_is_escaped_once_everywhere_on_the_page():
    from hostile import ESCAPED, HOSTILE, assert_escaped_once

    recs = [
        Measurement(
            scenario=HOSTILE,
            metric=HOSTILE,
            unit="s",
            better="lower",
            variant={"v": HOSTILE},
            settings={"s": HOSTILE},
            samples=[1.0, 1.1, 1.2],
            replicates=[[1.0], [1.1], [1.2]],
            environment={"qemu": HOSTILE},
        ),
        # The balloon's own section of the page: its size label comes from the records too.
        Measurement(
            scenario="balloon.request_size",
            metric="inflate_s",
            unit="s",
            better="lower",
            variant={"per_request": HOSTILE, "pfns": 256},
            settings={"guest_mib": 1024},
            samples=[],
            replicates=[[1.0], [1.1]],
        ),
    ]
    run = {"label": HOSTILE, "tests": [{"id": HOSTILE, "status": "FAIL", "time": 1.0, "reason": HOSTILE}]}
    res = build_results(evaluate(load(), recs), recs, run=run, host_fallback=False)
    html = report.render_html(res)
    assert_escaped_once(html)
    assert "Balloon: time against PFNs per request" in html
    # The run's label, the mean and spread tables, the plot's alt text, the
    # balloon's sizes, the environment and the tests.
    assert html.count(ESCAPED) >= 8, html.count(ESCAPED)

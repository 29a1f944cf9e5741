"""The request-size curve: points and costs read from records or a
results.json, the report's section, the PNG and ``memqual balloon curve``."""

from __future__ import annotations

import importlib.metadata
import math

import pytest
from markupsafe import Markup
from request_size_records import SETTINGS, request_size_records
from test_balloon_controller import run_cli

from memqual.host.core.record import write
from memqual.host.judge.results import build_results, metrics_of
from memqual.host.report import balloon_curve as plot
from memqual.host.report import report


def test_points_come_per_size_and_metric_with_one_value_per_guest():
    (curve,) = plot.curves(request_size_records())
    inflate = curve.series("inflate_s")
    assert [p.pfns for p in inflate] == [256, 1024, 16384, 262144]
    assert all(len(p.values) == 3 for p in inflate)
    assert inflate[0].median == pytest.approx(4.0 + 768 / 16 * 0.01)
    assert [c.metric for c in curve.costs] == ["per_request_us", "per_page_ns"]


def test_older_records_without_pfns_are_placed_by_their_label():
    (curve,) = plot.curves(request_size_records(with_pfns=False))
    assert [p.pfns for p in curve.series("deflate_s")] == [256, 1024, 16384, 262144]
    assert plot.pfns_of({"per_request": "1/8 guest"}, {"guest_mib": 1024}) == 32768
    assert plot.pfns_of({"per_request": "other"}, {}) is None


def test_two_settings_give_two_curves_and_other_scenarios_none():
    other = [*request_size_records(), *request_size_records({**SETTINGS, "guest_mib": 2048})]
    assert len(plot.curves(other)) == 2
    assert plot.curves([]) == [] and plot.section([]) == ""


def test_a_cost_interval_is_a_t_interval_over_the_guests():
    mean, low, high = plot.Cost("per_request_us", "us", (150.0, 180.0, 165.0)).interval()
    assert mean == pytest.approx(165.0)
    # sd 15, n 3, t(0.975, 2) = 4.303: half-width 37.3
    assert (high - mean) == pytest.approx(4.3027 * 15 / math.sqrt(3), rel=1e-3) and low < mean < high
    assert math.isnan(plot.Cost("x", "us", (1.0,)).interval()[1])


def test_the_report_shows_the_curve_and_the_costs():
    page = report.render_html(build_results([], request_size_records(), host_fallback=False))
    section = plot.section(metrics_of(request_size_records()))
    assert section in page
    assert "data:image/png;base64," in section
    assert "<td>1024 pfns</td><td class='num'>1024</td><td class='num'>3</td>" in section
    assert "per_request_us (us)" in section and "[127.7, 202.3]" in section


def test_curve_command_writes_the_png_and_refuses_what_holds_no_curve(tmp_path, capsys):
    for rec in request_size_records():
        write(rec, tmp_path / "records")
    png = tmp_path / "curve.png"
    assert run_cli(["balloon", "curve", str(tmp_path / "records"), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "1/16 guest   16384  inflate_s      3" in out and "per_request_us (us): 165 [127.7, 202.3]" in out
    (tmp_path / "empty").mkdir()
    assert run_cli(["balloon", "curve", str(tmp_path / "empty")]) == 2
    assert run_cli(["balloon", "curve", str(tmp_path / "missing")]) == 2


def test_the_balloon_registers_its_report_section():
    """report.html gets a subject's section from the memqual.report_sections
    entry points (pyproject.toml); host/report/report.py imports no subject."""
    assert list(report.registered_sections()) == [("balloon", plot.section)]
    assert report.subject_sections([]) == (Markup(""),)


def test_the_report_shows_only_the_registered_sections(monkeypatch):
    results = build_results([], request_size_records(), host_fallback=False)
    section = plot.section(metrics_of(request_size_records()))
    assert section and section in report.render_html(results)
    # Without the entry point the report has no balloon curve: the page
    # takes the section from the registry, nowhere else.
    monkeypatch.setattr(report, "entry_points", lambda group: importlib.metadata.EntryPoints(()))
    assert report.registered_sections() == ()
    assert section not in report.render_html(results)

"""KSM's volatile scan compares only between runs whose dirtying rates
match (host/judge/regime.py): ``memqual compare`` and ``memqual history`` on
records made by the scenario's own builder (tests/support/ksm_volatile_runs.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from ksm_volatile_runs import DIRTY_PASSES_PER_SCAN, ksm_records
from results_files import write_results_file

from memqual.host.cli import compare
from memqual.host.cli import history as history_command
from memqual.host.cli.command import parser_for, run_command
from memqual.host.core.record import Measurement
from memqual.host.judge import ab_outcome, comparison, history, regime
from memqual.host.judge.primaries import PRIMARY
from memqual.host.judge.results import metrics_of
from memqual.host.ksm.table import VOLATILE_SCAN

COST = "ksmd_cpu_ns_per_page"
RATE = "dirty_passes_per_scan"
# Far apart in cost: B's smart scan twice as dear per page, with 8 guests a
# run (the full profile's), so that a decision is sure to be made when allowed.
DEARER = 2.0
GUESTS = 8


def _compare(argv: list[str]) -> int:
    args = parser_for(compare.COMMAND).parse_args(["compare", *argv])
    return run_command(args)


def _file(tmp_path: Path, name: str, records: list[Measurement], blocks: int = 0) -> str:
    """A results.json of these records, every record's replicates spread
    over ``blocks`` blocks in turn (0: a block each), as an interleaved A/B
    arm's: one file a side outside blocks decides nothing."""
    for rec in records:
        n = len(rec.replicates or [])
        rec.blocks = [1 + i % (blocks or n) for i in range(n)]
    return str(write_results_file(tmp_path / f"{name}.json", records))


def _by_metric(out: dict) -> dict[str, dict]:
    """Metrics by scenario, metric and variant (their settings left out)."""
    return {m["key"].split(" {")[0]: m for m in out["metrics"]}


def _cost(out: dict, smart_scan: int) -> dict:
    return _by_metric(out)[f"ksm.volatile_scan {COST} [pages=4k, smart_scan={smart_scan}]"]


def test_matched_dirtying_rates_decide_as_before(tmp_path, capsys):
    """Both runs dirty at the same pace (each guest within 10 %): B's
    dearer smart scan is slower, the exit status 1, as with no regime."""
    a = _file(tmp_path, "a", ksm_records(4.4, n=GUESTS, seed=1, dirty_passes_per_scan=8.0, dirty_spread=0.1))
    b = _file(
        tmp_path,
        "b",
        ksm_records(4.4, n=GUESTS, seed=2, dirty_passes_per_scan=9.0, dirty_spread=0.1, cost_scale=DEARER),
    )
    assert _compare([a, b, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    cost = _cost(out, 1)
    assert cost["verdict"] == "slower" and cost["regime"]["matches"]
    assert cost["regime"]["rates"]["A"] == pytest.approx(8.0, rel=0.15)
    assert _cost(out, 0)["verdict"] in ("equivalent", "undecided")
    assert out["not_comparable"] == []
    assert _compare([a, b]) == 1
    assert "metric(s) not comparable" not in capsys.readouterr().out


def test_mismatched_dirtying_rates_are_not_compared_and_never_set_the_exit_status(tmp_path, capsys):
    """The same dearer smart scan, but B's guests dirty 4x as fast: every
    volatile-scan metric is listed as not comparable, with both rates, and
    decides nothing; the rate itself is compared like any metric."""
    a = _file(tmp_path, "a", ksm_records(4.4, n=GUESTS, seed=1, dirty_passes_per_scan=8.0))
    b = _file(tmp_path, "b", ksm_records(4.4, n=GUESTS, seed=2, dirty_passes_per_scan=32.0, cost_scale=DEARER))
    assert _compare([a, b, "--json", "--all-metrics"]) == 0
    out = json.loads(capsys.readouterr().out)
    cost = _cost(out, 1)
    assert cost["verdict"] == "not comparable" and not cost["regime"]["matches"]
    assert cost["regime"]["rates"]["A"] == pytest.approx(8.0, rel=0.01)
    assert cost["regime"]["rates"]["B"] == pytest.approx(32.0, rel=0.01)
    assert cost["p_adjusted"] is None and cost["ratio"] == pytest.approx(DEARER, rel=0.1)  # shown, not decided
    refused = {m["key"] for m in out["metrics"] if m["verdict"] == "not comparable"}
    assert set(out["not_comparable"]) == refused
    assert {m["metric"] for m in out["metrics"] if m["key"] in refused} >= {COST, "skip_share", "gain_ceiling"}
    rate = _by_metric(out)[f"ksm.volatile_scan {RATE} [pages=4k]"]
    assert rate["verdict"] == "faster" and rate["regime"] is None
    assert out["regressions"] == 0 and out["exit_status"] == 0
    # Not in any family's correction.
    assert out["families"]["primary"] == 0
    assert out["verdicts"]["primary"]["not comparable"] == 2  # the cost with smart scan and without
    assert out["verdicts"]["exploratory"]["not comparable"] >= 1  # the rest

    assert _compare([a, b]) == 0
    table = capsys.readouterr().out
    assert "not comparable: dirtying rate A 8 vs B 32 dirty passes per ksmd full scan" in table.replace("\n", " ")
    assert "metric(s) not comparable" in table
    page = tmp_path / "cmp.html"
    assert _compare([a, b, "--html", str(page)]) == 0
    html = page.read_text()
    assert "not comparable: dirtying rate A 8 vs B 32" in html and "metric(s) not comparable" in html


def test_a_run_without_its_dirtying_rate_cannot_be_shown_to_match(tmp_path, capsys):
    a = _file(tmp_path, "a", ksm_records(4.4, n=GUESTS, seed=1))
    b = _file(tmp_path, "b", [r for r in ksm_records(4.4, n=GUESTS, seed=2, cost_scale=DEARER) if r.metric != RATE])
    assert _compare([a, b, "--json"]) == 0
    cost = _cost(json.loads(capsys.readouterr().out), 1)
    assert cost["verdict"] == "not comparable"
    assert cost["regime"]["reason"] == "not comparable: dirtying rate not recorded in B"


def test_in_an_interleaved_ab_the_arms_rates_must_match_too(tmp_path, capsys):
    """Blocks pair the costs, but the rule is the same: within tolerance the
    paired test decides; beyond it, the arms dirtied at other paces."""
    a = _file(
        tmp_path, "a", ksm_records(4.4, n=GUESTS, seed=1, dirty_passes_per_scan=8.0, dirty_spread=0.1), blocks=GUESTS
    )
    b_same = _file(
        tmp_path,
        "b",
        ksm_records(4.4, n=GUESTS, seed=2, dirty_passes_per_scan=8.0, dirty_spread=0.1, cost_scale=DEARER),
        blocks=GUESTS,
    )
    b_fast = _file(
        tmp_path,
        "b_fast",
        ksm_records(4.4, n=GUESTS, seed=2, dirty_passes_per_scan=40.0, dirty_spread=0.1, cost_scale=DEARER),
        blocks=GUESTS,
    )
    assert _compare([a, b_same, "--json"]) == 1
    cost = _cost(json.loads(capsys.readouterr().out), 1)
    assert cost["verdict"] == "slower" and cost["paired"]
    assert _compare([a, b_fast, "--json"]) == 0
    cost = _cost(json.loads(capsys.readouterr().out), 1)
    assert cost["verdict"] == "not comparable" and cost["paired"]


def test_the_tolerance_is_the_boundary():
    c = VOLATILE_SCAN.regime
    assert c is not None and c.scenario == VOLATILE_SCAN.name
    edge = c.tolerance
    inside = regime.RegimeCheck(c, ("A", "B"), (10.0, 10.0 * edge * 0.999))
    outside = regime.RegimeCheck(c, ("A", "B"), (10.0 * edge * 1.001, 10.0))
    assert inside.matches and "they match" in inside.reason()
    assert not outside.matches and outside.reason().startswith("not comparable: dirtying rate A ")
    assert regime.condition_of("ksm.volatile_scan", COST) is c  # read from the row
    assert regime.condition_of("ksm.volatile_scan", RATE) is None  # the rate itself compares as usual
    assert regime.condition_of("ksm.merge", "merged_fraction") is None


def test_the_side_rate_is_the_geometric_mean_of_the_guests():
    records = ksm_records(4.4, dirty_passes_per_scan=DIRTY_PASSES_PER_SCAN, dirty_spread=0.5, seed=9)
    (rate,) = [r for r in records if r.metric == RATE]
    per_guest = [r[0] for r in rate.replicates or []]
    geo = math.exp(sum(math.log(x) for x in per_guest) / len(per_guest))
    cost = next(r for r in records if r.metric == COST and r.variant["smart_scan"] == 1)
    entries = metrics_of(records)
    assert VOLATILE_SCAN.regime is not None
    got = regime.side_rate(entries, VOLATILE_SCAN.regime, cost.variant, cost.settings)
    assert got == pytest.approx(geo)


def _history_run(directory: Path, created: str, records: list[Measurement]) -> None:
    directory.mkdir(parents=True)
    path = write_results_file(directory / "results.json", records)
    data = json.loads(path.read_text())
    data["created"] = created
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("last_rate, decided", [(8.5, True), (40.0, False)])
def test_history_steps_the_cost_only_where_every_run_dirtied_alike(tmp_path, last_rate, decided, capsys):
    """Six runs, the last three with a dearer smart scan: a step when the
    rates match, "not comparable" (and no step) when the last run dirtied
    5x as fast (the run is the unit of history's test: a step needs runs
    on both sides)."""
    runs = ((8.0, 1.0), (8.2, 1.0), (8.1, 1.0), (8.3, DEARER), (8.2, DEARER), (last_rate, DEARER))
    for i, (rate, scale) in enumerate(runs):
        records = ksm_records(
            4.4, n=GUESTS, seed=i + 1, dirty_passes_per_scan=rate, dirty_spread=0.05, cost_scale=scale
        )
        _history_run(tmp_path / f"run{i}", f"2026-12-0{i + 1}T00:00:00Z", records)
    groups, _ = history.build([str(tmp_path)])
    (group,) = groups
    series = {s.key: s for s in group.series}
    (cost,) = [s for k, s in series.items() if k.startswith(f"ksm.volatile_scan {COST} [pages=4k, smart_scan=1]")]
    (rate,) = [s for k, s in series.items() if k.startswith(f"ksm.volatile_scan {RATE}")]
    assert rate.regime is None and rate.verdict != regime.NOT_COMPARABLE
    if decided:
        assert cost.regime is not None and cost.regime.matches
        assert cost.verdict == history.STEP and cost.steps[0].after == 3
    else:
        assert cost.verdict == regime.NOT_COMPARABLE and not cost.steps
        assert cost.regime is not None
        assert re.match(
            r"not comparable: dirtying rate from 7\.\d+ to 4\d\.\d dirty passes per ksmd full scan over 6 runs",
            cost.regime.reason(),
        )
    parser = parser_for(history_command.COMMAND)
    page = tmp_path / "h.html"
    args = parser.parse_args(["history", str(tmp_path), "--html", str(page), "--json"])
    assert run_command(args) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    (jcost,) = [s for s in out["groups"][0]["series"] if s["key"] == cost.key]
    assert jcost["verdict"] == cost.verdict and jcost["regime"]["matches"] == decided
    if not decided:
        assert cost.regime.reason() in captured.err and cost.regime.reason() in page.read_text()
        # Greyed on the page, and counted in its group's line.
        from memqual.host.report.badges import GREY

        refused = sum(1 for s in group.series if s.verdict == regime.NOT_COMPARABLE)
        assert f"<b style='color:{GREY}'>{cost.regime.reason()}</b>" in page.read_text()
        assert f"{refused} not comparable (the runs' regimes differ)" in page.read_text()


def test_the_comparison_page_greys_the_metrics_not_comparable_and_escapes_their_reasons_once(tmp_path):
    """comparison.html's badges count the metrics not comparable in the
    grey of a verdict that decides nothing, the paragraph says so once per
    scenario and reason, and the template escapes both exactly once."""
    import dataclasses

    from hostile import HOSTILE, assert_escaped_once

    from memqual.host.report import compare_report, pages
    from memqual.host.report.badges import GREY, VERDICT_COLOURS

    a = json.loads(
        Path(_file(tmp_path, "a", ksm_records(4.4, n=GUESTS, seed=1, dirty_passes_per_scan=8.0))).read_text()
    )
    b = json.loads(
        Path(
            _file(tmp_path, "b", ksm_records(4.4, n=GUESTS, seed=2, dirty_passes_per_scan=32.0, cost_scale=DEARER))
        ).read_text()
    )
    result = comparison.compare_runs([a], [b], all_metrics=True)
    n = len(result.not_comparable)
    assert n >= 2 and VERDICT_COLOURS[regime.NOT_COMPARABLE] == GREY
    outcome = ab_outcome.decide(result)
    view = compare_report.comparison_page(outcome, a, b)
    # The badges count the primaries: what decides.
    primaries = sum(1 for m in result.not_comparable if m.role == PRIMARY)
    (box,) = [c for c in view.counts if c.verdict == regime.NOT_COMPARABLE]
    assert primaries >= 1 and (box.n, box.colour) == (primaries, GREY)
    (refused,) = view.refused
    assert refused.scenario == "ksm.volatile_scan" and refused.n == n
    html = compare_report.render_comparison_html(view)
    assert f"<b style='color:{GREY}'>{primaries}</b>not comparable" in html
    assert f"<b style='color:{GREY}'>{n} metric(s) not comparable</b>" in html
    assert f"<li>ksm.volatile_scan ({n} metric(s)): not comparable: dirtying rate A 8 vs B 32" in html
    # Each row's pill points to that line rather than repeating it.
    assert html.count(f'style="background:{GREY}">not comparable (above)</span>') == n
    hostile = dataclasses.replace(view, refused=(compare_report.Refused(HOSTILE, 1, HOSTILE),))
    assert_escaped_once(pages.render("comparison.html.j2", page=hostile))

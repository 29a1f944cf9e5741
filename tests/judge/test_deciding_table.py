"""The deciding table (host/judge/decisions.py), the negative controls'
power (host/judge/control_power.py) and comparison.html built on them:
synthetic runs in blocks (tests/support/comparison_pages.py) through the real
Tracker, compare_runs and the page.  Fixed seeds; a few seconds."""

from __future__ import annotations

import math
import re
import statistics

import comparison_pages as cp
import pytest

from memqual.host.core.record import merge_rounds
from memqual.host.judge import ab_outcome, comparison, control_power, decisions, primaries, verdicts
from memqual.host.judge.results import build_results
from memqual.host.judge.sequential_run import SequentialRun
from memqual.host.report import compare_report, plots


def _designs(n_controls: int, blocks: int, sd: float) -> list[control_power.ControlDesign]:
    return [
        control_power.ControlDesign(f"c{i}", blocks, blocks, blocks, sd / math.sqrt(blocks)) for i in range(n_controls)
    ]


def test_two_blocks_of_controls_cannot_tell_and_six_can():
    """26 controls at 2 % a block: a 10 % drift of all of them is caught in
    a few runs in a hundred on 2 blocks at the first look's share of alpha
    (the t has one degree of freedom), in nearly all on 6."""
    two = control_power.power(_designs(26, 2, 0.02), alpha=0.0032, threshold=0.05, trials=100)
    six = control_power.power(_designs(26, 6, 0.02), alpha=0.0032, threshold=0.05, trials=100)
    assert two.power <= 0.15 and not two.sufficient
    assert six.power >= 0.95 and six.sufficient
    assert "cannot tell whether the host drifted" in two.line()
    assert "cannot tell" not in six.line() and "caught in" in six.line()
    # More spread needs more blocks: at 5 % six blocks at 0.001 fall short.
    noisy = control_power.power(_designs(26, 6, 0.05), alpha=0.001, threshold=0.05, trials=100)
    assert noisy.power < six.power and not noisy.sufficient


def test_no_drift_is_no_power():
    """The simulation flags only a drift: with none, its 'power' is the
    false alarm rate, within alpha's reach."""
    found = control_power.power(_designs(26, 6, 0.02), alpha=0.01, threshold=0.05, drift=0.0, trials=100)
    assert found.power <= 0.05


def _control_run(drift: float, blocks: int, seed: int = 5):
    specs = cp.PRIMARIES[-1:] + cp.controls(8, 0.02, drift=drift)
    a, b = cp.records(specs, blocks, seed)
    ra = build_results([], merge_rounds(a), host_fallback=False)
    rb = build_results([], merge_rounds(b), host_fallback=False)
    return comparison.compare_runs([ra], [rb])


def test_a_control_design_is_read_back_from_its_interval():
    """The spread the power simulates is the spread the blocks had."""
    result = _control_run(1.0, 8)
    (m, *_) = [m for m in result.metrics if m.role == primaries.CONTROL]
    design = control_power.design_of(m)
    assert design is not None and design.n_blocks == 8
    specs = cp.PRIMARIES[-1:] + cp.controls(8, 0.02)
    a, b = cp.records(specs, 8, 5)
    by_block: dict[int, list[float]] = {}
    for side, recs in ((0, a), (1, b)):
        for r in recs:
            if r.scenario == m.scenario and r.variant == m.variant:
                by_block.setdefault(r.blocks[0], [0.0, 0.0])[side] = math.log(r.samples[0])
    d = [vb - va for va, vb in by_block.values()]
    assert design.sd == pytest.approx(statistics.stdev(d), rel=1e-6)


@pytest.mark.parametrize(("drift", "blocks", "status"), [(1.10, 6, 3), (1.0, 6, 0), (1.10, 2, 0)])
def test_a_drift_of_the_controls_exits_3_where_their_power_says_it_would(drift, blocks, status):
    """On 6 blocks a 10 % drift of the controls flags them (exit 3) and their
    power says they can tell; on 2 blocks the same drift passes unseen and
    the power says the controls cannot tell, instead of 'no control moved'."""
    result = _control_run(drift, blocks)
    assert result.exit_status() == status
    power = control_power.of_comparison(result, trials=100)
    assert power.controls == 8 and power.sufficient == (blocks == 6)


def test_the_deciding_table_is_the_looks_and_the_page_leads_with_it():
    """Through the real Tracker: each decided row carries the look that
    decided it, its blocks then, a p below the level it faced; the
    exit status is the looks'; the page shows the primaries first and
    folds the controls (with their power) and the exploratory metrics."""
    specs = cp.PRIMARIES[:2] + cp.PRIMARIES[4:5] + cp.controls(4, 0.02) + cp.exploratory(3)
    run = cp.run(specs, blocks=5, seed=2, trials=50)
    table = run.table
    assert table.sequential and table.decided_by == decisions.SEQUENTIAL
    looks = len(run.summary["look_times"])
    deflate = next(r for r in table.rows if r.metric == "deflate_s")
    assert deflate.verdict == verdicts.SLOWER and deflate.look is not None and 1 <= deflate.look <= looks
    for r in table.rows:
        if r.decided:
            assert r.p < r.level and r.look is not None
            assert r.minutes is not None and r.blocks >= 2
        else:
            assert r.look is None
    assert table.exit_status == 1 == run.summary.get("host_drifted", False) + 1
    json_rows = table.to_json()["rows"]
    assert {row["key"] for row in json_rows} == {m.key for m in run.result.metrics}
    html = compare_report.render_comparison_html(compare_report.comparison_page(run.outcome, run.a, run.b))
    first_fold = html.index("<details")
    assert html.index("<h2>Primaries</h2>") < first_fold
    assert html.index("Negative controls (4)") > first_fold and html.index("Exploratory metrics (3)") > first_fold
    assert "power to catch a 10% drift" in html and "The looks of --until-decided" in html
    assert "exit 1</span>" in html and "balloon.deflate deflate_s" in html[: html.index("<details")]


def test_when_the_looks_and_the_full_alpha_disagree_the_looks_decide():
    """A primary the whole run at full alpha calls slower, decided
    equivalent at an early look: the table, its exit status and the page
    are the look's; the full-alpha verdict is in the descriptive part only.
    The looks are read from until-decided.json as a finished run wrote it."""
    specs = (cp.Spec("balloon.inflate", "inflate_s", "s", "lower", 1.3, 0.02),)
    a, b = cp.records(specs, 4, 3)
    ra = build_results([], merge_rounds(a), host_fallback=False)
    rb = build_results([], merge_rounds(b), host_fallback=False)
    result = comparison.compare_runs([ra], [rb])
    (m,) = result.metrics
    assert m.verdict == verdicts.SLOWER and result.exit_status() == 1
    at = {"look": 1, "level": 0.001, **m.comparison.to_json(), "p_equivalence": 0.0001, "alpha_equivalence": 0.001}
    summary = {
        "alpha": 0.01,
        "threshold": 0.05,
        "stopped": "every primary decided",
        "look_times": [{"look": 1, "fraction": 0.4, "alpha": 0.0016, "metrics": 1}],
        "look_wall_s": [120.0],
        "blocks": 2,
        "added_blocks": [],
        "metrics": [
            {
                "key": m.key,
                "state": "decided",
                "verdict": "equivalent",
                "rounds_needed": 1,
                "history": [{"look": 1, "decided": True, "verdict": "equivalent"}],
                "at_look": at,
            }
        ],
    }
    outcome = ab_outcome.decide(result, SequentialRun.from_json(summary), trials=50)
    table = outcome.table
    (row,) = table.rows
    assert row.verdict == verdicts.EQUIVALENT and row.look == 1 and row.minutes == 2.0
    assert row.test == "equivalence (TOST)" and row.p == 0.0001 and row.level == 0.001
    assert table.exit_status == 0 and not table.regressions
    html = compare_report.render_comparison_html(compare_report.comparison_page(outcome, ra, rb))
    assert "exit 0</span>" in html and "No primary slower" in html
    descriptive = html[html.index("Descriptive: the whole run at full alpha") :]
    slower = re.compile(r">slower[^<]*</span>")  # the badge may carry the margin: "slower (±5%)"
    assert slower.search(descriptive) and not slower.search(html[: html.index("Descriptive")])


def test_the_forest_axis_clips_what_runs_past_it():
    """An interval of 0.03-27x and an estimate of 5.8x do not set the axis:
    it stays within 0.5-2 around the other estimates and the margin."""
    rows = [
        plots.ForestRow("wide", "#000", 1.14, 0.086, 15.2),
        plots.ForestRow("far", "#000", 5.8, 5.2, 6.4),
        plots.ForestRow("near", "#000", 0.95, 0.9, 1.01),
    ]
    low, high = plots.axis_limits(rows, 0.05)
    assert 1 / plots.MAX_SPAN - 1e-9 <= low < 0.95 and 1.14 < high <= plots.MAX_SPAN + 1e-9
    narrow = plots.axis_limits([plots.ForestRow("n", "#000", 1.0, 0.99, 1.01)], 0.05)
    assert narrow[0] == pytest.approx(1 / plots.MIN_SPAN) and narrow[1] == pytest.approx(plots.MIN_SPAN)
    assert plots.forest_png(rows, 0.05, "B / A")  # draws, clipped


def test_one_comparison_is_a_table_of_one_look():
    result = _control_run(1.0, 6)
    table = decisions.one_look(result)
    assert table.decided_by == decisions.ONE_LOOK and not table.sequential and table.exit_status == 0
    for r, m in zip(table.rows, result.metrics, strict=True):
        assert r.verdict == m.verdict and (r.look == 1) == r.decided


def test_controls_that_cannot_tell_say_about_how_many_blocks_would():
    short = control_power.power(_designs(26, 3, 0.03), alpha=0.01, threshold=0.05, trials=100)
    found = control_power.with_blocks_needed(short, _designs(26, 3, 0.03), threshold=0.05)
    assert not short.sufficient and found.blocks_needed is not None and 4 <= found.blocks_needed <= 8
    assert f"about {found.blocks_needed} blocks would reach it" in found.line()
    again = control_power.power(_designs(26, found.blocks_needed, 0.03), alpha=0.01, threshold=0.05, trials=100)
    assert again.power >= 0.7

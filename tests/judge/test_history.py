"""memqual history: the change-point test on synthetic series, runs of
other hosts or QEMU versions kept apart, order by time or kernel, the
page, bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from memqual.host.cli import main as cli
from memqual.host.judge import change_points, history, variance_prior, verdicts
from memqual.host.judge.family_scan import family_scan
from memqual.host.judge.results import SCHEMA, MetricEntry, memqual_version
from memqual.host.report import history_page


def _series(levels: list[float], reps: int = 3, noise: float = 0.01, seed: int = 1) -> list[list[list[float]]]:
    rng = random.Random(seed)
    return [[[lvl * (1 + rng.uniform(-noise, noise)) for _ in range(4)] for _ in range(reps)] for lvl in levels]


def test_a_step_beyond_the_threshold_is_found_where_it_is():
    steps = change_points.change_points(_series([1.0] * 4 + [1.3] * 4))
    assert [s.after for s in steps] == [4]
    assert steps[0].ratio == pytest.approx(1.3, rel=0.03) and steps[0].ci_low > 1.05 and steps[0].p_value < 0.01


def test_two_steps_are_both_found():
    steps = change_points.change_points(_series([1.0] * 4 + [1.3] * 4 + [1.8] * 4))
    assert [s.after for s in steps] == [4, 8]


def test_a_step_back_is_judged_between_its_neighbours():
    # Judged against whole segments, the first step would mix both levels
    # after it; between its neighbours each step shows its own ratio.
    steps = change_points.change_points(_series([1.0] * 5 + [1.3] * 5 + [1.7] * 5))
    assert [s.after for s in steps] == [5, 10]
    assert steps[0].ratio == pytest.approx(1.3, rel=0.03) and steps[1].ratio == pytest.approx(1.7 / 1.3, rel=0.03)


@pytest.mark.parametrize("levels", [[1.0] * 8, [1.0] * 4 + [1.02] * 4])
def test_noise_and_a_step_under_the_threshold_are_no_step(levels):
    assert change_points.change_points(_series(levels, noise=0.02)) == []


def test_one_replicate_a_run_of_two_runs_cannot_show_a_step():
    # 2 runs: no spread between runs to test against.
    assert change_points.change_points([[[1.0]], [[2.0]]]) == []


def test_drift_between_runs_is_not_a_step_however_many_replicates_a_run_holds():
    """Each run moved by its own 8 %, 12 tight replicates a run: pooled
    replicates would call that a step; the run as the unit does not."""
    rng = np.random.default_rng(3)
    runs = [[list(np.exp(level + rng.normal(0, 0.002, 3))) for _ in range(12)] for level in rng.normal(0, 0.08, 8)]
    assert change_points.change_points(runs) == []
    # The same runs with an 80 % step from run 5 on: found there.
    stepped = [[[x * (1.8 if i >= 4 else 1.0) for x in r] for r in run] for i, run in enumerate(runs)]
    assert [s.after for s in change_points.change_points(stepped)] == [4]


def _write_run(directory: Path, created: str, kernel: str, value: float, qemu: str = "7.2.22", label: str = "") -> Path:
    rng = random.Random(created)
    metrics = []
    for name, level in (("deflate_s", value), ("inflate_s", 2.0)):
        reps = [[level * (1 + rng.uniform(-0.01, 0.01)) for _ in range(3)] for _ in range(3)]
        samples = [x for r in reps for x in r]
        metrics.append(
            {
                "key": f"balloon.x {name} [default] {{}}",
                "scenario": "balloon.x",
                "metric": name,
                "unit": "s",
                "better": "lower",
                "variant": {},
                "settings": {},
                "samples": samples,
                "replicates": reps,
                "summary": {"median": sorted(samples)[4]},
            }
        )
    data = {
        "schema": SCHEMA,
        "memqual_version": memqual_version(),
        "created": created,
        "run": {"label": label},
        "environment": {"cpu": "Xeon", "host_kernel": "6.18.0", "qemu": qemu, "accel": "tcg", "guest_kernel": kernel},
        "claims": [],
        "metrics": metrics,
    }
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps(data))
    return directory / "results.json"


def test_the_page_shows_each_group_its_series_and_steps(tmp_path, capsys):
    kernels = ["6.12.100+deb12-amd64", "6.12.101+deb12-amd64", "6.12.107+deb12-amd64", "6.12.111+deb12-amd64"]
    for i, kernel in enumerate(kernels):
        for j in range(2):
            _write_run(
                tmp_path / "runs" / f"{i}{j}", f"2026-11-{20 + 2 * i + j:02d}T10:00:00Z", kernel, 1.0 if i < 2 else 1.5
            )
    # Another QEMU: kept apart, its difference shown.
    _write_run(tmp_path / "runs" / "other", "2026-11-29T10:00:00Z", kernels[0], 3.0, qemu="9.2.0")
    # avocado's own results.json inside a run dir is no memqual results file: left out.
    (tmp_path / "runs" / "00" / "avocado").mkdir()
    (tmp_path / "runs" / "00" / "avocado" / "results.json").write_text("{}")
    page = tmp_path / "history.html"
    assert cli.main(["history", str(tmp_path / "runs"), "--order", "kernel", "--html", str(page), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["groups"]) == 2 and out["environment_differences"] == {"qemu": ["7.2.22", "9.2.0"]}
    main = next(g for g in out["groups"] if len(g["runs"]) == 8)
    assert [r["guest_kernel"] for r in main["runs"]] == [k for k in kernels for _ in range(2)]
    by = {s["key"].split(" [")[0]: s for s in main["series"]}
    assert [st["after"] for st in by["balloon.x deflate_s"]["steps"]] == [4]
    assert by["balloon.x inflate_s"]["steps"] == []
    html = page.read_text()
    assert history.TEST_NAME in html and "Environment differences" in html and "data:image/png;base64," in html
    assert "step before run 5" in html


@pytest.mark.parametrize(
    "argv, message",
    [
        (["history", "/nonexistent/dir"], "no such file or directory"),
        (["history", "__EMPTY__"], "no results.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    argv = [str(tmp_path) if a == "__EMPTY__" else a for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _run_of(index: int, entries: dict) -> history.Run:
    return history.Run(Path(f"r{index}/results.json"), f"2026-12-01T00:0{index}:00Z", {}, "k", "", entries)


def _entry(scenario: str, metric: str, reps: list[list[float]], primary: bool | None) -> MetricEntry:
    return MetricEntry.from_json(
        {
            "key": f"{scenario} {metric} [default] {{}}",
            "scenario": scenario,
            "metric": metric,
            "unit": "ns",
            "better": "lower",
            "samples": [x for r in reps for x in r],
            "replicates": reps,
            "primary": primary,
        }
    )


def _drift_runs(
    control_step: float, seed: int = 5, spread: float = 0.01, runs_n: int = 3, primary_step: float = 1.0
) -> list[history.Run]:
    """Runs of the same code minutes apart: 2 primaries (moved by
    primary_step from the middle run on) and 30 exploratory metrics flat;
    10 host-only /dev/kvm costs that move together by control_step from the
    middle run on (the host, not the code)."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(runs_n):
        entries = {}
        for j in range(42):
            if j < 10:
                scenario, metric, primary, level = "memslots.kvm_lookup", f"access_ns_{j}", False, control_step
            elif j < 12:
                scenario, metric, primary, level = "balloon.inflate", f"inflate_s_{j}", True, primary_step
            else:
                scenario, metric, primary, level = "ksm.merge", f"other_{j}", False, 1.0
            factor = level if i >= runs_n // 2 else 1.0
            reps = [list(factor * (1 + rng.normal(0, spread)) * (1 + rng.normal(0, 0.003, 3))) for _ in range(3)]
            e = _entry(scenario, metric, reps, primary)
            entries[e.key] = e
        runs.append(_run_of(i, entries))
    return runs


def test_controls_moving_together_say_the_host_drifted_and_no_primary_steps():
    series = history.series_of(_drift_runs(1.10, runs_n=6), threshold=0.05, alpha=0.01)
    group = history.Group({}, [], series)
    controls = [s for s in series if s.role == "control"]
    assert len(controls) == 10 and all(s.verdict == history.STEP for s in controls)
    assert group.host_drifted and len(group.controls_stepped) == 10
    assert not any(s.steps for s in series if s.role != "control")
    primaries = [s for s in series if s.role == "primary"]
    assert len(primaries) == 2 and {s.verdict for s in primaries} <= {"equivalent", "undecided"}


def test_a_primary_step_between_the_runs_a_control_stepped_is_undecided():
    # The primaries step by 20 % where the controls step: confounded.
    series = history.series_of(_drift_runs(1.10, runs_n=6, primary_step=1.2), threshold=0.05, alpha=0.01)
    primaries = [s for s in series if s.role == "primary"]
    assert len(primaries) == 2 and all(s.verdict == "undecided" for s in primaries)
    assert all(st.confounded and st.after == 3 for s in primaries for st in s.steps) and primaries[0].steps
    # The controls quiet, the same primaries' steps are decisions.
    series = history.series_of(_drift_runs(1.0, runs_n=6, primary_step=1.2), threshold=0.05, alpha=0.01)
    primaries = [s for s in series if s.role == "primary"]
    assert all(s.verdict == history.STEP and not s.steps[0].confounded for s in primaries)


def test_a_flat_series_of_three_runs_is_equivalent_and_no_metric_steps_by_chance():
    series = history.series_of(_drift_runs(1.0), threshold=0.05, alpha=0.01)
    assert not any(s.steps for s in series)
    assert not history.Group({}, [], series).host_drifted
    # 1 % spread, 3 replicates a run: too few to show ±5 % after Holm over 42.
    assert {s.verdict for s in series} <= {"equivalent", "undecided"}
    # 0.2 %: shown for (nearly) all.
    quiet = history.series_of(_drift_runs(1.0, spread=0.002), threshold=0.05, alpha=0.01)
    assert sum(s.verdict == "equivalent" for s in quiet) >= 38


def test_the_family_correction_is_what_keeps_noise_from_stepping():
    """The per-metric test alone at 0.01 steps somewhere in a flat family
    of 100 noisy series; corrected over the family, none steps."""
    rng = np.random.default_rng(9)
    runs = []
    for i in range(6):
        entries = {}
        for j in range(100):
            reps = [list((1 + rng.normal(0, 0.05)) * (1 + rng.normal(0, 0.003, 3))) for _ in range(3)]
            e = _entry("ksm.merge", f"m{j}", reps, True)
            entries[e.key] = e
        runs.append(_run_of(i, entries))
    uncorrected = [
        change_points.no_change_p([[r for r in run.metrics[k].replicates or []] for run in runs])
        for k in runs[0].metrics
    ]
    assert min(uncorrected) < 0.01
    series = history.series_of(runs, threshold=0.05, alpha=0.01)
    assert not any(s.steps for s in series)


def test_a_hostile_metric_and_label_are_escaped_once_on_the_page(tmp_path):
    from hostile import ESCAPED, HOSTILE, assert_escaped_once

    for i in range(3):
        path = _write_run(
            tmp_path / "runs" / f"{i}", f"2026-11-2{i}T10:00:00Z", "6.12.100+deb12-amd64", 1.0, label=HOSTILE
        )
        data = json.loads(path.read_text())
        for m in data["metrics"]:
            m["key"] = m["key"].replace("balloon.x", HOSTILE)
            m["scenario"] = HOSTILE
        data["environment"]["guest_kernel"] = HOSTILE
        path.write_text(json.dumps(data))
    groups, diffs = history.build([str(tmp_path / "runs")])
    text = history_page.render(groups, diffs, "time", verdicts.DEFAULT_THRESHOLD, verdicts.DEFAULT_ALPHA)
    assert_escaped_once(text)
    # Each series' heading, each run's label and guest kernel, the environment line.
    assert text.count(ESCAPED) >= 2 + 3 * 2 + 1, text.count(ESCAPED)


def test_the_prior_is_fitted_to_the_scatter_of_the_variances():
    """Smyth's fit: variances drawn from a scaled inverse chi-square prior
    (d0 10, s0^2 1) and then sampled on 6 degrees of freedom give d0 near
    10; alike variances lend the family's degrees of freedom (the cap);
    spreads 60 times apart lend next to none."""
    rng = np.random.default_rng(11)
    truth = 10.0 / rng.chisquare(10.0, 400)
    sampled = truth * rng.chisquare(6.0, 400) / 6.0
    prior = variance_prior.fit_prior([(float(v), 6.0) for v in sampled])
    assert 6.0 < prior.df < 16.0 and 0.8 < prior.variance < 1.25
    alike = variance_prior.fit_prior([(float(v), 6.0) for v in rng.chisquare(6.0, 10) / 6.0])
    assert alike.df == pytest.approx(6.0 * 9)
    apart = [(float(s * s * rng.chisquare(6.0) / 6.0), 6.0) for s in np.geomspace(0.005, 0.3, 10)]
    assert variance_prior.fit_prior(apart).df < 2.0
    assert variance_prior.fit_prior(apart[:2]) == variance_prior.NO_PRIOR


def test_a_drift_common_to_the_family_lends_it_no_degrees_of_freedom():
    """Series whose runs move together are one draw of the drift, not ten:
    the prior is capped at what independent series would be worth."""
    rng = np.random.default_rng(12)
    shared = rng.normal(0.0, 0.05, 8)
    common = variance_prior.FamilySpread([list(shared + rng.normal(0.0, 0.002, 8)) for _ in range(10)])
    assert common.independent(0, 8, 4) < 1.5 and common(0, 8, 4).df < 6.0
    apart = variance_prior.FamilySpread([list(rng.normal(0.0, 0.05, 8)) for _ in range(10)])
    assert apart.independent(0, 8, 4) > 6.0 and apart(0, 8, 4).df > 30.0


def test_the_family_finds_a_step_its_series_alone_cannot_show():
    """Ten primaries, 8 runs of 3 % drift each, all 10 % higher from run 5
    on, 6 such families: each series alone has 6 degrees of freedom for
    its run spread and shows the step in about 3 of 10 (at alpha, no
    Holm); the family's prior, under Holm, in about 5 of 10."""
    rng = np.random.default_rng(13)
    alone = found = 0
    for _ in range(6):
        family = []
        for g in range(10):
            levels = rng.normal(0.0, 0.03, 8) + np.log(1.10) * (np.arange(8) >= 4)
            reps = [[[float(np.exp(lv + rng.normal(0.0, 0.02)))] for _ in range(4)] for lv in levels]
            alone += [st.after for st in change_points.change_points(reps)] == [4]
            s = history.Series(f"m{g}", "s", "lower", [], [], "synthetic", role="primary")
            s.values = change_points.run_values(reps)
            family.append(s)
        history.judge_family(family, threshold=0.05, alpha=0.01)
        found += sum(s.verdict == history.STEP and [st.after for st in s.steps] == [4] for s in family)
    assert alone <= 26 and found >= alone + 8, (alone, found)


def test_the_family_scan_locates_a_shared_step_and_holds_its_level_under_common_drift():
    """The scan of the family's runs: a 10 % step in ten series of 3 %
    drift is located at its run; with no step its p is about uniform
    (a drift common to the run included: the null is drawn from the
    residuals' covariance, so the common drift widens both)."""
    rng = np.random.default_rng(21)
    levels = rng.normal(0.0, 0.03, (10, 8)) + np.log(1.10) * (np.arange(8) >= 4)
    p, after = family_scan([list(v) for v in levels], 0, 8)
    assert after == 4 and p < 0.002
    assert change_points.located_changes([list(v) for v in levels]) == [4]
    rejected = 0
    for _ in range(40):
        shared = rng.normal(0.0, 0.05, 8)
        family = [list(shared + rng.normal(0.0, 0.02, 8)) for _ in range(10)]
        rejected += family_scan(family, 0, 8)[0] < 0.05
    # 40 families at a level of 0.05: 2 expected; 7 or more has p < 0.005.
    assert rejected <= 6, rejected
    assert family_scan([[1.0, 2.0, 3.0]], 0, 3) == (1.0, -1)  # too few runs to test


def test_the_page_and_json_say_where_the_family_changed():
    rng = np.random.default_rng(22)
    family = []
    for g in range(10):
        levels = rng.normal(0.0, 0.03, 8) + np.log(1.10) * (np.arange(8) >= 4)
        s = history.Series(f"m{g}", "s", "lower", [], [], "synthetic", role="primary")
        s.values = list(levels)
        family.append(s)
    history.judge_family(family, threshold=0.05, alpha=0.01)
    group = history.Group({}, [], family)
    assert group.family_changes() == {"primary": [4]}
    flat = [history.Series(f"m{g}", "s", "lower", [], [], "synthetic", role="primary") for g in range(10)]
    for s in flat:
        s.values = list(rng.normal(0.0, 0.03, 8))
    history.judge_family(flat, threshold=0.05, alpha=0.01)
    assert history.Group({}, [], flat).family_changes() == {}

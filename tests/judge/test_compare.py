"""`memqual compare` on synthetic results files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from results_files import inflate_record, write_results_file

from memqual.host.cli import compare
from memqual.host.cli.command import parser_for, run_command
from memqual.host.core import record
from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement
from memqual.host.judge.stats import permutation


def _units(
    rng: np.random.Generator, loc: float, n_reps: int, per_rep: int = 3, between: float = 0.01, within: float = 0.005
) -> list[list[float]]:
    """n_reps independent units (fresh guests, rounds), each with its own
    offset, and per_rep samples nested in each."""
    return [list(loc * (1 + rng.normal(0, between)) * (1 + rng.normal(0, within, per_rep))) for _ in range(n_reps)]


def _records(scan_rate: float = 1000.0, inflate_s: float = 0.8, seed: int = 1, reps: int = 6) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    return [
        Measurement(
            # A scan speed with no regime to match (host/judge/regime.py): the
            # volatile scan's own comparison is tests/judge/test_compare_regime.py's.
            scenario="synthetic.scan_speed",
            metric="pages_per_s",
            unit="pages/s",
            better="higher",
            variant={"smart_scan": 1},
            settings={"pages_to_scan": 4000},
            samples=[],
            replicates=_units(rng, scan_rate, reps),
            environment={"guest_kernel_sha256": f"k{seed}"},
        ),
        inflate_record(_units(rng, inflate_s, reps)),
    ]


def _many(n_metrics: int, seed: int, reps: int, slowed: dict[int, float] | None = None) -> list[Measurement]:
    """n_metrics lower-is-better metrics of about 1 % noise between units;
    metric i is multiplied by slowed[i]."""
    rng = np.random.default_rng(seed)
    slowed = slowed or {}
    return [
        Measurement(
            scenario=f"synthetic.s{i % 4}",
            metric=f"m{i:02d}_s",
            unit="s",
            better="lower",
            samples=[],
            replicates=_units(rng, (1.0 + i / 10) * slowed.get(i, 1.0), reps),
        )
        for i in range(n_metrics)
    ]


def _results(tmp_path, name: str, records: list[Measurement], marked: bool = False, blocked: bool = True) -> str:
    """A results file of these records.  Unless ``marked``, without the
    primary marks, as files written before them: every metric is then
    primary (the synthetic scenarios here are in no scenario's table).
    ``blocked``: each replicate is its own block, as one arm of an
    interleaved A/B (replicate i of A and of B in block i); outside blocks
    one file a side is one run a side, which describes and decides nothing."""
    if blocked:
        records = [
            r if r.blocks else dataclasses.replace(r, blocks=list(range(1, len(r.replicates or []) + 1)))
            for r in records
        ]
    path = write_results_file(tmp_path / f"{name}.json", records)
    if not marked:
        data = json.loads(path.read_text())
        for m in data["metrics"]:
            m.pop("primary", None)
        path.write_text(json.dumps(data))
    return str(path)


def _run(argv: list[str]) -> int:
    args = parser_for(compare.COMMAND).parse_args(["compare", *argv])
    return run_command(args)


def test_results_json_carries_each_metrics_replicates(tmp_path):
    path = _results(tmp_path, "a", _records(seed=1, reps=4))
    metrics = json.loads(open(path).read())["metrics"]
    assert all(len(m["replicates"]) == 4 and len(m["samples"]) == 12 for m in metrics)


def test_same_distribution_is_equivalent_and_exit_0(tmp_path, capsys):
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", _records(seed=2))
    assert _run([a, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["regressions"] == 0 and out["correction"]["primary"] == "holm"
    assert {m["verdict"] for m in out["metrics"]} == {"equivalent"}
    assert out["families"] == {"primary": 2, "control": 0, "exploratory": 0}
    assert out["environment_differences"]["guest_kernel_sha256"] == {"a": "k1", "b": "k2"}
    assert {(m["n_replicates_a"], m["n_replicates_b"]) for m in out["metrics"]} == {(6, 6)}


def test_a_deliberately_slowed_run_is_flagged_with_exit_1(tmp_path, capsys):
    # B scanned at 60 % of A's rate (as with a smaller pages_to_scan).
    a = _results(tmp_path, "a", _records(scan_rate=1000.0, seed=1))
    b = _results(tmp_path, "b", _records(scan_rate=600.0, seed=2))
    assert _run([a, b, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    by = {m["metric"]: m for m in out["metrics"]}
    assert by["pages_per_s"]["verdict"] == "slower"
    assert by["pages_per_s"]["ratio"] == pytest.approx(0.6, rel=0.03)
    # The paired t on 6 blocks' log ratios: far below 2/924, the exact
    # permutation test's floor; Holm's first step over 2 metrics.
    assert by["pages_per_s"]["p_value"] < 1e-6 and "paired" in by["pages_per_s"]["p_method"]
    assert by["pages_per_s"]["p_adjusted"] == pytest.approx(2 * by["pages_per_s"]["p_value"])
    assert by["pages_per_s"]["alpha_difference"] == pytest.approx(0.005)
    assert by["inflate_s"]["verdict"] == "equivalent"
    # The table form says the same, variants visible (not eaten as markup).
    assert _run([a, b]) == 1
    out = capsys.readouterr().out
    # (the label column folds at 120 columns beside the blocks column)
    assert "slower" in out and "[smart_sca" in out and "p (corr" in out


def test_a_10_percent_slowdown_on_one_metric_with_5_replicates_a_side_is_slower(tmp_path, capsys):
    # 5 units a side, one metric compared.
    a = _results(tmp_path, "a", _many(1, seed=1, reps=5))
    b = _results(tmp_path, "b", _many(1, seed=2, reps=5, slowed={0: 1.10}))
    assert _run([a, b, "--json"]) == 1
    (m,) = json.loads(capsys.readouterr().out)["metrics"]
    assert m["verdict"] == "slower" and m["ratio"] == pytest.approx(1.10, rel=0.02)
    assert m["p_value"] < 0.01 and "paired t on" in m["p_method"]
    assert m["ci"][0] > 1.05


def test_a_10_percent_slowdown_among_several_metrics_is_the_only_one_flagged(tmp_path, capsys):
    # Four metrics, 5 units a side.
    a = _results(tmp_path, "a", _many(4, seed=3, reps=5))
    b = _results(tmp_path, "b", _many(4, seed=4, reps=5, slowed={2: 1.10}))
    assert _run([a, b, "--json", "--alpha", "0.05"]) == 1
    by = {m["metric"]: m for m in json.loads(capsys.readouterr().out)["metrics"]}
    assert by["m02_s"]["verdict"] == "slower"
    assert {by[k]["verdict"] for k in ("m00_s", "m01_s", "m03_s")} == {"equivalent"}
    # At alpha 0.01 too: the permutation test's floor (4 x 2/252 = 0.032
    # after Holm) made this "underpowered"; the t-test has no such floor.
    assert _run([a, b, "--json"]) == 1
    by = {m["metric"]: m for m in json.loads(capsys.readouterr().out)["metrics"]}
    assert by["m02_s"]["verdict"] == "slower"


def test_an_a_a_comparison_of_many_metrics_flags_nothing(tmp_path, capsys):
    # 30 metrics, 8 units a side, the same distribution both sides: with
    # Holm the chance of any flag is at most alpha; three pairs of runs.
    for seed in (10, 20, 30):
        a = _results(tmp_path, f"a{seed}", _many(30, seed=seed, reps=8))
        b = _results(tmp_path, f"b{seed}", _many(30, seed=seed + 1, reps=8))
        assert _run([a, b, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["regressions"] == 0
        assert {m["verdict"] for m in out["metrics"]} <= {"equivalent", "undecided"}
        assert all(m["p_adjusted"] >= m["p_value"] for m in out["metrics"])


def test_holm_in_compare_is_the_textbook_adjustment(tmp_path, capsys):
    a = _results(tmp_path, "a", _many(5, seed=5, reps=6))
    b = _results(tmp_path, "b", _many(5, seed=6, reps=6, slowed={0: 1.2, 3: 1.03}))
    _run([a, b, "--json"])
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    raw = [m["p_value"] for m in metrics]
    assert [m["p_adjusted"] for m in metrics] == pytest.approx(permutation.holm(raw))


def test_a_noisy_small_change_is_undecided_with_the_units_it_needs(tmp_path, capsys):
    # 3 against 3 units, 4 % spread between units, B 4 % slower: neither
    # beyond the threshold nor inside it; the entry says what would decide.
    rng = np.random.default_rng(7)
    recs_a = [inflate_record(_units(rng, 1.0, 3, between=0.04))]
    recs_b = [inflate_record(_units(rng, 1.04, 3, between=0.04))]
    a, b = _results(tmp_path, "a", recs_a), _results(tmp_path, "b", recs_b)
    assert _run([a, b, "--json"]) == 0  # undecided is reported, not failed
    out = json.loads(capsys.readouterr().out)
    (m,) = out["metrics"]
    assert m["verdict"] == "undecided" and out["undecided"] == 1
    assert m["blocks_needed"] is not None and m["blocks_needed"] > 3
    assert _run([a, b]) == 0
    text = capsys.readouterr().out
    assert "1 metric(s) undecided" in text and "needs" in text
    assert "underpowered" not in text and "no difference" not in text


def test_results_without_replicates_count_as_one_unit_each(tmp_path, capsys):
    # results.json written before replicates: many samples, one unit.
    a = _results(tmp_path, "a", _records(seed=1), blocked=False)
    b = _results(tmp_path, "b", _records(scan_rate=600.0, seed=2), blocked=False)
    for path in (a, b):
        data = json.loads(open(path).read())
        for m in data["metrics"]:
            del m["replicates"]
        open(path, "w").write(json.dumps(data))
    assert _run([a, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {m["verdict"] for m in out["metrics"]} == {"undecided"}
    assert {(m["n_replicates_a"], m["n_replicates_b"]) for m in out["metrics"]} == {(1, 1)}


def test_metrics_that_do_not_vary_are_equivalent(tmp_path, capsys):
    # Three units a side, each 0: no spread, no difference; one unit a side
    # would be undecided (no spread to judge by).
    recs = [
        Measurement(
            scenario="ksm.integrity",
            metric="bad_pages",
            unit="pages",
            better="lower",
            samples=[],
            replicates=[[0.0]] * 3,
        )
    ]
    a = _results(tmp_path, "a", recs)
    b = _results(tmp_path, "b", recs)
    assert _run([a, b, "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["metrics"]
    assert m["verdict"] == "equivalent"


def test_html_page_names_the_regression_and_plots_every_ratio(tmp_path, capsys):
    a = _results(tmp_path, "a", _records(scan_rate=1000.0, seed=1))
    b = _results(tmp_path, "b", _records(scan_rate=600.0, seed=2))
    page = tmp_path / "out" / "comparison.html"
    assert _run([a, b, "--html", str(page)]) == 1
    assert f"wrote {page}" in capsys.readouterr().out
    text = page.read_text()
    assert "1 metric(s) slower</b> (shown to differ from\nA, the estimate beyond its margin" in text
    assert "synthetic.scan_speed pages_per_s [smart_scan=1]" in text
    assert "p corrected" in text and "TOST p corrected" in text and "replicates A/B" in text
    assert text.count("data:image/png;base64,") == 1  # the forest plot, inline: one self-contained file
    assert "guest_kernel_sha256" in text  # what differs between the environments
    # Nothing from a results file reaches the page unescaped.
    assert "<script" not in text


def test_html_page_shows_undecided_and_one_sided_metrics(tmp_path):
    rng = np.random.default_rng(13)
    recs_a = _many(2, seed=11, reps=3)
    recs_a[0] = inflate_record(_units(rng, 1.0, 3, between=0.04))
    recs_b = _many(2, seed=12, reps=3)
    recs_b[0] = inflate_record(_units(rng, 1.04, 3, between=0.04))
    recs_b[1] = dataclasses.replace(recs_b[1], metric="renamed_s")
    a = _results(tmp_path, "a", recs_a)
    b = _results(tmp_path, "b", recs_b)
    page = tmp_path / "cmp.html"
    assert _run([a, b, "--html", str(page)]) == 0
    text = page.read_text()
    assert ">undecided</span><div class='small'>needs about" in text and "1 primary metric(s) undecided" in text
    assert "Metrics on one side only" in text and "renamed_s" in text and "m01_s" in text


def test_lower_is_better_metrics_get_faster_right(tmp_path, capsys):
    a = _results(tmp_path, "a", _records(inflate_s=0.8, seed=1))
    b = _results(tmp_path, "b", _records(inflate_s=0.5, seed=2))
    assert _run([a, b, "--json"]) == 0
    by = {m["metric"]: m for m in json.loads(capsys.readouterr().out)["metrics"]}
    assert by["inflate_s"]["verdict"] == "faster"


def test_the_threshold_decides_what_counts(tmp_path):
    a = _results(tmp_path, "a", _records(scan_rate=1000.0, seed=1, reps=8))
    b = _results(tmp_path, "b", _records(scan_rate=940.0, seed=2, reps=8))  # 6 % slower, real
    assert _run([a, b, "--threshold", "0.08"]) == 0
    assert _run([a, b, "--threshold", "0.03"]) == 1


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.unlink(), "no such results file"),
        (lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]), "truncated"),
        (
            lambda p: p.write_text(p.read_text().replace("memqual.results/1", "memqual.results/0")),
            "another memqual version",
        ),
        (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "memqual_version": "0.0.1"})), "same version"),
        (lambda p: p.write_text(json.dumps({"schema": "memqual.results/1"})), "is a required property"),
        (
            lambda p: p.write_text(
                json.dumps(
                    {
                        **json.loads(p.read_text()),
                        "metrics": [{**m, "replicates": "x"} for m in json.loads(p.read_text())["metrics"]],
                    }
                )
            ),
            "replicates: .x. is not of type",
        ),
    ],
)
def test_unusable_files_are_bad_input_in_one_line(tmp_path, damage, message):
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", _records(seed=2))

    damage(Path(b))
    with pytest.raises(BadInput, match=message) as info:
        _run([a, b])
    assert "\n" not in str(info.value)
    assert info.value.exit_status == 2


def test_a_scenario_on_one_side_only_is_listed_and_the_rest_compared(tmp_path, capsys):
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", _records(seed=2)[:1])
    assert _run([a, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["metric"] for m in out["metrics"]] == ["pages_per_s"]
    assert len(out["only_in_a"]) == 1 and out["only_in_a"][0].startswith("balloon.inflate inflate_s")
    assert out["only_in_b"] == []
    assert _run([a, b]) == 0
    assert "only in A (not compared): balloon.inflate inflate_s" in capsys.readouterr().out


def test_nothing_in_common_is_bad_input(tmp_path):
    recs_b = _records(seed=2)
    for rec in recs_b:
        rec.metric += "_renamed"
    a = _results(tmp_path, "a", _records(seed=1))
    b = _results(tmp_path, "b", recs_b)
    with pytest.raises(BadInput, match="no metric is in both: 2 only in A, 2 only in B") as info:
        _run([a, b])
    assert info.value.exit_status == 2


def _balloon_round(seed: float, measured_in_settings: bool) -> list[Measurement]:
    """One round of the balloon timing scenario's four records, as written
    before (measured inflate size and MemAvailable in settings) or now (in
    extra)."""
    rng = np.random.default_rng(int(seed * 1000))
    measured = {"inflate_mib": round(780 + 5 * rng.random(), 1), "mem_available_mib": round(845 + 5 * rng.random(), 1)}
    settings = {"guest_mib": 1024, "margin_mib": 64, "touched_mib": 0, "machine": "pc"}
    if measured_in_settings:
        settings = settings | measured
    out = []
    for scenario, metric, loc in (
        ("balloon.inflate", "inflate_s", 0.30),
        ("balloon.inflate", "inflate_guest_s", 0.28),
        ("balloon.deflate", "deflate_guest_s", 0.20),
        ("balloon.deflate", "deflate_s", 0.22),
    ):
        out.append(
            Measurement(
                scenario=scenario,
                metric=metric,
                unit="s",
                better="lower",
                samples=list(loc * (1 + rng.normal(0, 0.02, 5))),
                settings=dict(settings),
                extra=dict(measured),
            )
        )
    return out


def test_the_failed_two_kernel_ab_compares_what_pairs_and_lists_the_rest(tmp_path, capsys):
    # As in the A/A run that wrote no comparison: A's two rounds measured
    # different inflate sizes, so its records never merged (two entries per
    # metric); B's rounds happened to agree with A's first.
    rounds_a = _balloon_round(1, True) + _balloon_round(2, True)
    rounds_b = _balloon_round(1, True) + _balloon_round(1, True)
    a = _results(tmp_path, "a", record.merge_rounds(rounds_a))
    b = _results(tmp_path, "b", record.merge_rounds(rounds_b))
    assert _run([a, b, "--json"]) == 0  # was exit 2: "mismatched metrics: 4 only in A"
    out = json.loads(capsys.readouterr().out)
    assert len(out["metrics"]) == 4 and len(out["only_in_a"]) == 4 and out["only_in_b"] == []
    assert all('"inflate_mib"' in k for k in out["only_in_a"])  # the old measured key


def test_with_measured_values_in_extra_the_rounds_merge_and_everything_pairs(tmp_path, capsys):
    rounds_a = _balloon_round(1, False) + _balloon_round(2, False)
    rounds_b = _balloon_round(3, False) + _balloon_round(4, False)
    merged_a = record.merge_rounds(rounds_a)
    assert len(merged_a) == 4 and {r.n_replicates for r in merged_a} == {2}
    assert all("inflate_mib" not in r.settings and "inflate_mib" in r.extra for r in merged_a)
    a = _results(tmp_path, "a", merged_a)
    b = _results(tmp_path, "b", record.merge_rounds(rounds_b))
    assert _run([a, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["metrics"]) == 4 and out["only_in_a"] == [] and out["only_in_b"] == []
    # Two rounds a side are two units: each metric decided or undecided by
    # its own spread, never "no difference" for want of evidence.
    assert {m["verdict"] for m in out["metrics"]} <= {"equivalent", "undecided"}
    assert {(m["n_replicates_a"], m["n_replicates_b"]) for m in out["metrics"]} == {(2, 2)}


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


def _primary_and_control(seed: int, reps: int, slowed_control: float = 1.0, slowed_other: float = 1.0):
    """A primary (balloon inflate), an exploratory metric and a negative
    control (a host-only /dev/kvm cost), as a run marks them."""
    rng = np.random.default_rng(seed)
    return [
        inflate_record(_units(rng, 0.8, reps)),
        Measurement(
            scenario="balloon.inflate",
            metric="inflate_guest_s",
            unit="s",
            better="lower",
            samples=[],
            replicates=_units(rng, 0.7 * slowed_other, reps),
        ),
        Measurement(
            scenario="memslots.kvm_lookup",
            metric="ns_per_doubling",
            unit="ns",
            better="lower",
            samples=[],
            variant={"kind": "miss"},
            replicates=_units(rng, 30.0 * slowed_control, reps),
        ),
    ]


def test_results_mark_primaries_and_an_exploratory_slowdown_does_not_fail(tmp_path, capsys):
    a = _results(tmp_path, "a", _primary_and_control(1, 6), marked=True)
    b = _results(tmp_path, "b", _primary_and_control(2, 6, slowed_other=1.3), marked=True)
    marks = {m["metric"]: m["primary"] for m in json.loads(open(a).read())["metrics"]}
    assert marks == {"inflate_s": True, "inflate_guest_s": False, "ns_per_doubling": False}
    assert _run([a, b, "--json"]) == 0  # exploratory: reported, not failed
    out = json.loads(capsys.readouterr().out)
    by = {m["metric"]: m for m in out["metrics"]}
    assert by["inflate_guest_s"]["verdict"] == "slower" and by["inflate_guest_s"]["role"] == "exploratory"
    assert by["ns_per_doubling"]["role"] == "control" and by["inflate_s"]["role"] == "primary"
    assert out["regressions"] == 0 and not out["host_drifted"]
    assert _run([a, b, "--all-metrics"]) == 1  # every metric sets the exit status


def test_a_moved_negative_control_says_the_host_drifted_and_exits_3(tmp_path, capsys):
    a = _results(tmp_path, "a", _primary_and_control(1, 6), marked=True)
    b = _results(tmp_path, "b", _primary_and_control(2, 6, slowed_control=1.4), marked=True)
    assert _run([a, b, "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["host_drifted"] and out["exit_status"] == 3
    assert out["controls_flagged"][0].startswith("memslots.kvm_lookup ns_per_doubling")
    assert _run([a, b]) == 3
    assert "the host drifted" in capsys.readouterr().out
    page = tmp_path / "cmp.html"
    assert _run([a, b, "--html", str(page)]) == 3
    assert "The host drifted" in page.read_text()


def test_blocks_on_both_sides_pair_the_replicates_and_drift_cancels(tmp_path, capsys):
    """Each block's A and B share the host's load of that minute (here up
    to 30 % apart between blocks): unpaired, the 10 % slowdown drowns in
    it; paired by block, it is slower."""
    rng = np.random.default_rng(5)
    drift = [1.0, 1.3, 0.8, 1.15, 0.9, 1.25, 0.85, 1.1]
    reps_a = [[d * x for x in r] for d, r in zip(drift, _units(rng, 1.0, 8), strict=True)]
    reps_b = [[d * x for x in r] for d, r in zip(drift, _units(rng, 1.1, 8), strict=True)]
    paths = []
    for name, reps, blocks in (("a", reps_a, True), ("b", reps_b, True), ("a0", reps_a, False), ("b0", reps_b, False)):
        rec = inflate_record(reps)
        if blocks:
            rec.blocks = list(range(1, 9))
        paths.append(_results(tmp_path, name, [rec], marked=True, blocked=False))
    assert _run([paths[0], paths[1], "--json"]) == 1
    (m,) = json.loads(capsys.readouterr().out)["metrics"]
    assert m["verdict"] == "slower" and m["paired"] and m["n_blocks"] == 8
    assert _run([paths[2], paths[3], "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["metrics"]
    assert m["verdict"] == "undecided" and not m["paired"] and m["unit_kind"] == "descriptive"


def _offset_run(tmp_path, name: str, seed: int, offset: float, factor: float = 1.0) -> str:
    """One run outside blocks: 6 replicates of 3 % noise, every metric of
    the run moved by its own ``offset`` (the host of that run)."""
    rng = np.random.default_rng(seed)
    recs = [
        dataclasses.replace(
            r,
            samples=[],
            replicates=[
                [x * offset * factor * float(np.exp(rng.normal(0, 0.03))) for x in rep] for rep in r.replicates or []
            ],
        )
        for r in _many(4, seed, 6)
    ]
    return _results(tmp_path, name, recs, blocked=False)


def test_one_run_a_side_outside_blocks_describes_and_never_exits_1(tmp_path, capsys):
    """A/A, the B run's host 12 % slower on everything: the replicates of
    the two runs differ, which is all two runs can say."""
    a = _offset_run(tmp_path, "a", 1, 1.0)
    b = _offset_run(tmp_path, "b", 2, 1.12)
    assert _run([a, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {m["verdict"] for m in out["metrics"]} == {"runs differ"} and out["regressions"] == 0
    assert len(out["descriptive"]) == 4 and out["runs"] == {"a": 1, "b": 1}
    assert all("decides nothing" in m["verdict_meaning"] for m in out["metrics"])
    page = tmp_path / "cmp.html"
    assert _run([a, b, "--html", str(page)]) == 0
    text = capsys.readouterr().out
    assert "runs differ" in text and "described, not decided" in text and "runs differ" in page.read_text()


def test_several_runs_a_side_decide_with_the_run_as_the_unit(tmp_path, capsys):
    """Four runs a side, each run's host off by its own 1 %: a 30 % slowdown
    of B is slower on the runs' medians; A against A is not."""
    rng = np.random.default_rng(7)
    a = [_offset_run(tmp_path, f"a{i}", 10 + i, float(np.exp(rng.normal(0, 0.01)))) for i in range(4)]
    b = [_offset_run(tmp_path, f"b{i}", 20 + i, float(np.exp(rng.normal(0, 0.01))), 1.3) for i in range(4)]
    argv = [a[0], b[0]] + [x for p in a[1:] for x in ("--also-a", p)] + [x for p in b[1:] for x in ("--also-b", p)]
    assert _run([*argv, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == {"a": 4, "b": 4} and not out["descriptive"]
    assert {m["verdict"] for m in out["metrics"]} == {"slower"}
    assert all(m["unit_kind"] == "run" and m["n_replicates_a"] == 4 for m in out["metrics"])
    same = [x for p in a[2:] for x in ("--also-a", p)] + [x for p in a[1:2] for x in ("--also-b", p)]
    assert _run([a[0], a[3], *same, "--json"]) == 0
    assert "slower" not in {m["verdict"] for m in json.loads(capsys.readouterr().out)["metrics"]}


def test_a_hostile_metric_and_run_name_are_escaped_once_on_the_page(tmp_path):
    from hostile import ESCAPED, HOSTILE, assert_escaped_once

    from memqual.host.judge.ab_outcome import decide
    from memqual.host.judge.comparison import compare_runs
    from memqual.host.judge.results import load_results
    from memqual.host.report.compare_report import comparison_page, render_comparison_html

    def named(recs: list[Measurement]) -> list[Measurement]:
        return [dataclasses.replace(r, metric=HOSTILE, settings={"s": HOSTILE}) for r in recs]

    recs_a = named(_records(scan_rate=1000.0, seed=1))
    recs_b = named(_records(scan_rate=600.0, seed=2))
    recs_b.append(dataclasses.replace(recs_b[1], scenario=HOSTILE))  # on one side only
    a = load_results(_results(tmp_path, "a", recs_a))
    b = load_results(_results(tmp_path, "b", recs_b))
    result = compare_runs([a], [b])
    assert result.regressions and result.only_in_b
    text = render_comparison_html(comparison_page(decide(result), a, b, a_name=HOSTILE, b_name="B"))
    assert_escaped_once(text)
    # The title, the regressions, the metrics table, the one-sided table.
    assert text.count(ESCAPED) >= 6, text.count(ESCAPED)

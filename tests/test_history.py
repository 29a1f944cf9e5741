"""memqual history: the change-point test on synthetic series, runs of
other hosts or QEMU versions kept apart, order by time or kernel, the
page, bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from memqual.host import cli, history
from memqual.host.results import SCHEMA, memqual_version


def _series(levels: list[float], reps: int = 3, noise: float = 0.01, seed: int = 1) -> list[list[list[float]]]:
    rng = random.Random(seed)
    return [[[lvl * (1 + rng.uniform(-noise, noise)) for _ in range(4)] for _ in range(reps)] for lvl in levels]


def test_a_step_beyond_the_threshold_is_found_where_it_is():
    steps = history.change_points(_series([1.0] * 4 + [1.3] * 4))
    assert [s.after for s in steps] == [4]
    assert steps[0].ratio == pytest.approx(1.3, rel=0.03) and steps[0].ci_low > 1.05 and steps[0].p_value < 0.01


def test_two_steps_are_both_found():
    steps = history.change_points(_series([1.0] * 3 + [1.4] * 3 + [0.9] * 3))
    assert [s.after for s in steps] == [3, 6]


def test_a_rise_and_a_fall_back_are_both_found():
    # Binary segmentation judged against whole segments misses this one:
    # after the first split the right side mixes both levels.
    steps = history.change_points(_series([1.0] * 3 + [1.3] * 3 + [1.0] * 2))
    assert [s.after for s in steps] == [3, 6]
    assert steps[0].ratio == pytest.approx(1.3, rel=0.03) and steps[1].ratio == pytest.approx(1 / 1.3, rel=0.03)


@pytest.mark.parametrize("levels", [[1.0] * 8, [1.0] * 4 + [1.02] * 4])
def test_noise_and_a_step_under_the_threshold_are_no_step(levels):
    assert history.change_points(_series(levels, noise=0.02)) == []


def test_one_replicate_a_run_of_two_runs_cannot_show_a_step():
    # 2 units: the permutation test has 2 arrangements, p can never be small.
    assert history.change_points([[[1.0]], [[2.0]]]) == []


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

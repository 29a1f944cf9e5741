"""memqual bisect: its decisions on synthetic results, the search bound,
skips, "no step", the log and page, interrupt and resume, bad input.
No guest: the rounds come from a fake runner (and once from a fake
avocado through runjob)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_bisect_runner import FakeRunner, measurement

from memqual.host.cli import main as cli
from memqual.host.core import record
from memqual.host.core.errors import BadInput
from memqual.host.judge import bisect_evidence, comparison, families
from memqual.host.run.bisect import decide, run, series

# ------------------------------------------------------------ decisions and search


def _blocks(ratios: list[float], noise: float = 0.01, seed: int = 3) -> tuple[list[list[float]], list[list[float]]]:
    """One replicate a side a block, B/A per block as given times a little
    noise, each block at its own level (the host's drift)."""
    rng = random.Random(seed)
    a, b = [], []
    for k, r in enumerate(ratios):
        level = 1.0 + 0.2 * k
        a.append([level * (1 + rng.uniform(-noise, noise)) for _ in range(3)])
        b.append([level * r * (1 + rng.uniform(-noise, noise)) for _ in range(3)])
    return a, b


def _evidence(ratios, *, better="lower", alpha=0.05, planned=10, threshold=0.05, noise=0.01):
    a, b = _blocks(ratios, noise)
    blocks_ = list(range(1, len(ratios) + 1))
    return bisect_evidence.evidence_of(
        a, b, blocks_, blocks_, threshold=threshold, alpha=alpha, planned=planned, better=better
    )


@pytest.mark.parametrize(
    "ratios, better, verdict",
    [
        ([1.3] * 6, "lower", decide.SLOWER),
        ([1.3] * 6, "higher", decide.FASTER),  # a throughput 30 % up is faster
        ([0.7] * 6, "lower", decide.FASTER),
        ([1.0] * 6, "lower", decide.EQUIVALENT),
        ([1.03] * 6, "lower", decide.EQUIVALENT),  # moved, but within the threshold
        ([1.05, 0.95, 1.2, 0.8, 1.1, 0.9], "lower", decide.UNDECIDED),  # too noisy to say either
    ],
)
def test_a_probe_is_decided_with_the_four_names_of_compare(ratios, better, verdict):
    e = _evidence(ratios, better=better)
    assert e.verdict == verdict, e.to_json()
    assert e.n_blocks == 6 and e.look == 6
    assert e.decided == (verdict != decide.UNDECIDED)
    if verdict == decide.UNDECIDED:
        assert e.blocks_needed is not None and e.blocks_needed > 6
        assert "needs about" in e.text()


def test_the_probe_decision_is_compares_decision_of_the_same_blocks_at_the_looks_alpha():
    """Through compare_runs whole: the bisect's one metric at its look's
    share of alpha gives compare's verdict, ratio and CI."""
    for ratios in ([1.3] * 5, [1.0] * 5, [1.05, 0.95, 1.2, 0.8, 1.1]):
        e = _evidence(ratios)
        a, b = _blocks(ratios)
        files = []
        for reps in (a, b):
            entry = {
                "key": "balloon.deflate deflate_s [default] {}",
                "scenario": "balloon.deflate",
                "metric": "deflate_s",
                "unit": "s",
                "better": "lower",
                "samples": [x for r in reps for x in r],
                "replicates": reps,
                "blocks": list(range(1, len(reps) + 1)),
            }
            files.append({"memqual_version": "x", "metrics": [entry], "claims": [], "environment": {}})
        m = comparison.compare_runs([files[0]], [files[1]], threshold=0.05, alpha=e.alpha).metrics[0]
        assert (m.verdict, m.comparison.ratio, m.comparison.ci_low) == (e.verdict, e.ratio, e.ci_low)
        assert e.alpha == pytest.approx(0.05 * (25 - 16) / 100)


def test_each_look_spends_only_its_share_of_alpha():
    """The same blocks decided at the full alpha but not at look 3's share
    of it: a look after every block must not spend alpha each time."""
    ratios = [1.12, 1.07, 1.10]
    full = _evidence(ratios, planned=1, noise=0.0)  # one planned look: all of alpha at once
    assert full.alpha == 0.0  # look 3 of 1 planned: past the plan, nothing left to spend
    e = _evidence(ratios, planned=10, noise=0.0)
    assert e.alpha == pytest.approx(0.05 * (9 - 4) / 100)
    assert e.verdict == decide.UNDECIDED
    a, b = _blocks(ratios, 0.0)
    _, at_full = families.decide_one(a, b, [1, 2, 3], [1, 2, 3], better="lower", threshold=0.05, alpha=0.05)
    assert at_full == decide.SLOWER


def test_one_block_decides_nothing_and_a_probe_moved_the_other_way_is_skipped():
    one = _evidence([2.0])
    assert one.verdict == decide.UNDECIDED and one.n_blocks == 0 and one.look == 1
    assert decide.classify(one, decide.SLOWER) == decide.UNDECIDED
    slower = _evidence([1.5] * 4)
    assert decide.classify(slower, decide.SLOWER) == decide.BAD
    assert decide.classify(slower, decide.FASTER) == decide.SKIP  # moved, but the other way
    assert decide.classify(slower, None) == decide.SLOWER  # the last kernel sets the step
    assert decide.classify(_evidence([1.0] * 4), decide.FASTER) == decide.GOOD
    none = bisect_evidence.evidence_of([], [[1.0]], threshold=0.05, alpha=0.05, planned=10)
    assert none.verdict == decide.UNDECIDED and none.ratio is None and "no measurement" in none.text()


def _search(n: int, verdict_of) -> decide.Bisection:
    b = decide.Bisection(n)
    while (i := b.next_probe()) is not None:
        b.mark(i, verdict_of(i))
    return b


def step_at(step: int) -> Callable[[int], str]:
    """Kernels from ``step`` on are bad."""
    return lambda i: decide.BAD if i >= step else decide.GOOD


@pytest.mark.parametrize("n", range(6, 21))
def test_the_step_is_found_within_ceil_log2_n_plus_one_probes(n):
    for step in range(1, n):  # the first bad kernel, 0-based
        b = _search(n, lambda i, step=step: decide.BAD if i >= step else decide.GOOD)
        o = b.outcome()
        assert (o.kind, o.first_bad, o.last_good) == ("first bad", step, step - 1)
        assert b.probes <= decide.max_probes(n), (n, step, b.probes)


def test_the_last_kernel_is_probed_first_and_no_step_stops_there():
    b = decide.Bisection(8)
    assert b.next_probe() == 7
    b.mark(7, decide.GOOD)
    assert b.next_probe() is None
    assert b.outcome().kind == "no step" and b.probes == 1
    b2 = decide.Bisection(8)
    b2.mark(7, decide.SKIP)
    assert b2.next_probe() is None and b2.outcome().kind == "undecided ends"


def test_a_skipped_kernel_is_walked_around_like_git_bisect_skip():
    # Step at 4; kernel 3 cannot be decided.
    b = _search(8, lambda i: decide.SKIP if i == 3 else (decide.BAD if i >= 4 else decide.GOOD))
    o = b.outcome()
    assert o.kind == "first bad" or o.kind == "range"
    # 3 is next to the step: the answer is "3 or 4", never a wrong kernel.
    assert o.kind == "range" and o.candidates == (3, 4) and o.last_good == 2
    # A skip away from the step does not hide it.
    b = _search(8, lambda i: decide.SKIP if i == 1 else (decide.BAD if i >= 5 else decide.GOOD))
    assert (b.outcome().kind, b.outcome().first_bad) == ("first bad", 5)


def test_a_good_after_the_first_bad_is_said():
    b = decide.Bisection(6)
    for i, v in ((5, decide.BAD), (2, decide.BAD), (1, decide.GOOD), (4, decide.GOOD)):
        b.marks[i] = v
    o = b.outcome()
    assert o.first_bad == 2 and "not one clean step" in o.note


# ------------------------------------------------------------ the bisector


def _settings(n: int, **kw) -> run.Settings:
    kernels = tuple(series.KernelSpec("6.1.0-57-amd64", f"memqual.k={i}") for i in range(n))
    return run.Settings(kernels=kernels, metric=kw.pop("metric", "deflate_s"), **kw)


def _bisect(tmp_path: Path, n: int, runner: FakeRunner, **kw) -> run.Bisector:
    lines: list[str] = []
    b = run.Bisector(_settings(n, **kw), tmp_path / "b", runner, say=lines.append, clock=runner.clock)
    return b


@pytest.mark.parametrize("step", [1, 3, 5])
def test_a_bisect_finds_the_injected_step_and_logs_like_git_bisect(tmp_path, step):
    runner = FakeRunner(step)
    b = _bisect(tmp_path, 6, runner)
    outcome = b.run()
    assert (outcome.kind, outcome.first_bad) == ("first bad", step)
    assert b.search.probes <= decide.max_probes(6)
    log = (tmp_path / "b" / "bisect.log").read_text()
    assert "# good: [K1]" in log and "memqual bisect bad K6" in log
    assert f"[K{step + 1}] 6.1.0-57-amd64:memqual.k={step} is the first bad kernel" in log
    assert "deflate_s slower than [K1]" in log and "#   look 3 (step 3, 6.0 min): B/A 1." in log
    state = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert state["outcome"]["kind"] == "first bad" and state["outcome"]["first_bad"] == step
    assert state["metric_key"].startswith("balloon.deflate deflate_s")
    assert all(p["evidence"]["n_probe"] >= 2 for p in state["probes"])
    html = (tmp_path / "b" / "bisect.html").read_text()
    assert "data:image/png;base64," in html and "first bad kernel" in html
    # paired: every probe round ran K1 beside it, in ABBA order
    assert runner.calls[:4] == [0, 5, 5, 0]


def test_no_step_between_the_ends_is_said_and_the_bisect_stops(tmp_path):
    runner = FakeRunner(step=99)
    b = _bisect(tmp_path, 6, runner)
    assert b.run().kind == "no step"
    assert set(runner.calls) == {0, 5}
    assert "no step: [K6]" in (tmp_path / "b" / "bisect.log").read_text()


def test_an_undecided_probe_is_skipped_when_its_budget_is_spent(tmp_path):
    runner = FakeRunner(step=3, noisy=frozenset({2}), round_s=20.0)
    b = _bisect(tmp_path, 6, runner, budget_min=10.0, max_rounds=20)
    outcome = b.run()
    probe = b.probes[2]
    assert probe.verdict == decide.SKIP and "budget ended" in probe.reason
    assert probe.evidence.verdict == decide.UNDECIDED and probe.evidence.blocks_needed
    assert probe.seconds <= 10 * 60 and probe.rounds == len(probe.looks) > 10
    assert outcome.kind == "range" and outcome.candidates == (2, 3)
    log = (tmp_path / "b" / "bisect.log").read_text()
    assert "could be any of: K3, K4" in log and "K3 stayed undecided (needs about" in log
    # The page says which probe stayed undecided and what it would need,
    # and shows every step with its B/A, blocks, decision and time.
    html = (tmp_path / "b" / "bisect.html").read_text()
    assert "K3 6.1.0-57-amd64:memqual.k=2 stayed undecided</b>: undecided (needs about" in html
    assert "Every step" in html and html.count("<td>K3</td>") == probe.rounds
    assert all(v in html for v in ("slower", "equivalent", "undecided"))


def test_a_hostile_kernel_metric_and_reason_are_escaped_once_on_the_page(tmp_path):
    """Every string of the state the page shows (a kernel spec, the metric,
    the outcome, a probe's reason and decision text, each look's text) may
    come from a hand-edited bisect.json: shown as text, escaped once."""
    from hostile import ESCAPED, HOSTILE, assert_escaped_once

    from memqual.host.report import bisect_page as page

    b = _bisect(tmp_path, 6, FakeRunner(step=3))
    b.run()
    state = b.to_json()
    state["probes"][0]["decision"] = "undecided"  # K3's, for the line of an undecided probe
    assert state["probes"][0]["index"] == 2
    state["settings"].update(kernels=[f"{HOSTILE}{i}" for i in range(6)], metric=HOSTILE, reference=HOSTILE)
    state.update(metric_key=HOSTILE, created=HOSTILE)
    state["outcome"]["text"] = HOSTILE
    for p in state["probes"]:
        p["reason"] = p["evidence"]["text"] = HOSTILE
        for look in p["looks"]:
            look["text"] = HOSTILE
    text = page.write_page(state, tmp_path / "hostile.html").read_text()
    assert_escaped_once(text)
    assert f"<title>memqual bisect: {ESCAPED}</title>" in text
    assert f"<td>K3 {ESCAPED}2</td>" in text and f"K3 {ESCAPED}2 stayed undecided</b>: {ESCAPED}; {ESCAPED}</p>" in text
    looks = sum(len(p["looks"]) for p in state["probes"])
    # title, heading, reference, started, outcome; the undecided line's
    # three; six kernels; each probe's decision and note; each step's decision
    assert text.count(ESCAPED) == 5 + 3 + 6 + 2 * len(state["probes"]) + looks


def test_a_probe_is_compared_with_k1_of_its_own_blocks_so_host_drift_cancels(tmp_path):
    """After the first job the host gets 30 % slower, both arms alike: K1's
    blocks beside each probe drifted as the probe did, so the step is still
    found at K4 and every probe's ratio stays near 1 or near the effect
    (K1 pooled over the bisect, drifted and not, could not call a good
    probe good)."""
    runner = FakeRunner(step=3, drift=1.3)
    b = _bisect(tmp_path, 6, runner)
    assert b.run().first_bad == 3
    assert all(len(job) == 2 and {arm for _, arm, _ in job} == {"A", "B"} for job in runner.jobs)
    for index, probed in b.probes.items():
        assert probed.evidence.ratio is not None
        expected = 1.5 if index >= 3 else 1.0
        assert abs(probed.evidence.ratio - expected) < 0.05, (index, probed.evidence)
    good = min(i for i in b.probes if 0 < i < 3)

    def reps(k: int) -> list[list[float]]:
        return [rep for r in b.rounds if r.kernel == k for rep in r.replicates]

    assert b.probes[good].evidence.verdict == decide.EQUIVALENT and b.probes[good].evidence.paired
    # K1 pooled over the bisect, unpaired, cannot call the good probe
    # equivalent even at the whole alpha.
    _, pooled = families.decide_one(reps(0), reps(good), better="lower", threshold=0.05, alpha=0.05)
    assert pooled != decide.EQUIVALENT


def test_start_reference_measures_k1_only_while_the_ends_are_checked(tmp_path):
    runner = FakeRunner(step=2)
    b = _bisect(tmp_path, 6, runner, reference=run.START)
    assert b.run().first_bad == 2
    k1_rounds = [i for i, k in enumerate(runner.calls) if k == 0]
    first_probe = min(i for i, k in enumerate(runner.calls) if k not in (0, 5))
    assert k1_rounds and all(i < first_probe for i in k1_rounds)
    # Unpaired probes run their arm alone, one job a step.
    assert all([arm for _, arm, _ in job] == ["B"] for job in runner.jobs if all(k not in (0, 5) for _, _, k in job))


def test_an_interrupted_bisect_keeps_its_log_and_resumes(tmp_path):
    first = FakeRunner(step=4, interrupt_after=5)
    b = _bisect(tmp_path, 6, first)
    with pytest.raises(KeyboardInterrupt):
        b.run()
    state = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert state["interrupted"] and len(state["rounds"]) == 6
    assert "resume with memqual bisect --resume" in (tmp_path / "b" / "bisect.log").read_text()
    second = FakeRunner(step=4)
    second.rng = first.rng
    resumed = run.Bisector.resume(tmp_path / "b", second, say=lambda line: None)
    resumed.clock = second.clock
    assert resumed.run().first_bad == 4
    # The resumed bisect kept the rounds done and ran only what was left:
    # the K6 check was decided from the stored rounds plus what it lacked.
    final = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert final["rounds"][:6] == state["rounds"]
    assert len(final["rounds"]) == len(first.calls) + len(second.calls)
    assert not final["interrupted"] and "# resumed" in (tmp_path / "b" / "bisect.log").read_text()


def test_a_metric_the_first_round_did_not_record_is_bad_input(tmp_path):
    b = _bisect(tmp_path, 6, FakeRunner(step=3), metric="deflate_guest_s")
    with pytest.raises(BadInput, match="unknown metric 'deflate_guest_s'.*nearest"):
        b.run()


def test_a_metric_that_names_two_is_bad_input():
    recs = [
        measurement([1.0]),
        record.Measurement(scenario="balloon.other", metric="deflate_s", unit="s", better="lower", samples=[1.0]),
    ]
    with pytest.raises(BadInput, match="names 2 metrics"):
        series.select_metric(recs, series.MetricSpec("deflate_s"))
    rec, _ = series.select_metric(recs, series.MetricSpec("balloon.other/deflate_s"))
    assert rec is not None and rec.scenario == "balloon.other"


# ------------------------------------------------------------ input


def _main(argv: list[str]) -> int:
    """memqual.host.cli.main.main; a usage error exits through argparse (status 2)."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def test_kernel_specs_take_an_extra_command_line():
    k = series.parse_kernel("6.1.0-57-amd64:init_on_free=1  page_poison=1")
    assert (k.version, k.cmdline_extra, k.name) == (
        "6.1.0-57-amd64",
        "init_on_free=1 page_poison=1",
        "6.1.0-57-amd64:init_on_free=1 page_poison=1",
    )
    assert series.parse_kernel("6.12.111+deb12-amd64").cmdline_extra == ""
    with pytest.raises(BadInput, match="command line after"):
        series.parse_kernel("6.1.0-57-amd64:init_on_free=1;reboot")


def test_a_typo_in_the_metric_is_caught_before_any_guest(tmp_path):
    e2e = Path(__file__).resolve().parents[2] / "e2e"
    series.check_metric_known(series.MetricSpec("deflate_s"), e2e)
    series.check_metric_known(series.MetricSpec("balloon.deflate deflate_guest_s"), e2e)  # an f-string's
    series.check_metric_known(series.MetricSpec("rss_return_l1_s"), e2e)  # no primary's: e2e names it
    with pytest.raises(BadInput, match="unknown metric 'deflat_s'.*nearest: deflate_s"):
        series.check_metric_known(series.MetricSpec("deflat_s"), e2e)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bisect", "--kernels", "6.1.0-57-amd64", "--metric", "deflate_s"], "at least 2 kernels"),
        (["bisect", "--metric", "deflate_s"], "at least 2 kernels"),
        (["bisect", "--kernels", "6.1.0-57-amd64", "6.1.0-57-amd64", "--metric", "deflate_s"], "the same"),
        (
            ["bisect", "--kernels", "6.1.0-57-amd64", "6.1.0-57-amd64:init_on_free=1", "--metric", "nonsense_metric"],
            "unknown metric",
        ),
        (["bisect", "--kernels", "a", "b", "--metric", "deflate_s", "--threshold", "150"], "percentage"),
        (["bisect", "--kernels", "a", "b", "--metric", "deflate_s", "--max-rounds", "0"], "at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_unknown_kernel_names_the_nearest_and_exits_2(capsys, tmp_path, monkeypatch):
    from memqual.images import build, packages

    def apt(argv, cwd=None):
        if argv[:2] == ["apt-cache", "pkgnames"]:
            return "linux-image-6.1.0-57-amd64\nlinux-image-6.12.111+deb12-amd64\n"
        return "  Candidate: 1.0\n"

    monkeypatch.setattr(packages, "_run", apt)
    monkeypatch.setattr(build, "debian_kernel_files", lambda v: (packages.kernel_package(v, tmp_path), None))
    monkeypatch.chdir(tmp_path)
    argv = ["bisect", "--kernels", "6.1.0-57-amd64", "6.12.112+deb12-amd64", "--metric", "deflate_s"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "nearest available: 6.12.111+deb12-amd64" in err and err.count("\n") == 1
    assert not (tmp_path / "memqual-bisect").exists() or not list((tmp_path / "memqual-bisect").rglob("bisect.json"))


def test_resume_of_a_directory_without_a_bisect_is_bad_input(capsys, tmp_path):
    assert cli.main(["bisect", "--resume", str(tmp_path)]) == 2
    assert "no such bisect state" in capsys.readouterr().err


# ------------------------------------------------------------ through runjob


def test_each_probe_step_is_one_interleaved_job_whose_records_carry_arm_and_blocks(tmp_path, monkeypatch):
    """The real runner against a fake avocado: every step of a probe is ONE
    job whose variants are K1 (arm A) and the probe (arm B) of one block,
    ABBA, each with its kernel and extra command line; the rounds stored
    carry arm and blocks, and the probe is compared block by block."""
    from fake_avocado import slower_deflate_on_b

    from memqual.images import build

    # Every probe (arm B) 1.5 times slower than K1 (arm A), so K3 is bad
    # and so is K2, the first bad kernel.
    slower_deflate_on_b(tmp_path, monkeypatch)
    bz = tmp_path / "vmlinuz"
    bz.write_bytes(b"kernel")
    mods = tmp_path / "modules"
    mods.mkdir()
    monkeypatch.setattr(build, "debian_kernel_files", lambda v: (bz, mods))
    e2e = tmp_path / "e2e"
    e2e.mkdir()
    argv = [
        "bisect",
        "--kernels",
        "6.1.0-57-amd64",
        "6.1.0-57-amd64",
        "6.1.0-57-amd64:init_on_free=1",
        "--metric",
        "deflate_s",
        "--output",
        str(tmp_path / "out"),
        "--only",
        "balloon",
        "--tests",
        str(e2e),
    ]
    assert cli.main(argv) == 0
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert all(c["argv"][c["argv"].index("--execution-order") + 1] == "variants-per-test" for c in calls)
    assert all("--filter-by-tags=balloon,-slow,-boot,-hosts,-host-under-test" in c["argv"] for c in calls)
    assert all("--xunit" in c["argv"] for c in calls)

    def variants(call):
        data = json.loads(Path(call["argv"][call["argv"].index("--json-variants-load") + 1]).read_text())
        return [(v["variant_id"], {k: val for _, k, val in v["variant"][0][1]}) for v in data]

    # The first job: K3 against K1, block 1, A then B, each arm its kernel line.
    first = variants(calls[0])
    assert [vid for vid, _ in first] == ["b1-A", "b1-B"]
    assert [p["cmdline_extra"] for _, p in first] == ["", "init_on_free=1"]
    assert all(p["kernel"] == str(bz) for _, p in first)
    state = json.loads((tmp_path / "out" / "bisect.json").read_text())
    rounds = state["rounds"]
    # One job a probe step, each giving one round an arm, both arms from it.
    assert len(rounds) == 2 * len(calls) and all(r["status"] == "ok" for r in rounds)
    for job, pair in zip(calls, zip(rounds[::2], rounds[1::2], strict=True), strict=True):
        ids = [vid for vid, _ in variants(job)]
        assert [f"b{r['blocks'][0]}-{r['arm']}" for r in pair] == ids
        assert pair[0]["job_dir"] == pair[1]["job_dir"]
        assert all(r["blocks"] == [r["blocks"][0]] * len(r["replicates"]) for r in pair)
    assert {(r["arm"], r["kernel"]) for r in rounds} == {("A", 0), ("B", 2), ("B", 1)}
    assert state["outcome"]["first_bad"] == 1
    assert "first bad kernel" in (tmp_path / "out" / "bisect.log").read_text()


def test_settings_words_pick_one_of_two_tests_metrics():
    recs = [
        record.Measurement(
            scenario="balloon.deflate",
            metric="deflate_s",
            unit="s",
            better="lower",
            samples=[1.0],
            settings={"guest_mib": mib},
        )
        for mib in (1024, 2048)
    ]
    with pytest.raises(BadInput, match="a setting as KEY=VALUE"):
        series.select_metric(recs, series.MetricSpec("deflate_s"))
    spec = series.parse_metric("balloon.deflate deflate_s guest_mib=2048")
    assert spec.name == "deflate_s"
    rec, _ = series.select_metric(recs, spec)
    assert rec is not None and rec.settings == {"guest_mib": 2048}


def test_one_test_reference_reaches_avocado_without_a_trailing_slash():
    from memqual.host.core.paths import REPO_ROOT
    from memqual.host.run import avocado as run_avocado_job
    from memqual.host.run import config as run_config

    ref = REPO_ROOT / "e2e" / "test_balloon.py:BalloonTiming.test_inflate_deflate_1g"
    argv = run_avocado_job.avocado_command(run_config.RunConfig(output=Path("o"), tests=ref), Path("r"))
    assert "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g" in argv
    argv = run_avocado_job.avocado_command(run_config.RunConfig(output=Path("o"), tests=REPO_ROOT / "e2e"), Path("r"))
    assert "e2e/" in argv


def test_a_missing_test_file_is_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["bisect", "--kernels", "a", "b", "--metric", "deflate_s", "--test", "e2e/test_nothing.py:X.y"]
    assert cli.main(argv) == 2
    assert "no such file e2e/test_nothing.py" in capsys.readouterr().err


def test_resume_with_other_kernels_is_bad_input(tmp_path, capsys):
    b = _bisect(tmp_path, 6, FakeRunner(step=3, interrupt_after=2))
    with pytest.raises(KeyboardInterrupt):
        b.run()
    argv = ["bisect", "--resume", str(tmp_path / "b"), "--kernels", "x", "y"]
    assert cli.main(argv) == 2
    assert "its kernels are" in capsys.readouterr().err
    # The page of an interrupted bisect says so, and shows what was probed.
    html = (tmp_path / "b" / "bisect.html").read_text()
    assert "interrupted" in html and "not probed" in html


def test_a_resumed_bisect_may_be_given_more_budget(tmp_path, monkeypatch, capsys):
    from memqual.host.run.bisect import jobs as bisect_jobs

    runner = FakeRunner(step=3, round_s=300.0)
    b = _bisect(tmp_path, 6, runner, budget_min=8.0)
    assert b.run().kind == "undecided ends"  # one round a side fits, a decision needs two
    more = FakeRunner(step=3, round_s=300.0)
    monkeypatch.setattr(bisect_jobs, "avocado_runner", lambda settings, console, qemu=None: more)
    assert cli.main(["bisect", "--resume", str(tmp_path / "b"), "--budget", "60"]) == 0
    state = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert state["settings"]["budget_min"] == 60 and state["outcome"]["first_bad"] == 3
    assert "# resumed with budget_min 60" in (tmp_path / "b" / "bisect.log").read_text()


def test_a_state_from_before_the_four_verdicts_resumes_and_is_decided_anew(tmp_path):
    """A memqual.bisect/1 state (its rounds without steps, its settings
    with min_replicates): resumed, every probe is decided by the new rule
    from the stored rounds, and the bisect goes on."""
    b = _bisect(tmp_path, 6, FakeRunner(step=3, interrupt_after=4))
    with pytest.raises(KeyboardInterrupt):
        b.run()
    path = tmp_path / "b" / "bisect.json"
    state = json.loads(path.read_text())
    state["schema"] = "memqual.bisect/1"
    state["settings"]["min_replicates"] = 2
    for r in state["rounds"]:
        del r["step"]
    path.write_text(json.dumps(state))
    more = FakeRunner(step=3)
    resumed = run.Bisector.resume(tmp_path / "b", more, say=lambda line: None)
    resumed.clock = more.clock
    assert resumed.run().first_bad == 3
    final = json.loads(path.read_text())
    assert final["schema"] == run.SCHEMA and all(p["decision"] in decide.VERDICTS for p in final["probes"])

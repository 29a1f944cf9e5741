"""A run's clock plan (``--clock auto``, host/judge/clock_plan.py): each
primary on the clock whose measured block spread decides it in fewer
blocks, each test on the clock of the primaries it records, every record
and every compared metric naming its own clock, and A and B of a metric
never read on two clocks."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import unittest
from pathlib import Path

import fake_qemu
import numpy as np
import pytest
from fake_avocado import guest_kernel_args
from fakes import FakeImage
from results_files import block_record, write_results_file
from rich.console import Console

from memqual.e2e.base import put_clock, reference_of
from memqual.host.cli import run as run_command
from memqual.host.cli.command import parser_for
from memqual.host.core import clock, probe, scenario
from memqual.host.core.errors import BadInput
from memqual.host.core.machine import Machine
from memqual.host.core.primary import Measured, Primary, Spread
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.record import Measurement
from memqual.host.judge import clock_plan
from memqual.host.judge.ab_outcome import decide
from memqual.host.judge.comparison import compare_metrics, compare_runs, short_labels
from memqual.host.judge.results import metrics_of
from memqual.host.report.compare_text import print_comparison
from memqual.host.run import ab_run
from memqual.host.run import job as runjob

AUTO = clock.parse("auto")


def _ksm_record() -> dict:
    """A record as a scenario's test writes it (one block's arm)."""
    return {
        "schema": "memqual.measurement/1",
        "scenario": "ksm.volatile_scan",
        "metric": "ksmd_cpu_ns_per_page",
        "unit": "ns",
        "better": "lower",
        "variant": {"smart_scan": 1, "pages": "4k"},
        "samples": [0.80, 0.82, 0.79],
    }


MEASURED = Measured("a test's", "memqual run --rounds 6", "2026-12-06", "nowhere")
TIMING = "test_balloon:BalloonTiming.test_inflate_deflate_1g"
FLOOR = "test_balloon:BalloonFloor.test_floor"


def _primary(wall: float | None, on_icount: float | None, margin: float = 0.05) -> Primary:
    return Primary(
        "m",
        "a test's",
        spread_wall=None if wall is None else Spread(wall, 6, MEASURED),
        spread_icount=None if on_icount is None else Spread(on_icount, 6, MEASURED),
        margin=margin,
        scenario="synthetic.s",
    )


@pytest.mark.parametrize(
    ("wall", "on_icount", "margin", "kind"),
    [
        (0.26, 0.0045, 0.05, clock.ICOUNT),  # the balloon's inflate: 272 blocks against 1
        (0.008, 0.063, 0.05, clock.WALL),  # the floor: icount worse
        (0.011, 0.85, 0.05, clock.WALL),  # free page reporting's RSS: icount far worse
        (1.0, None, 0.05, clock.WALL),  # never measured on icount: the wall clock
        (None, 0.01, 0.05, clock.ICOUNT),  # never measured on wall, tight on icount
        (0.001, 0.0007, 0.01, clock.WALL),  # both decide at the first look that can: the cheaper clock
        (0.05, 0.02, 0.05, clock.ICOUNT),  # wall needs about 10 blocks, icount 2
        (0.009, 0.002, 0.05, clock.WALL),  # wall needs 3: decided at its first look anyway
        (0.027, 0.002, 0.05, clock.ICOUNT),  # wall needs 7 (a t on 3 blocks cannot show 5 % at 2.7 %), icount 3
        (0.1, 0.1, 0.05, clock.WALL),  # a tie: the cheaper clock
    ],
)
def test_a_primary_runs_on_the_clock_whose_spread_decides_it_in_fewer_blocks(wall, on_icount, margin, kind):
    assert clock_plan.choose(_primary(wall, on_icount, margin)).kind == kind


def test_spreads_measured_the_other_way_round_move_a_primary_to_the_other_clock():
    floor = next(p for p in scenario.every_primary() if p.scenario == "balloon.floor")
    assert clock_plan.choose(floor).kind == clock.WALL
    swapped = dataclasses.replace(floor, spread_wall=floor.spread_icount, spread_icount=floor.spread_wall)
    assert clock_plan.choose(swapped).kind == clock.ICOUNT


def test_the_tests_on_icount_are_those_recording_a_primary_decided_there():
    on_icount = clock_plan.icount_tests()
    driver, fault = "test_balloon_driver:BalloonDriver.test_request_size", "test_fault:FaultTest.test_anon"
    assert on_icount == {TIMING, driver, fault}
    assert clock_plan.for_test(TIMING, AUTO) == clock.icount(4)
    assert clock_plan.for_test(FLOOR, clock.parse("auto:3")) == clock.WALL_CLOCK
    assert clock_plan.for_test(TIMING, clock.parse("auto:3")) == clock.icount(3)
    # A clock that is no plan is every test's.
    assert clock_plan.for_test(FLOOR, clock.icount(4)) == clock.icount(4)
    assert clock_plan.for_test(TIMING, clock.WALL_CLOCK) == clock.WALL_CLOCK


def test_the_plan_names_each_primary_with_its_clock_and_blocks():
    lines = clock_plan.describe(AUTO)
    assert len(lines) == len(scenario.every_primary())
    inflate = next(line for line in lines if "balloon.inflate" in line)
    assert "inflate_guest_s: icount:4" in inflate and "on wall" in inflate
    assert any("balloon.floor floor_mib: wall" in line for line in lines)
    assert any("fault.anon ns_per_page: icount:3 " in line for line in clock_plan.describe(clock.parse("auto:3")))
    assert clock_plan.describe(clock.icount()) == []


def test_parse_reads_a_plan_that_no_guest_runs_on():
    assert AUTO.label == "auto:4" and clock.parse("auto:2").label == "auto:2"
    assert AUTO.auto and not AUTO.icount and AUTO.strictest() == clock.icount(4)
    assert AUTO.resolved(True) == clock.icount(4) and AUTO.resolved(False) == clock.WALL_CLOCK
    assert clock.icount(2).resolved(False) == clock.icount(2)
    with pytest.raises(BadInput, match="needs TCG"):
        clock.resolve_accel(AUTO, "kvm")
    for bad in ("auto:11", "auto:x", "autox"):
        with pytest.raises(BadInput):
            clock.parse(bad)


class _AnyTest(unittest.TestCase):
    def test_x(self) -> None:
        """Only named, never run."""


def test_a_test_takes_its_own_clock_from_the_plan(monkeypatch):
    assert reference_of(_AnyTest("test_x")) == "test_clock_plan:_AnyTest.test_x"
    monkeypatch.setenv("MEMQUAL_CLOCK", "auto:4")
    put_clock(TIMING)
    assert os.environ["MEMQUAL_CLOCK"] == "icount:4"
    monkeypatch.setenv("MEMQUAL_CLOCK", "auto:4")
    put_clock(FLOOR)
    assert os.environ["MEMQUAL_CLOCK"] == "wall"
    monkeypatch.setenv("MEMQUAL_CLOCK", "icount:2")
    put_clock(FLOOR)  # no plan: the job's clock stays
    assert os.environ["MEMQUAL_CLOCK"] == "icount:2"


def test_a_guest_is_never_launched_on_a_plan(tmp_path, monkeypatch):
    binary = fake_qemu.install(tmp_path / "qemu", "qmp")
    monkeypatch.setenv("MEMQUAL_QEMU", str(binary))
    vm = Machine(MachineConfig(cpus=1, warm=False, clock="auto:4"), image=FakeImage.in_dir(tmp_path / "img"))
    with pytest.raises(BadInput, match="a run's plan"):
        vm.launch()
    assert fake_qemu.pids(binary) == []


def test_run_takes_a_plan_and_one_guest_commands_refuse_it_in_one_line(tmp_path, capsys):
    tests = tmp_path / "e2e"
    tests.mkdir()
    args = parser_for(run_command.COMMAND).parse_args(
        ["run", "--output", str(tmp_path / "out"), "--tests", str(tests), "--clock", "auto"]
    )
    assert run_command.config_from_args(args).clock == AUTO
    from memqual.host.cli import boot

    with pytest.raises(SystemExit) as info:
        parser_for(boot.COMMAND).parse_args(["boot", "--clock", "auto", "--", "true"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "auto is a plan for the scenarios of a run" in err


def _record(scenario: str, metric: str, read_with: str, loc: float, seed: int) -> Measurement:
    rng = np.random.default_rng(seed)
    units = [[loc * (1 + rng.normal(0, 0.002))] for _ in range(6)]
    return block_record(scenario, metric, units, {"clock": read_with})


def _side(tmp_path: Path, name: str, inflate: float, floor_clock: str = "wall", seed: int = 1) -> dict:
    records = [
        _record("balloon.inflate", "inflate_guest_s", "icount:4", inflate, seed),
        _record("balloon.floor", "floor_mib", floor_clock, 200.0, seed + 10),
    ]
    path = write_results_file(tmp_path / f"{name}.json", records)
    data = json.loads(path.read_text())
    data["environment"]["clock"] = "auto:4"  # the run's: a plan
    return data


def test_a_planned_run_judges_each_metric_on_its_own_clock_and_names_it(tmp_path):
    # B's guest-timed inflate 3 % slower: beyond its icount margin (1 %),
    # inside the wall clock's (5 %), so the icount margin must be the one.
    result = compare_runs([_side(tmp_path, "a", 30.0)], [_side(tmp_path, "b", 30.9, seed=2)])
    by_metric = {m.metric: m for m in result.metrics}
    inflate, floor = by_metric["inflate_guest_s"], by_metric["floor_mib"]
    assert inflate.clock == "icount:4" and floor.clock == "wall"
    assert inflate.comparison.margin == pytest.approx(0.01) and floor.comparison.margin == pytest.approx(0.05)
    assert inflate.verdict == "slower"
    labels = short_labels(result.metrics)
    assert labels[inflate.key].endswith("(icount:4)") and labels[floor.key].endswith("(wall)")
    assert result.to_json()["metrics"][0]["clock"] in ("icount:4", "wall")
    out = io.StringIO()
    print_comparison(decide(result), Console(file=out, width=200))
    assert "(icount:4)" in out.getvalue() and "(wall)" in out.getvalue()


def test_a_metric_read_on_two_clocks_is_refused_in_one_line(tmp_path):
    a = _side(tmp_path, "a", 30.0)
    b = _side(tmp_path, "b", 30.0, floor_clock="icount:4", seed=2)
    with pytest.raises(BadInput, match="different clocks") as info:
        compare_runs([a], [b])
    assert "\n" not in str(info.value) and "floor_mib" in str(info.value)


def test_a_look_judges_a_metric_read_on_icount_at_its_icount_margin():
    """A look of --until-decided compares records, not files: no file
    clock there, so each metric's own clock must pick its margin (the
    balloon's guest-timed inflate: 1 % on icount, where the wall clock's
    inflate_s is judged at 5 %)."""
    a = metrics_of([_record("balloon.inflate", "inflate_guest_s", "icount:4", 30.0, 1)])
    b = metrics_of([_record("balloon.inflate", "inflate_guest_s", "icount:4", 30.9, 2)])
    (found,) = compare_metrics(a, b)
    assert found.clock == "icount:4" and found.comparison.margin == pytest.approx(0.01)
    assert found.verdict == "slower"


def test_a_planned_ab_gives_its_jobs_the_plan_and_its_files_the_plan_as_their_clock(
    tmp_path, monkeypatch, request
) -> None:
    fake_avocado = request.getfixturevalue("fake")
    kernels = guest_kernel_args(tmp_path)
    on_icount = {**_ksm_record(), "environment": {"accel": "tcg", "clock": "icount:4"}}
    on_wall = {**_ksm_record(), "metric": "other", "environment": {"accel": "tcg", "clock": "wall"}}
    fake_avocado.plan(
        tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": [on_icount, on_wall]}]
    )
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    monkeypatch.setattr(probe, "resolve_accel", lambda requested: ("tcg", "no KVM here"))
    tests = tmp_path / "e2e"
    tests.mkdir()
    args = parser_for(run_command.COMMAND).parse_args(
        ["run", "--output", str(tmp_path / "out"), "--tests", str(tests), *kernels, "--clock", "auto"]
    )
    runjob.run(run_command.config_from_args(args), Console(file=io.StringIO(), width=120))
    calls = fake_avocado.calls()
    assert calls and all(call["env"]["MEMQUAL_CLOCK"] == "auto:4" for call in calls)
    for label in ("A", "B"):
        results = json.loads((tmp_path / "out" / label / "results.json").read_text())
        assert results["run"]["clock"] == "auto:4" and results["environment"]["clock"] == "auto:4"
        assert {m["clock"] for m in results["metrics"]} == {"icount:4", "wall"}


def test_files_from_different_hosts_are_refused_in_one_line(tmp_path):
    """A ratio across hosts compares the hosts: two runs on two host
    kernels, or one on this machine and one on a host under test, are
    refused; two runs on the same host under test compare."""
    l1 = "6.1.0-57-amd64 in TCG+SVM, L2 accel kvm"
    other = "6.12.111+deb12-amd64 in TCG+SVM, L2 accel kvm"
    for host_a, host_b in ((l1, other), (None, l1), (l1, None)):
        a, b = _side(tmp_path, "a", 30.0), _side(tmp_path, "b", 30.0, seed=2)
        a["environment"]["host_under_test"], b["environment"]["host_under_test"] = host_a, host_b
        with pytest.raises(BadInput, match="different hosts") as info:
            compare_runs([a], [b])
        assert "\n" not in str(info.value)
    a, b = _side(tmp_path, "a", 30.0), _side(tmp_path, "b", 30.0, seed=2)
    a["environment"]["host_under_test"] = b["environment"]["host_under_test"] = l1
    assert compare_runs([a], [b]).metrics


def test_an_ab_of_host_kernels_compares_across_hosts_when_it_says_so(tmp_path):
    a, b = _side(tmp_path, "a", 30.0), _side(tmp_path, "b", 30.9, seed=2)
    a["environment"]["host_under_test"] = "6.1.0-57-amd64 in TCG+SVM, L2 accel kvm"
    b["environment"]["host_under_test"] = "6.12.111+deb12-amd64 in TCG+SVM, L2 accel kvm"
    with pytest.raises(BadInput, match="different hosts"):
        compare_runs([a], [b])
    result = compare_runs([a], [b], across_hosts=True)
    assert {m.metric for m in result.metrics} >= {"inflate_guest_s"}


def test_memqual_compare_takes_an_ab_of_host_kernels_with_across_hosts(tmp_path, capsys):
    """`memqual compare` of a host-kernel A/B's two files: refused in one
    line that names the option, exit 2; with --across-hosts compared."""
    from memqual.host.cli import main as cli

    a, b = _side(tmp_path, "a", 30.0), _side(tmp_path, "b", 30.9, seed=2)
    a["environment"]["host_under_test"] = "6.1.0-57-amd64 in TCG+SVM, L2 accel kvm"
    b["environment"]["host_under_test"] = "6.12.111+deb12-amd64 in TCG+SVM, L2 accel kvm"
    path_a, path_b = tmp_path / "a.json", tmp_path / "b.json"
    path_a.write_text(json.dumps(a))
    path_b.write_text(json.dumps(b))
    assert cli.main(["compare", str(path_a), str(path_b)]) == 2
    err = capsys.readouterr().err.strip()
    assert "different hosts" in err and "--across-hosts" in err and "\n" not in err
    assert cli.main(["compare", str(path_a), str(path_b), "--across-hosts", "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert any(m["metric"] == "inflate_guest_s" for m in out["metrics"])


@pytest.mark.parametrize(
    ("sd", "says"),
    [
        # the smallest n with n >= ((t(0.99, n-1) + t(0.9, n-1)) x sd / margin)^2
        (0.002, "in about 4 block(s)"),  # at 3: (8.85 x 0.2)^2 = 3.1
        (0.02, "in about 55 block(s)"),  # (3.17 x 2 % / 1 %)^2 = 40 by the normal approximation
    ],
)
def test_a_host_under_test_s_header_gives_each_measured_spread_and_its_blocks(monkeypatch, sd, says) -> None:
    measured = dataclasses.replace(
        Primary("inflate_guest_s", "why", margin_icount=0.01, spread_host_under_test=Spread(sd, 6, MEASURED)),
        scenario="balloon.inflate",
    )
    unmeasured = dataclasses.replace(Primary("deflate_guest_s", "why"), scenario="balloon.deflate")
    monkeypatch.setattr(scenario, "every_primary", lambda: (measured, unmeasured))
    lines = clock_plan.describe_host_under_test()
    assert len(lines) == 2
    assert lines[0].startswith("  balloon.inflate inflate_guest_s: A/A block spread")
    assert "over 6 blocks" in lines[0] and "within 1 %" in lines[0] and says in lines[0]
    assert "balloon.deflate" not in "\n".join(lines)
    assert lines[-1].startswith("  the other primaries: no A/A spread measured on a host under test")
    monkeypatch.setattr(scenario, "every_primary", lambda: (unmeasured,))
    assert clock_plan.describe_host_under_test() == [
        "  every primary: no A/A spread measured on a host under test (docs/host-under-test.md)"
    ]


def test_a_metric_that_is_two_primaries_is_named_with_each_variant():
    lines = [line for line in clock_plan.describe(AUTO) if "ksm.volatile_scan ksmd_cpu_ns_per_page" in line]
    assert len(lines) == 2
    assert any("[pages=4k, smart_scan=1]" in line for line in lines)
    assert any("[pages=4k, smart_scan=0]" in line for line in lines)


def test_a_host_under_test_s_header_names_the_run_s_own_primaries():
    every = clock_plan.describe_host_under_test()
    assert any("balloon.inflate" in line for line in every) and any("ksm.volatile_scan" in line for line in every)
    ksm = clock_plan.describe_host_under_test({"ksm.volatile_scan"})
    assert [line for line in ksm if "A/A block spread" in line] == [
        line for line in every if line.startswith("  ksm.volatile_scan ")
    ]
    assert len([line for line in ksm if "ksm.volatile_scan" in line]) == 2
    assert not any("balloon" in line for line in ksm)


@pytest.mark.parametrize(("sd", "blocks"), [(0.0042, 5), (0.014, 10)])
def test_the_blocks_equivalence_needs_are_those_in_which_it_comes_in_most_runs(sd, blocks):
    """The estimate against synthetic truth through the real decision
    (families.decide at the margin, tests/judge/test_margins_calibration.py's
    model): an A/A over the blocks it names is equivalent in at least 70 %
    of runs (power 0.8 asked) and in at most 70 % a third fewer blocks on,
    so it is neither the normal approximation's half nor padded.
    sd: the log ratio's (0.42 % the counts', 1.4 % ksmd's on L1)."""
    import numpy as np

    from memqual.host.judge import families
    from memqual.host.judge.stats import ab_tests
    from memqual.host.judge.verdicts import EQUIVALENT

    margin = 0.01 if sd < 0.01 else 0.02
    assert clock_plan.blocks_needed(Spread(sd, 6, MEASURED), margin) == blocks

    def equivalent(n: int, seed: int) -> float:
        rng = np.random.default_rng(seed)
        hits = 0
        for _ in range(300):
            log_ratio = rng.normal(0.0, sd, n)
            a = [[1.0] for _ in range(n)]
            b = [[float(np.exp(x))] for x in log_ratio]
            test = ab_tests.ratio_test(a, b, list(range(n)), list(range(n)))
            decided = families.decide([test], ["primary"], ["lower"], threshold=0.05, alpha=0.01, margins=[margin])
            hits += decided[1][0] == EQUIVALENT
        return hits / 300

    assert equivalent(blocks, 71) >= 0.70
    assert equivalent(max(3, round(blocks * 2 / 3)), 72) <= 0.70


def _on_l1(metric: str, loc: float, seed: int, host: str | None) -> Measurement:
    rec = _record("balloon.free_page_reporting", metric, "icount:0", loc, seed)
    env = {**rec.environment, **({"host_under_test": host} if host else {})}
    return dataclasses.replace(rec, variant={"free_page_reporting": True}, environment=env)


@pytest.mark.parametrize("metric", ["report_cpu_l1_ns_per_mib", "rss_return_l1_s", "rss_return_s"])
def test_on_a_host_under_test_the_figure_read_in_l1_decides_and_this_machine_s_does_not(metric):
    """Free page reporting's RSS return is this machine's QEMU's, polled
    from here; under --host-kernel the guest's QEMU is L1's and a watcher
    in L1 reads the host's work on each reported MiB: that one decides
    there (the return's time in L1 is exploratory); this machine's figure
    decides only where no host under test ran."""
    host = "6.1.0-57-amd64 in TCG+SVM, L2 accel kvm"
    a = metrics_of([_on_l1(metric, 2.0, 1, host)])
    b = metrics_of([_on_l1(metric, 2.2, 2, host)])
    (found,) = compare_metrics(a, b, host_under_test=True)
    row = scenario.find("balloon.free_page_reporting")
    assert row is not None
    (primary,) = row.primaries
    if metric == primary.on_host_under_test:
        assert found.role == "primary" and found.verdict == "slower"
        assert found.comparison.margin == pytest.approx(primary.margin_on("icount:0", host_under_test=True))
    else:
        assert found.role == "exploratory"
    (here,) = metrics_of([_on_l1(metric, 2.0, 1, None)])
    assert here.primary is (metric == primary.metric)

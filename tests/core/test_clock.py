"""The clock a guest's timings are read with (host/core/clock.py), end to end
on fakes: parsing, QEMU's argv and the guest command line, the accelerator
and vCPU rules, the defaults of ``memqual run``, the record, results.json,
the job's environment, and the refusal to compare two clocks."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import time
from pathlib import Path

import fake_qemu
import pytest
from fake_avocado import guest_kernel_args
from fakes import FakeImage
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.cli.command import parser_for
from memqual.host.core import clock, probe, qemu_binary
from memqual.host.core.environment import Environment
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig, command_line, kernel_cmdline
from memqual.host.judge.pairing import check_comparable
from memqual.host.run import ab_run
from memqual.host.run import job as runjob


def run_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    """``memqual run`` arguments over an empty e2e folder."""
    tests = tmp_path / "e2e"
    tests.mkdir(exist_ok=True)
    parser = parser_for(run_command.COMMAND)
    return parser.parse_args(["run", "--output", str(tmp_path / "out"), "--tests", str(tests), *extra])


def run_memqual(tmp_path: Path, *extra: str) -> int:
    console = Console(file=io.StringIO(), width=120)
    return runjob.run(run_command.config_from_args(run_args(tmp_path, *extra)), console)


def _ksm_records() -> list[dict]:
    """ksmd's cost per page in both arms, the primary variant and another."""
    common = {
        "schema": "memqual.measurement/1",
        "scenario": "ksm.volatile_scan",
        "metric": "ksmd_cpu_ns_per_page",
        "unit": "ns",
        "better": "lower",
        "settings": {"pages_to_scan": 4000},
        "environment": {"accel": "tcg", "host_kernel": "6.18.0-fake"},
        "samples": [0.80, 0.82, 0.79, 0.81, 0.80],
    }
    return [{**common, "variant": {"smart_scan": s, "pages": "4k"}} for s in (0, 1)]


def test_parse_reads_wall_icount_and_a_shift_and_refuses_the_rest() -> None:
    assert clock.parse("wall") == clock.WALL_CLOCK
    assert clock.parse("icount").label == f"icount:{clock.DEFAULT_SHIFT}"
    assert clock.parse("icount:2") == clock.icount(2)
    assert clock.parse(" ICOUNT:0 ").label == "icount:0"
    for bad in ("icount:11", "icount:-1", "icount:auto", "tsc", "", "wall:4", "icount:2:3"):
        with pytest.raises(BadInput) as info:
            clock.parse(bad)
        assert "\n" not in str(info.value)


def test_icount_makes_single_threaded_tcg_with_a_fixed_shift_and_sleep_off() -> None:
    k, i, c = Path("/k"), Path("/i"), Path("/c")
    wall = command_line(MachineConfig(), "tcg", k, i, None, c, None)
    on = command_line(MachineConfig(), "tcg", k, i, None, c, None, clock=clock.icount(3))
    assert wall[wall.index("-accel") + 1] == "tcg" and "-icount" not in wall
    assert on[on.index("-accel") + 1] == "tcg,thread=single"
    assert on[on.index("-icount") + 1] == "shift=3,sleep=off"


def test_icount_fixes_the_boot_s_inputs_from_the_block_and_the_wall_clock_does_not(monkeypatch) -> None:
    """Under icount the RTC starts at a fixed time on the virtual clock and
    RDRAND is seeded from $MEMQUAL_BOOT_SEED (1 when unset); on the wall
    clock the guest keeps the host's time and random bytes."""
    k, i, c = Path("/k"), Path("/i"), Path("/c")
    monkeypatch.delenv("MEMQUAL_BOOT_SEED", raising=False)
    on = command_line(MachineConfig(), "tcg", k, i, None, c, None, clock=clock.icount(4))
    assert on[on.index("-rtc") + 1] == f"base={clock.ICOUNT_RTC_BASE},clock=vm"
    assert on[on.index("-seed") + 1] == str(clock.DEFAULT_BOOT_SEED)
    monkeypatch.setenv("MEMQUAL_BOOT_SEED", "7")
    on = command_line(MachineConfig(), "tcg", k, i, None, c, None, clock=clock.icount(4))
    assert on[on.index("-seed") + 1] == "7"
    wall = command_line(MachineConfig(), "tcg", k, i, None, c, None)
    assert "-rtc" not in wall and "-seed" not in wall
    monkeypatch.setenv("MEMQUAL_BOOT_SEED", "seven")
    with pytest.raises(BadInput, match="MEMQUAL_BOOT_SEED"):
        command_line(MachineConfig(), "tcg", k, i, None, c, None, clock=clock.icount(4))


def test_under_icount_the_guest_is_told_its_tsc_ticks_once_a_nanosecond(monkeypatch) -> None:
    # The host's TSC frequency would be wrong under icount: the guest's TSC
    # is QEMU's virtual clock there.
    monkeypatch.setattr("memqual.host.core.qemu.host_tsc_khz", lambda: 2_500_000)
    assert "tsc_early_khz=2500000" in kernel_cmdline(MachineConfig(), "tcg").split()
    words = kernel_cmdline(MachineConfig(), "tcg", clock.icount(4)).split()
    assert "tsc_early_khz=1000000" in words and "tsc_early_khz=2500000" not in words


@pytest.mark.parametrize(
    ("arms", "accel", "expected", "why"),
    [
        (2, "tcg", clock.Clock(clock.AUTO, clock.DEFAULT_SHIFT), "two-arm run under TCG"),
        (2, "kvm", clock.WALL_CLOCK, "under KVM, where icount cannot run"),
        (1, "tcg", clock.WALL_CLOCK, "one-arm run"),
        (1, "kvm", clock.WALL_CLOCK, "one-arm run"),
    ],
)
def test_a_two_arm_run_under_tcg_defaults_to_the_plan_and_the_rest_to_wall(arms, accel, expected, why) -> None:
    found = clock.default(arms, accel)
    assert found.clock == expected and why in found.why


def test_a_deadline_for_guest_work_grows_under_icount_and_stays_finite() -> None:
    assert clock.deadline_s(120.0, clock.WALL_CLOCK) == 120.0
    longer = clock.deadline_s(120.0, clock.icount())
    assert longer == 120.0 * clock.ICOUNT_WALL_FACTOR and math.isfinite(longer)


def test_the_ab_rows_balloon_cycles_are_one_under_icount_and_the_rest_is_unchanged() -> None:
    from memqual.host.balloon.table import INFLATE
    from memqual.host.core import profiles
    from memqual.host.ksm.table import SCENARIOS as KSM_ROWS

    ab = INFLATE.sizes_for(profiles.AB, icount=False)
    on_icount = INFLATE.sizes_for(profiles.AB, icount=True)
    assert ab.repeats == 3 and on_icount.repeats == 1
    quick = INFLATE.sizes_for(profiles.QUICK, icount=False)
    assert INFLATE.sizes_for(profiles.QUICK, icount=True) == quick  # a claim's units are not the A/B's
    for row in (r for r in KSM_ROWS if r.sizes):  # no other subject's sizes follow the clock
        assert row.sizes_for(profiles.AB, icount=True) == row.sizes_for(profiles.AB, icount=False)


def test_kvm_is_refused_under_icount_and_auto_becomes_tcg() -> None:
    with pytest.raises(BadInput, match="needs TCG"):
        clock.resolve_accel(clock.icount(), "kvm")
    accel, why = clock.resolve_accel(clock.icount(), "auto") or ("", "")
    assert accel == "tcg" and "icount:4" in why
    assert clock.resolve_accel(clock.WALL_CLOCK, "kvm") is None


def test_two_vcpus_under_icount_need_a_newer_qemu_than_7_2() -> None:
    with pytest.raises(BadInput, match="--qemu 10.0.2") as info:
        clock.check_vcpus(clock.icount(), 2, "7.2.22")
    assert "\n" not in str(info.value)
    clock.check_vcpus(clock.icount(), 1, "7.2.22")
    clock.check_vcpus(clock.icount(), 2, "10.0.2")
    clock.check_vcpus(clock.WALL_CLOCK, 2, "7.2.22")
    assert clock.version_tuple("10.0.2+ds-2") == (10, 0, 2) and clock.version_tuple("7.2.22") == (7, 2, 22)


def _fake_choice(version: str) -> qemu_binary.QemuChoice:
    return qemu_binary.QemuChoice(binary=Path(f"/q/{version}"), version=version, origin=f"fake {version}")


def test_with_nothing_asked_an_old_system_qemu_gives_way_to_debians_under_icount(monkeypatch) -> None:
    asked: list[str | None] = []

    def choose(spec: str | None) -> qemu_binary.QemuChoice:
        asked.append(spec)
        return _fake_choice("7.2.22" if spec is None else spec)

    monkeypatch.setattr(qemu_binary, "choose", choose)
    monkeypatch.delenv("MEMQUAL_QEMU", raising=False)
    choice, note = qemu_binary.choose_for_clock(None, clock.icount(), 2)
    assert choice.version == clock.ICOUNT_SMP_QEMU and asked == [None, clock.ICOUNT_SMP_QEMU]
    assert "7.2.22" in note and "10.0.2" in note
    # Asked for and too old: refused, not swapped.
    with pytest.raises(BadInput, match="needs QEMU 10.0 or later"):
        qemu_binary.choose_for_clock("7.2.22", clock.icount(), 2)
    # One vCPU, or the wall clock: the system's stays.
    asked.clear()
    assert qemu_binary.choose_for_clock(None, clock.icount(), 1) == (_fake_choice("7.2.22"), "")
    assert qemu_binary.choose_for_clock(None, clock.WALL_CLOCK, 2) == (_fake_choice("7.2.22"), "")
    assert asked == [None, None]


def _launch(tmp_path: Path, monkeypatch, config: MachineConfig) -> tuple[Machine, list[str]]:
    binary = fake_qemu.install(tmp_path / "qemu", "qmp")
    monkeypatch.setenv("MEMQUAL_QEMU", str(binary))

    class NoSSH(Machine):
        def wait_ssh(self, started: float, first_command=None, probe_banner: bool = True) -> None:
            self.boot_to_ssh_s = time.monotonic() - started

    with NoSSH(config, image=FakeImage.in_dir(tmp_path / "img"), boot_timeout=10) as vm:
        argv = list(vm.command)
    return vm, argv


def test_a_machine_takes_the_clock_from_the_environment_and_launches_qemu_on_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMQUAL_CLOCK", "icount:5")
    vm, argv = _launch(tmp_path, monkeypatch, MachineConfig(cpus=1, warm=False))
    assert vm.clock == clock.icount(5) and vm.accel == "tcg"
    assert argv[argv.index("-icount") + 1] == "shift=5,sleep=off"
    assert argv[argv.index("-accel") + 1] == "tcg,thread=single"
    # The config's own clock wins over the environment's.
    vm, argv = _launch(tmp_path / "2", monkeypatch, MachineConfig(cpus=1, warm=False, accel="tcg", clock="wall"))
    assert vm.clock == clock.WALL_CLOCK and "-icount" not in argv


def test_a_machine_refuses_two_vcpus_on_icount_with_the_fakes_old_qemu(tmp_path, monkeypatch) -> None:
    binary = fake_qemu.install(tmp_path / "qemu", "qmp")  # says 7.2.99
    monkeypatch.setenv("MEMQUAL_QEMU", str(binary))
    vm = Machine(MachineConfig(cpus=2, warm=False, clock="icount:4"), image=FakeImage.in_dir(tmp_path / "img"))
    with pytest.raises(BadInput, match="--qemu 10.0.2"):
        vm.launch()
    assert fake_qemu.pids(binary) == []  # refused before QEMU started
    # A guest that needs KVM cannot run on icount: a skip's reason, not an error.
    vm = Machine(MachineConfig(cpus=1, accel="kvm", clock="icount:4"), image=FakeImage.in_dir(tmp_path / "img"))
    with pytest.raises(CapabilityMissing, match="needs TCG"):
        vm.launch()


def test_the_record_names_its_clock_and_vcpus() -> None:
    env = Environment(accel="tcg").with_clock("icount:4", 2).to_json()
    assert env["clock"] == "icount:4" and env["vcpus"] == 2
    assert Environment.from_json(env).clock == "icount:4"


def _results(clock_label: str | None) -> dict:
    env = {"clock": clock_label} if clock_label else {}
    metric = {"key": "s m [] {}", "scenario": "s", "metric": "m", "unit": "s", "better": "lower", "samples": [1.0]}
    return {"schema": "memqual.results/1", "memqual_version": "1", "environment": env, "metrics": [metric]}


def test_compare_refuses_two_clocks_in_one_line_and_takes_no_clock_as_wall() -> None:
    with pytest.raises(BadInput, match="different clocks") as info:
        check_comparable(_results("icount:4"), _results("wall"))
    assert "\n" not in str(info.value) and "icount:4" in str(info.value)
    with pytest.raises(BadInput, match="different clocks"):
        check_comparable(_results("icount:4"), _results("icount:2"))
    check_comparable(_results(None), _results("wall"))  # results from before clocks: wall
    check_comparable(_results("icount:4"), _results("icount:4"))


@pytest.mark.parametrize(
    ("kernels", "asked", "accel", "expected"),
    [
        (2, None, "tcg", "auto:4"),  # two arms under TCG: the plan
        (2, None, "kvm", "wall"),
        (0, None, "tcg", "wall"),  # one arm: about time
        (2, "icount", "tcg", "icount:4"),  # an explicit --clock wins
        (2, "wall", "tcg", "wall"),
        (0, "icount:2", "tcg", "icount:2"),
        (2, "auto:2", "tcg", "auto:2"),
    ],
)
def test_run_takes_its_clock_when_asked_else_its_default_per_arms_and_accelerator(
    tmp_path, monkeypatch, kernels, asked, accel, expected
) -> None:
    probed: list[str] = []

    def run_accel(config):
        probed.append(accel)
        return accel, f"{accel} here"

    monkeypatch.setattr(run_command, "run_accel", run_accel)
    monkeypatch.setattr(run_command.budget, "refuse_unfit", lambda *a: None)
    argv = [*(guest_kernel_args(tmp_path) if kernels else []), *(["--clock", asked] if asked else [])]
    args = run_args(tmp_path, *argv)
    config, chosen = run_command.planned(args, run_command.config_from_args(args))
    assert config.clock.label == expected
    assert chosen.why == (
        f"--clock {expected} given"
        if asked
        else clock.default(max(kernels, 1), accel).why + (f" ({accel} here)" if kernels == 2 else "")
    )
    # the accelerator is probed only where the default needs it: two arms, no --clock
    assert probed == ([accel] if kernels == 2 and not asked else [])


def test_the_accelerator_of_a_run_is_tcg_under_a_host_or_icount_else_the_probes(tmp_path, monkeypatch) -> None:
    from memqual.host.core.nested import parse_host

    monkeypatch.setattr(probe, "cached_accel", lambda: None)
    monkeypatch.setattr(probe, "resolve_accel", lambda requested: ("kvm", "KVM boots Linux"))
    config = run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path)))
    assert run_command.run_accel(config) == ("kvm", "KVM boots Linux")
    monkeypatch.setattr(probe, "cached_accel", lambda: ("tcg", "TCG because no KVM"))
    assert run_command.run_accel(config) == ("tcg", "TCG because no KVM")
    hosted = dataclasses.replace(config, hosts=(parse_host("6.1.0-57-amd64", []),))
    assert run_command.run_accel(hosted)[0] == "tcg"
    assert run_command.run_accel(dataclasses.replace(config, clock=clock.icount()))[0] == "tcg"


@pytest.mark.parametrize(
    ("plan", "why", "expected"),
    [
        (
            "auto:4",
            "the default of a two-arm run under TCG",
            ["why auto:4: the default", "the plan:", ": icount:4 (", ": wall (", "the once-per-arm checks: wall"],
        ),
        ("wall", "the default of a two-arm run under KVM", ["why wall: the default", "every scenario on wall"]),
        ("icount:4", "--clock icount:4 given", ["why icount:4: --clock icount:4 given", "every scenario on icount:4"]),
    ],
)
def test_the_header_says_which_clock_each_scenario_got_and_why(tmp_path, plan, why, expected) -> None:
    config = dataclasses.replace(
        run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path))), clock=clock.parse(plan)
    )
    lines = run_command.clock_lines(config, clock.Default(config.clock, why))
    assert lines[0].startswith(f"clock: {plan}: ")
    text = "\n".join(lines)
    for fragment in expected:
        assert fragment in text
    if config.clock.auto:
        # each primary's line names its scenario and the clock it got
        assert any("balloon.inflate" in line and "icount:4" in line for line in lines)
        assert any("ksm.merge" in line and "wall" in line for line in lines)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--threshold", "0.02"], "decide an A/B"),
        (["--alpha", "0.05"], "decide an A/B"),
    ],
)
def test_threshold_and_alpha_need_two_arms(tmp_path, extra, message) -> None:
    with pytest.raises(BadInput, match=message):
        run_command.config_from_args(run_args(tmp_path, *extra))


def test_run_refuses_an_old_qemu_asked_for_under_icount(monkeypatch) -> None:
    monkeypatch.setattr(qemu_binary, "choose", lambda spec: _fake_choice("7.2.22"))
    with pytest.raises(BadInput, match="--qemu 10.0.2 or --clock wall"):
        run_command.resolve_qemus(["7.2.22"], clock.icount())
    assert run_command.resolve_qemus(["7.2.22"], clock.WALL_CLOCK) == (_fake_choice("7.2.22"),)


def test_an_ab_run_carries_its_clock_and_threshold_into_the_job_results_and_comparison(
    tmp_path, request, monkeypatch
) -> None:
    fake_avocado = request.getfixturevalue("fake")
    kernels = guest_kernel_args(tmp_path)
    fake_avocado.plan(
        tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": _ksm_records()}]
    )
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    monkeypatch.setattr(probe, "resolve_accel", lambda requested: ("tcg", "no KVM here"))
    run_memqual(tmp_path, *kernels, "--clock", "icount", "--threshold", "0.02", "--alpha", "0.05")
    calls = fake_avocado.calls()
    assert calls and all(call["env"]["MEMQUAL_CLOCK"] == "icount:4" for call in calls)
    for label in ("A", "B"):
        results = json.loads((tmp_path / "out" / label / "results.json").read_text())
        assert results["run"]["clock"] == "icount:4"
    comparison = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert comparison["threshold"] == 0.02 and comparison["alpha"] == 0.05


def test_every_primary_names_its_instrument_spread_and_margin() -> None:
    from memqual.host.core import primary as primaries
    from memqual.host.core import scenario

    for p in scenario.every_primary():
        assert p.instrument in (primaries.GUEST_CLOCK, primaries.HOST_WALL, primaries.HOST_CPU, primaries.COUNT)
        # A figure read only in a host under test's L1 (the slot operations
        # there) has no spread on this machine's clocks: its A/A there.
        only_in_l1 = p.spread_wall is None and p.spread_host_under_test is not None
        if only_in_l1:
            assert p.spread_host_under_test is not None and p.spread_host_under_test.blocks >= 6, p
            if p.margin_host_under_test == primaries.FINE_MARGIN:
                assert p.spread_host_under_test.sd <= 0.001, p.scenario
        else:
            assert p.spread_wall is not None and p.spread_wall.blocks >= 2, p
        assert p.margin in (primaries.FINE_MARGIN, primaries.TIGHT_MARGIN, primaries.WIDE_MARGIN)
        # Half a percent only for a figure that repeats on icount within a
        # tenth of it, measured over an A/A of at least 6 blocks.
        if p.margin == primaries.FINE_MARGIN:
            assert p.spread_icount is not None, p.scenario
            assert p.spread_icount.sd <= 0.001 and p.spread_icount.blocks >= 6, p.scenario
        # A tight margin only where the measured spread allows it; a wide
        # spread says what would decide it.
        for clock_label in ("wall", "icount:4"):
            spread = p.spread_on(clock_label)
            if spread is not None and p.margin_on(clock_label) == primaries.TIGHT_MARGIN:
                assert spread.sd <= primaries.TIGHT_SPREAD_MAX, (p.scenario, clock_label)
        # An icount margin of its own only from an icount A/A: a tight one
        # where its spread allows it, a wide one where it does not.
        if p.margin_icount is not None:
            assert p.spread_icount is not None and p.spread_icount.blocks >= 3, p.scenario
            tight = p.margin_icount in (primaries.FINE_MARGIN, primaries.TIGHT_MARGIN)
            assert tight == (p.spread_icount.sd <= primaries.TIGHT_SPREAD_MAX), p.scenario
            if spread is not None and spread.sd > 0.01:
                assert p.needs, (p.scenario, clock_label)
        assert "icount" in p.reads("icount:4") or p.instrument_on("icount:4") != primaries.GUEST_CLOCK
        # On a host under test, the margin its own A/A there allows by the
        # same rule: 1 % to 0.75 %, 2 % to 1.5 %, else 5 % (a margin of its
        # own there only from one).
        there = p.spread_host_under_test
        if p.margin_host_under_test is not None:
            assert there is not None and there.blocks >= 6, p.scenario
        # (a spread over fewer blocks is shown in a run's header and sets nothing)
        if there is not None and there.blocks >= 6:
            rule = (
                primaries.FINE_MARGIN
                if there.sd <= 0.001 and p.margin_on("icount:0", host_under_test=True) == primaries.FINE_MARGIN
                else primaries.TIGHT_MARGIN
                if there.sd <= primaries.TIGHT_SPREAD_MAX
                else primaries.MID_MARGIN
                if there.sd <= primaries.MID_SPREAD_MAX
                else primaries.WIDE_MARGIN
            )
            assert p.margin_on("icount:0", host_under_test=True) == rule, (p.scenario, p.named("icount:0"))


def test_the_report_header_says_the_clock_in_words() -> None:
    from memqual.host.report.environment_line import environment_line

    line = environment_line({"accel": "tcg", "clock": "icount:4", "vcpus": 2}).text
    assert "clock icount:4" in line and "guest instructions" in line and "2 vCPUs taking turns" in line
    assert "clock wall: wall time" in environment_line({"accel": "tcg", "clock": "wall"}).text
    planned = environment_line({"accel": "tcg", "clock": "auto:4"}).text
    assert "clock auto:4" in planned and "names its own" in planned


def test_on_icount_the_guest_timed_inflate_decides_the_balloon_primary() -> None:
    from memqual.host.core.primary import GUEST_CLOCK, HOST_WALL
    from memqual.host.judge.primaries import is_primary, primary_of

    assert is_primary("balloon.inflate", "inflate_s", {}, "wall")
    assert not is_primary("balloon.inflate", "inflate_guest_s", {}, "wall")
    assert is_primary("balloon.inflate", "inflate_guest_s", {}, "icount:4")
    assert not is_primary("balloon.inflate", "inflate_s", {}, "icount:4")
    found = primary_of("balloon.deflate", "deflate_guest_s", {}, "icount:4")
    assert found is not None and found.instrument_on("icount:4") == GUEST_CLOCK
    assert found.instrument_on("wall") == HOST_WALL and "guest instructions" in found.reads("icount:4")
    # A record from before clocks is wall.
    assert is_primary("balloon.deflate", "deflate_s", {})


def test_the_clock_is_forwarded_to_lab_hosts(monkeypatch) -> None:
    from memqual.host.core import settings

    monkeypatch.setenv("MEMQUAL_CLOCK", "wall")  # restored after the test
    clock.put(clock.icount(3))
    assert settings.forwarded_to_lab_hosts()["MEMQUAL_CLOCK"] == "icount:3"


@pytest.mark.parametrize(
    ("only", "named", "not_named"),
    [
        (("ksm-volatile",), "ksm.volatile_scan ksmd_cpu_ns_per_page [pages=4k, smart_scan=0]", "balloon.inflate"),
        (("balloon-timing",), "balloon.inflate inflate_guest_s", "ksm.volatile_scan"),
    ],
)
def test_a_host_under_test_s_header_names_the_selected_primaries_spreads(tmp_path, only, named, not_named) -> None:
    from memqual.host.core.nested import parse_host

    config = dataclasses.replace(
        run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path))),
        clock=clock.icount(0),
        hosts=(parse_host("6.12.111+deb12-amd64"),),
        only=only,
    )
    text = "\n".join(run_command.clock_lines(config, clock.Default(config.clock, "--clock icount given")))
    assert "the host under test's instructions" in text
    assert named in text and "A/A block spread" in text
    assert not_named not in text

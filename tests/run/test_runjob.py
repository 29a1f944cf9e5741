"""`memqual run` against a fake avocado: a small script that writes the
events memqual's Avocado plugin writes and a job directory with records.
No guest here."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from fake_avocado import guest_kernel_args, ksm_record, run_args, run_memqual
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.core.errors import BadInput
from memqual.host.run import ab_run, jobevents
from memqual.host.run import avocado as run_avocado_job
from memqual.host.run import config as run_config
from memqual.host.run import progress as run_progress


def test_a_run_writes_results_report_and_tables_for_every_claim(tmp_path, fake):
    fake.plan(
        tests=[
            {"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": ksm_record(7.8)},
            {
                "name": "e2e/test_balloon.py:Balloon.test_inflate",
                "status": "CANCEL",
                "reason": "no virtio-balloon here",
            },
        ]
    )
    status, out = run_memqual(tmp_path)
    assert status == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    verdicts = {c["id"]: c for c in results["claims"]}
    assert len(verdicts) == 8
    assert verdicts["ksm-volatile-4k"]["verdict"] == "reproduced"
    assert "no virtio-balloon here" in verdicts["balloon-bitmap"]["reason"]
    assert results["environment"]["host_kernel"] == "6.18.0-fake"
    assert results["run"]["avocado"]["exit_status"] == 0
    assert [t["status"] for t in results["run"]["tests"]] == ["PASS", "CANCEL"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert "data:image/png;base64," in html and "ksm-volatile-4k" in html
    assert "(1/2) e2e/test_ksm.py:Ksm.test_volatile: PASS" in out  # progress lines
    assert "ksmd_cpu_ns_per_page" in out and "reproduced" in out  # the tables
    # The quick profile: untagged tests in, "slow" ones out, one test at a time.
    call = fake.calls()[0]
    assert call["argv"][:2] == ["run", str(tmp_path / "e2e")]
    assert "--filter-by-tags=-slow" in call["argv"] and "--filter-by-tags-include-empty" in call["argv"]
    assert call["argv"][call["argv"].index("--max-parallel-tasks") + 1] == "1"
    assert call["env"]["MEMQUAL_PROFILE"] == "quick"
    assert "MEMQUAL_GUEST_KERNEL" not in call["env"]


def test_only_and_full_profile_become_tag_filters(tmp_path, fake):
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_merge", "status": "PASS"}])
    status, _ = run_memqual(tmp_path, "--profile", "full", "--only", "ksm", "--only", "balloon")
    assert status == 0
    argv = fake.calls()[0]["argv"]
    assert [a for a in argv if a.startswith("--filter-by-tags")] == ["--filter-by-tags=ksm", "--filter-by-tags=balloon"]
    assert fake.calls()[0]["env"]["MEMQUAL_PROFILE"] == "full"
    assert run_avocado_job.tag_filters("quick", ("ksm",)) == ["--filter-by-tags=ksm,-slow"]


def test_failed_tests_make_a_non_zero_exit_but_results_are_written(tmp_path, fake):
    fake.plan(
        tests=[
            {"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "FAIL", "reason": "ksmd never finished a scan"},
        ]
    )
    status, out = run_memqual(tmp_path)
    assert status == 1
    assert "FAIL 1" in out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    by = {c["id"]: c for c in results["claims"]}
    assert by["ksm-volatile-4k"]["verdict"] == "not measurable"
    assert "ksmd never finished a scan" in by["ksm-volatile-4k"]["reason"]


def test_an_avocado_that_cannot_start_is_a_failure_with_its_last_words(tmp_path, fake):
    fake.plan(crash=True, tests=[])
    status, out = run_memqual(tmp_path)
    assert status == 1
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert "pkg_resources" in results["run"]["avocado"]["summary"]
    # Nothing was measured (the memslot claims may still come from the model).
    assert {c["verdict"] for c in results["claims"] if c["source"] in ("records", "record-extra")} == {"not measurable"}


def test_two_guest_kernels_run_interleaved_in_one_job_and_are_compared(tmp_path, fake, monkeypatch):
    kernels = guest_kernel_args(tmp_path)
    # Kernel B is deliberately slower with smart scan: 1.5x the CPU per scan.
    fake.plan(
        tests=[
            {"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": ksm_record(4.0, scale_b=1.5)},
            {"name": "e2e/test_boot.py:Boot.test_ssh", "status": "PASS", "once": True},
        ]
    )
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    status, out = run_memqual(tmp_path, *kernels)
    # The tests passed; B's scan cost is 1.5x A's on a primary: the run
    # exits as memqual compare would.
    assert status == 1 and "a primary metric is slower on B, exit 1" in out
    calls = fake.calls()
    # One job of the once-per-arm tests, then ONE job with every block inside it.
    assert len(calls) == 2
    assert "--filter-by-tags=kernel-checks,-slow" in calls[0]["argv"]
    # Two kernels run the A/B sizing: the tests tagged ab, in blocks.
    assert "--filter-by-tags=ab,-slow,-boot,-hosts,-host-under-test" in calls[1]["argv"]
    assert calls[1]["env"]["MEMQUAL_PROFILE"] == "ab"
    argv = calls[1]["argv"]
    assert argv[argv.index("--execution-order") + 1] == "variants-per-test"
    variants = json.loads(Path(argv[argv.index("--json-variants-load") + 1]).read_text())
    assert [v["variant_id"] for v in variants] == ["b1-A", "b1-B", "b2-B", "b2-A"]
    params = {k: val for _, k, val in variants[1]["variant"][0][1]}
    assert params["kernel"].endswith("bzImage-b") and params["modules"].endswith("modules-b")
    assert "MEMQUAL_GUEST_KERNEL" not in calls[1]["env"]  # the variant names it, not the job
    a_records = json.loads((tmp_path / "out" / "A" / "results.json").read_text())
    metric = next(m for m in a_records["metrics"] if m["variant"] == {"smart_scan": 1, "pages": "4k"})
    assert metric["blocks"] == [1] * 5 + [2] * 5
    for label in ("A", "B"):
        assert (tmp_path / "out" / label / "results.json").is_file()
        assert (tmp_path / "out" / label / "report.html").is_file()
    comparison = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert "slower" in (tmp_path / "out" / "comparison.html").read_text()
    by = {m["key"].split(" [")[1].split("]")[0]: m for m in comparison["metrics"]}
    assert by["pages=4k, smart_scan=1"]["verdict"] == "slower"
    assert by["pages=4k, smart_scan=0"]["verdict"] == "equivalent"
    assert comparison["regressions"] == 1
    a = json.loads((tmp_path / "out" / "A" / "results.json").read_text())
    b = json.loads((tmp_path / "out" / "B" / "results.json").read_text())
    assert a["run"]["guest_kernel"]["sha256"] != b["run"]["guest_kernel"]["sha256"]
    # No record named the guest kernel: the fingerprint takes the given file's hash.
    assert a["environment"]["guest_kernel_sha256"] == a["run"]["guest_kernel"]["sha256"]
    assert comparison["environment_differences"]["guest_kernel_sha256"]["b"] == b["run"]["guest_kernel"]["sha256"]


def test_rounds_pool_samples_and_keep_each_round(tmp_path, fake):
    records = ksm_record(5.0)
    for rec in records:
        rec["round_scale"] = {"2": 1.1, "3": 0.9}  # round 2 ran on a busier host, round 3 a quieter one
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": records}])
    status, out = run_memqual(tmp_path, "--rounds", "3")
    assert status == 0
    assert len(fake.calls()) == 3
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["run"]["rounds"] == 3 and len(results["run"]["avocado_rounds"]) == 3
    metric = next(m for m in results["metrics"] if m["variant"] == {"smart_scan": 0, "pages": "4k"})
    assert len(metric["samples"]) == 15  # 5 repeats x 3 rounds, pooled
    assert metric["samples"][5] == pytest.approx(0.80 * 1.1)  # in round order
    claim = next(c for c in results["claims"] if c["id"] == "ksm-volatile-4k")
    assert len(claim["samples"]["a"]) == 15 and claim["a"]["summary"]["n"] == 15


def test_blocks_alternate_abba_and_the_variant_names_arm_and_block():
    from memqual.host.run import blocks

    assert blocks.block_order(1, 3) == [(1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B")]
    assert blocks.block_order(4, 1) == [(4, "B"), (4, "A")]
    assert blocks.arm_and_block("e2e/test_ksm.py:Ksm.test_merge;b12-B") == ("B", 12)
    assert blocks.arm_and_block("3-e2e_test_ksm.py_Ksm.test_merge_b2-A") == ("A", 2)
    assert blocks.arm_and_block("e2e/test_ksm.py:Ksm.test_merge") is None
    assert blocks.test_reference("e2e/t.py:K.test_m;b1-A") == "e2e/t.py:K.test_m$"
    assert run_avocado_job.selection_filters("quick", ("ksm",), "blocks") == [
        "--filter-by-tags=ksm,-slow,-boot,-hosts,-host-under-test"
    ]
    assert run_avocado_job.selection_filters("full", (), "once") == ["--filter-by-tags=boot", "--filter-by-tags=hosts"]


def test_the_ab_profile_runs_the_tests_tagged_ab_in_blocks_and_the_boot_checks_once():
    assert run_avocado_job.selection_filters("ab", (), "blocks") == [
        "--filter-by-tags=ab,-slow,-boot,-hosts,-host-under-test"
    ]
    assert run_avocado_job.selection_filters("ab", ("ksm",), "blocks") == [
        "--filter-by-tags=ksm,ab,-slow,-boot,-hosts,-host-under-test"
    ]
    assert run_avocado_job.selection_filters("ab", (), "once") == [
        "--filter-by-tags=kernel-checks,-slow",
        "--filter-by-tags=ab-checks,-slow",
    ]
    # Two arms default to the A/B sizing, one to quick; an asked profile wins.
    assert run_config.job_profile(None, 2) == "ab" and run_config.job_profile(None, 1) == "quick"
    assert run_config.job_profile("full", 2) == "full"


def test_every_test_tagged_ab_records_a_primary_or_a_control_and_every_such_test_is_tagged():
    """The tests an A/B runs in blocks are exactly those whose scenarios a
    comparison decides on (their rows' primaries and controls): read from the e2e sources,
    each test's scenarios by the scenario names its module records."""
    from avocado.core.safeloader import find_avocado_tests

    from memqual.host.core.paths import REPO_ROOT

    tagged = set()
    for path in sorted((REPO_ROOT / "e2e").glob("test_*.py")):
        classes, _ = find_avocado_tests(str(path))
        for cls, methods in classes.items():
            for name, tags, *_ in methods:
                if "ab" in tags:
                    tagged.add(f"{path.stem}:{cls}.{name}")
    assert tagged == ab_tests()


def ab_tests() -> set[str]:
    """What an A/B runs in blocks: the e2e test of every row of the scenario
    table tagged ab (each records a primary or a negative control,
    tests/core/test_scenario_table.py)."""
    from memqual.host.core import scenario

    return {row.e2e for row in scenario.table() if "ab" in row.tags}


# The scenarios' checks an A/B runs once per arm (blocks.AB_CHECKS_TAG): they
# record no primary, and pass or fail.
AB_CHECKS = {
    "test_balloon:BalloonCorrectness.test_correctness",
    "test_balloon:BalloonFreePageReporting.test_reporting_off",  # the variant free_page_reporting=False
    "test_balloon:BalloonOomAndStats.test_stats_and_deflate_on_oom",  # balloon.deflate_on_oom, balloon.stats
    "test_ksm:KsmTest.test_merge_off",  # the variant mem_merge=False
}


def test_the_scenarios_checks_run_once_per_arm_of_an_ab():
    from avocado.core.safeloader import find_avocado_tests

    from memqual.host.core.paths import REPO_ROOT
    from memqual.host.run import blocks

    checks = set()
    for path in sorted((REPO_ROOT / "e2e").glob("test_*.py")):
        classes, _ = find_avocado_tests(str(path))
        for cls, methods in classes.items():
            for name, tags, *_ in methods:
                if blocks.AB_CHECKS_TAG in tags:
                    assert "ab" not in tags, f"{cls}.{name}: a check runs once per arm, not in every block"
                    checks.add(f"{path.stem}:{cls}.{name}")
    assert checks == AB_CHECKS
    assert blocks.AB_CHECKS_TAG in blocks.AB_ONCE_PER_ARM_TAGS


def test_every_primary_scenario_has_a_test_tagged_ab():
    from memqual.host.core import scenario
    from memqual.host.judge import primaries

    rows = {row.name: row for row in scenario.table()}
    covered = {name for name, row in rows.items() if "ab" in row.tags and row.e2e}
    assert {p.scenario for p in scenario.every_primary()} <= covered
    assert primaries.controls() <= covered


def test_each_scenario_declares_one_primary_metric_and_says_why():
    """A few primaries: one metric a scenario (the balloon's inflate and
    deflate are two scenarios of one test; ksmd's cost with and without
    smart scan is one metric of two variants, the second the only one a
    host kernel before 6.7 has), each with its reason."""
    from memqual.host.core import scenario

    metrics = {
        p.scenario: {q.metric for q in scenario.every_primary() if q.scenario == p.scenario}
        for p in scenario.every_primary()
    }
    assert all(len(names) == 1 for names in metrics.values()), metrics
    two_variants = [p.scenario for p in scenario.every_primary() if len(p.variant) > 0]
    assert two_variants.count("ksm.volatile_scan") == 2
    assert all(p.why for p in scenario.every_primary())


def test_a_primary_given_for_one_variant_leaves_the_others_exploratory():
    from memqual.host.judge import primaries

    role = primaries.role
    assert role("ksm.volatile_scan", "ksmd_cpu_ns_per_page", {"pages": "4k", "smart_scan": 1}) == "primary"
    assert role("ksm.volatile_scan", "ksmd_cpu_ns_per_page", {"pages": "4k", "smart_scan": 0}) == "primary"
    assert role("ksm.volatile_scan", "ksmd_cpu_ns_per_page", {"pages": "thp", "smart_scan": 1}) == "exploratory"
    assert role("ksm.volatile_scan", "ksmd_cpu_ns_per_page", {"pages": "thp", "smart_scan": 0}) == "exploratory"
    # A variant that does not name the key is not the primary's variant.
    assert role("ksm.volatile_scan", "ksmd_cpu_ns_per_page", {}) == "exploratory"
    assert role("ksm.many_guests", "saved_mib", {"guests": 3}) == "primary"
    assert role("ksm.many_guests", "saved_mib", {"guests": 1}) == "exploratory"
    assert role("balloon.free_page_reporting", "rss_return_s", {"free_page_reporting": False}) == "exploratory"
    assert role("memslots.trace_mmio", "nodes_per_lookup", {"structure": "rbtree"}) == "primary"
    assert role("memslots.trace_mmio", "nodes_per_lookup", {"structure": "linear"}) == "exploratory"
    # The request-size curve: its slope is primary, its points are not.
    assert role("balloon.request_size", "per_page_ns") == "primary"
    assert role("balloon.request_size", "inflate_s", {"per_request": "256 pfns", "pfns": 256}) == "exploratory"
    # A primary given for every variant, and the controls whatever the variant.
    assert role("balloon.inflate", "inflate_s", {"anything": 1}) == "primary"
    assert role("memslots.kvm_lookup", "miss_ns", {"slots": 8}) == "control"
    assert role("balloon.deflate_on_oom", "deflated_mib") == "exploratory"


def test_results_mark_the_primary_variant_only():
    from memqual.host.core.record import Measurement
    from memqual.host.judge.results import MetricEntry

    def entry(pages: str, smart_scan: int) -> MetricEntry:
        rec = Measurement(
            scenario="ksm.volatile_scan",
            metric="ksmd_cpu_ns_per_page",
            unit="ns",
            better="lower",
            samples=[1.0, 2.0],
            variant={"pages": pages, "smart_scan": smart_scan},
        )
        return MetricEntry.of(rec, f"{pages}{smart_scan}")

    # 4 KiB pages with and without smart scan; never THP's
    assert (entry("4k", 1).primary, entry("4k", 0).primary) == (True, True)
    assert (entry("thp", 1).primary, entry("thp", 0).primary) == (False, False)


def test_schedule_alternates_kernels_between_rounds():
    a = run_config.GuestKernel("A", Path("a"), None, "1")
    b = run_config.GuestKernel("B", Path("b"), None, "2")
    order = [(r, k.label if k else None) for r, k in run_config.schedule((a, b), 3)]
    assert order == [(1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B")]
    assert run_config.schedule((None,), 2) == [(1, None), (2, None)]


def test_the_live_display_runs_on_a_terminal(tmp_path, fake):
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": ksm_record(7.8)}])
    status, out = run_memqual(tmp_path, terminal=True)
    assert status == 0
    assert "Claims" in out


def test_progress_follows_the_jobs_events(tmp_path):
    p = run_progress.Progress("t", Console(file=io.StringIO()))
    p.feed(jobevents.JobStarted("fake", str(tmp_path / "job-x"), 7))
    assert p.job_dir == tmp_path / "job-x"
    p.feed(jobevents.TestStarted("2", "e2e/test_ksm.py:Ksm.test_volatile", 7, ""))
    assert (p.index, p.total, p.current) == ("2", 7, "e2e/test_ksm.py:Ksm.test_volatile")
    ended = jobevents.TestEnded(
        "2", "e2e/test_ksm.py:Ksm.test_volatile", 7, "CANCEL", "host KSM sysfs is read-only", 0.11, ""
    )
    line = p.feed(ended)
    assert line is not None
    assert line.endswith("(2/7) e2e/test_ksm.py:Ksm.test_volatile: CANCEL: host KSM sysfs is read-only (0.1 s)")
    assert p.counts == {"CANCEL": 1} and p.current is None
    p.feed(jobevents.JobEnded("PASS", "", 1, 0, 0, 0, 0, 0, 1))
    assert p.summary == "PASS 1 | ERROR 0 | FAIL 0 | SKIP 0 | WARN 0 | INTERRUPT 0 | CANCEL 1" and p.ended
    # A job that did not run to its end has no RESULTS line, as on avocado's console.
    p.feed(jobevents.JobEnded("ERROR", "", 0, 0, 0, 0, 0, 0, 0))
    assert p.summary == ""


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--guest-kernel", "/nonexistent/bzImage", "--guest-modules", "__BZ__"], "no such file"),
        (["--guest-kernel", "__BZ__"], "once per --guest-kernel"),
        (
            ["--guest-kernel", "__BZ__", "--guest-modules", "__BZ__", "--guest-modules", "__BZ__"],
            "once per --guest-kernel",
        ),
        (["--guest-kernel", "__BZ__"] * 3 + ["--guest-modules", "__BZ__"] * 3, "at most twice"),
        (["--only", "ksm;rm -rf /"], "a tag is"),
        (["--parallel", "0"], "at least 1"),
        (["--rounds", "0"], "at least 1"),
    ],
)
def test_bad_input_is_one_line(tmp_path, extra, message):
    bz = tmp_path / "bzImage"
    bz.write_bytes(b"x")
    extra = [str(bz) if e == "__BZ__" else e for e in extra]
    with pytest.raises(BadInput, match=message) as info:
        run_command.config_from_args(run_args(tmp_path, *extra))
    assert "\n" not in str(info.value)


def test_a_missing_avocado_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMQUAL_AVOCADO", str(tmp_path / "absent"))
    with pytest.raises(BadInput, match="no such file"):
        run_avocado_job.avocado_executable()
    monkeypatch.delenv("MEMQUAL_AVOCADO")
    assert os.path.basename(run_avocado_job.avocado_executable()[0]) == "avocado"


def test_progress_lines_keep_avocados_console_form_for_long_reasons_and_skips():
    p = run_progress.Progress("t", Console(file=io.StringIO()))
    long = p.feed(jobevents.TestEnded("1", "t.py:T.test_a", 2, "FAIL", "first\nsecond " + "x" * 300, 2.0, ""))
    assert long is not None and "first\\nsecond xxx" in long and long.endswith("x... (2.0 s)")
    assert len(long.split(": FAIL: ", 1)[1]) == 255 + len("\\") + len("... (2.0 s)")  # cut, then escaped
    skip = p.feed(jobevents.TestEnded("2", "t.py:T.test_b", 2, "SKIP", "no KVM", -1.0, ""))
    assert skip is not None and skip.endswith("(2/2) t.py:T.test_b: SKIP: no KVM")


def test_progress_shows_the_last_repeat_message_of_the_running_test():
    p = run_progress.Progress("t", Console(file=io.StringIO()))
    p.feed(jobevents.TestStarted("1", "e2e/test_ksm.py:Ksm.test_volatile", 1, ""))
    for message in ("booting", "window {'smart_scan': 1, 'cpu_s': 0.5}", "ssh: exit 0"):
        p.feed(jobevents.TestLog(message))
    assert p.repeat == "window {'smart_scan': 1, 'cpu_s': 0.5}"
    p.feed(jobevents.TestEnded("1", "e2e/test_ksm.py:Ksm.test_volatile", 1, "PASS", "", 1.0, ""))
    assert p.repeat == ""


def test_the_live_display_draws_the_same_with_markup_off():
    """rich draws the display again inside every console.print, with that
    print's markup=False: no markup may show through as text."""
    p = run_progress.Progress("memqual run [A] (quick)", Console(file=io.StringIO()))
    p.feed(jobevents.TestStarted("1", "e2e/test_ksm.py:Ksm.test_volatile", 2, ""))
    p.feed(jobevents.TestLog("repeat 2/5 [x] done"))
    for markup in (True, False):
        buf = io.StringIO()
        Console(file=buf, width=120, markup=markup).print(p.render(), markup=markup)
        text = buf.getvalue()
        assert "[bold]" not in text and "[dim]" not in text and "[/]" not in text
        assert "memqual run [A] (quick)" in text and "repeat 2/5 [x] done" in text


def test_one_debian_kernel_against_itself_with_words_added_to_b_s_command_line(tmp_path, monkeypatch):
    """The injected-slowdown A/B: the same kernel, B's guests booted with
    init_on_free=1.  The words reach B's variant and nothing of A's."""
    from memqual.images import build

    bz, mods = tmp_path / "vmlinuz", tmp_path / "modules"
    bz.write_bytes(b"k" * 100)
    mods.mkdir()
    asked: list[str] = []

    def files(version: str) -> tuple[Path, Path]:
        asked.append(version)
        return bz, mods

    monkeypatch.setattr(build, "debian_kernel_files", files)
    config = run_command.config_from_args(
        run_args(tmp_path, "--debian-kernel", "6.1.0-57-amd64", "--debian-kernel", "6.1.0-57-amd64:init_on_free=1")
    )
    assert asked == ["6.1.0-57-amd64", "6.1.0-57-amd64"]
    a, b = config.kernels
    assert (a.cmdline_extra, b.cmdline_extra) == ("", "init_on_free=1")
    a_params, b_params = (run_config.Arm(k.label, k, None).variant_params() for k in (a, b))
    assert b_params.cmdline_extra == "init_on_free=1" and not a_params.cmdline_extra
    assert config.profile == "ab"


@pytest.mark.parametrize("bad", ["6.1.0-57-amd64:init;reboot", ":init_on_free=1", "../x:y"])
def test_a_debian_kernel_with_a_bad_command_line_is_refused_before_anything_runs(tmp_path, bad, capsys):
    with pytest.raises(SystemExit) as stop:
        run_args(tmp_path, "--debian-kernel", bad)
    assert stop.value.code == 2
    assert "--debian-kernel" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("once", "said", "ran", "not_run"),
    [
        (True, "no tests that run in blocks selected: nothing to compare", "(once per arm)", "(block(s) "),
        (False, "no once-per-arm tests selected", "(block(s) 1-2)", "(once per arm)"),
    ],
)
def test_an_ab_whose_only_selects_none_of_a_job_s_tests_starts_no_such_job_and_fails_nothing(
    tmp_path, fake, monkeypatch, once, said, ran, not_run
):
    """Decided from avocado's listing before the job: the one job whose
    tests the listing holds runs, the other is never started."""
    kernels = guest_kernel_args(tmp_path)
    fake.plan(tests=[{"name": "e2e/test_boot.py:Boot.test_ssh", "status": "PASS", "once": once}])
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    status, out = run_memqual(tmp_path, *kernels)
    assert said in out and status == 0, out
    assert len(fake.calls()) == 1 and ran in out and not_run not in out, out
    assert "could not be created" not in out

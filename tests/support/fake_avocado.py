"""A fake ``avocado`` for ``memqual run`` on fakes (the ``fake`` fixture:
what each test reports and records is the test's plan), the run's parsed
arguments, one run in-process, and two guest kernels never booted."""

from __future__ import annotations

import argparse
import io
import json
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.cli.command import parser_for
from memqual.host.run import job as runjob

FAKE_AVOCADO = textwrap.dedent(
    """\
    #!{python}
    # A stand-in for `avocado run`: reads its plan from $FAKE_PLAN, records
    # its argv and memqual environment, writes a job dir like avocado's.
    import json, os, sys, time
    plan = json.load(open(os.environ["FAKE_PLAN"]))
    argv = sys.argv[1:]
    if "list" in argv[:3]:
        # `avocado list --json FILE` (not a job, not recorded as a call): the
        # tests the once-per-arm filter selects, or the others.
        filters = [a for a in argv if a.startswith("--filter-by-tags=")]
        once = any(",boot" in f or "=boot" in f or "=kernel-checks" in f for f in filters)
        if plan.get("list_fails"):
            sys.exit(2)
        chosen = [t for t in plan["tests"] if bool(t.get("once")) == once]
        refs = [a[:-1] for a in argv if a.endswith("$")]
        if refs:
            chosen = [t for t in chosen if t["name"] in refs]
        listed = [{{"Type": "avocado-instrumented", "Test": t["name"]}} for t in chosen]
        with open(argv[argv.index("--json") + 1], "w") as out:
            json.dump(listed, out)
        sys.exit(0)
    env = {{k: v for k, v in os.environ.items() if k.startswith("MEMQUAL_")}}
    with open(os.environ["FAKE_CALLS"], "a") as calls:
        calls.write(json.dumps({{"argv": argv, "env": env}}) + "\\n")
    if plan.get("hang_at_call"):
        # A job that never ends (a guest that hangs): says its pid in
        # $FAKE_HANG, then waits to be ended with the run.
        with open(os.environ["FAKE_CALLS"]) as calls:
            number = sum(1 for _ in calls)
        if number == plan["hang_at_call"]:
            with open(os.environ["FAKE_HANG"], "w") as out:
                out.write("%d\\n" % os.getpid())
            time.sleep(120)
            sys.exit(1)
    if plan.get("crash"):
        sys.stderr.write("Traceback ...\\nModuleNotFoundError: No module named 'pkg_resources'\\n")
        sys.exit(2)
    events = argv[argv.index("--memqual-events") + 1]
    def emit(kind, **fields):
        with open(events, "a") as fh:
            fh.write(json.dumps(dict(event=kind, **fields)) + "\\n")
    results_dir = argv[argv.index("--job-results-dir") + 1]
    label = os.environ.get("MEMQUAL_RUN_LABEL", "")
    round_no = 1 + sum(1 for d in os.listdir(results_dir) if d.startswith("job-")) if os.path.isdir(results_dir) else 1
    filters = [a for a in argv if a.startswith("--filter-by-tags=")]
    refs = [a[:-1] for a in argv if a.endswith("$")]
    tests = plan["tests"]
    if any(",boot" in f or "=boot" in f or "=kernel-checks" in f for f in filters):
        tests = [t for t in tests if t.get("once")]
    elif any("-boot" in f for f in filters):
        tests = [t for t in tests if not t.get("once")]
    if refs:
        tests = [t for t in tests if t["name"] in refs]
    if not tests:
        # avocado's own words when no reference resolves into a test
        sys.stderr.write("Test Suite could not be created. No test references provided nor any other "
                         "arguments resolved into tests\\n")
        sys.exit(2)
    job = os.path.join(results_dir, "job-2026-11-30T01.0%d-fake%s" % (round_no, label))
    os.makedirs(job, exist_ok=True)
    variants = [None]
    if "--json-variants-load" in argv:
        variants = json.load(open(argv[argv.index("--json-variants-load") + 1]))
    # variants-per-test: each test runs all its variants before the next
    tests = [dict(t, variant_params=v) for t in tests for v in variants]
    for t in tests:
        v = t.pop("variant_params")
        if v is not None:
            params = {{k: val for _, k, val in v["variant"][0][1]}}
            t["name"] = t["name"] + ";" + v["variant_id"]
            t["arm"], t["block"] = params["arm"], params["block"]
    emit("job_started", job_id="fake", job_dir=job, total=len(tests))
    out = []
    for i, t in enumerate(tests, 1):
        arm = t.get("arm", label)
        block = str(t.get("block", round_no))
        logdir = os.path.join(job, "test-results", "%d-%s" % (i, t["name"].replace("/", "_").replace(";", "_")))
        emit("test_started", uid=str(i), name=t["name"], total=len(tests), logdir=logdir)
        os.makedirs(os.path.join(logdir, "data"), exist_ok=True)
        emit("test_log", message="repeat 1/5 smart_scan=0")
        for rec in t.get("records", []):
            rec = dict(rec)
            scale = rec.pop("scale_" + arm, 1.0) * rec.pop("round_scale", {{}}).get(block, 1.0)
            rec.pop("scale_A", None), rec.pop("scale_B", None)
            rec["samples"] = [s * scale for s in rec["samples"]]
            # each sample from its own fresh guest: independent replicates
            rec["replicates"] = [[s] for s in rec["samples"]]
            variant = json.dumps(rec.get("variant", {{}}), sort_keys=True).replace(" ", "")
            name = "memqual-%s-%s-%s.json" % (rec["scenario"], rec["metric"], variant)
            with open(os.path.join(logdir, "data", name.replace("/", "_")), "w") as fh:
                json.dump(rec, fh)
        reason = t.get("reason", "")
        emit("test_ended", uid=str(i), name=t["name"], total=len(tests), status=t["status"], reason=reason,
             seconds=0.1, logdir=logdir)
        out.append({{"name": t["name"], "id": "%d-%s" % (i, t["name"]), "status": t["status"], "logdir": logdir,
                    "fail_reason": reason or "<unknown>", "time_elapsed": 0.1}})
    counts = {{s: sum(1 for t in tests if t["status"] == s) for s in ("PASS", "FAIL", "ERROR", "SKIP", "CANCEL")}}
    json.dump({{"tests": out, "pass": counts["PASS"], "failures": counts["FAIL"], "errors": counts["ERROR"],
               "skip": counts["SKIP"], "cancel": counts["CANCEL"], "total": len(tests)}},
              open(os.path.join(job, "results.json"), "w"))
    emit("job_ended", status="PASS", interrupted="", passed=counts["PASS"], errors=counts["ERROR"],
         failed=counts["FAIL"], skipped=counts["SKIP"], warned=0, interrupts=0, cancelled=counts["CANCEL"])
    sys.exit(1 if counts["FAIL"] or counts["ERROR"] else 0)
    """
)


def ksm_record(speedup: float, scale_b: float = 1.0) -> list[dict]:
    base = [0.80, 0.82, 0.79, 0.81, 0.80]
    common = {
        "schema": "memqual.measurement/1",
        "scenario": "ksm.volatile_scan",
        "metric": "ksmd_cpu_ns_per_page",
        "unit": "ns",
        "better": "lower",
        "claim": "ksm-volatile-4k",
        "settings": {"pages_to_scan": 4000},
        "environment": {"accel": "tcg", "host_kernel": "6.18.0-fake"},
    }
    return [
        {**common, "variant": {"smart_scan": 0, "pages": "4k"}, "samples": base},
        {
            **common,
            "variant": {"smart_scan": 1, "pages": "4k"},
            "samples": [s / speedup for s in base],
            "scale_B": scale_b,
        },
        # The dirtying regime, the same in both arms: the cost compares (host/judge/regime.py).
        {
            **common,
            "metric": "dirty_passes_per_scan",
            "unit": "passes/scan",
            "better": "higher",
            "variant": {"pages": "4k"},
            "samples": [10.0, 10.2, 9.9, 10.1, 10.0],
        },
    ]


def slower_deflate_on_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's avocado made the fake one, whose plan is the balloon's
    timing test recording deflate_s, every arm B 1.5 times arm A's (a
    bisect's probes all bad); its calls go to tmp_path/calls.jsonl."""
    script = tmp_path / "avocado"
    script.write_text(FAKE_AVOCADO.format(python=sys.executable))
    script.chmod(0o755)
    rec = {
        "schema": "memqual.measurement/1",
        "scenario": "balloon.deflate",
        "metric": "deflate_s",
        "unit": "s",
        "better": "lower",
        "settings": {"guest_mib": 1024},
        "samples": [1.0, 1.01, 0.99, 1.0, 1.0],
        "scale_B": 1.5,
    }
    test = {"name": "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g", "status": "PASS", "records": [rec]}
    (tmp_path / "plan.json").write_text(json.dumps({"tests": [test]}))
    monkeypatch.setenv("MEMQUAL_AVOCADO", str(script))
    monkeypatch.setenv("FAKE_PLAN", str(tmp_path / "plan.json"))
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls.jsonl"))


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    script = tmp_path / "avocado"
    script.write_text(FAKE_AVOCADO.format(python=sys.executable))
    script.chmod(0o755)
    plan_path, calls = tmp_path / "plan.json", tmp_path / "calls.jsonl"
    monkeypatch.setenv("MEMQUAL_AVOCADO", str(script))
    monkeypatch.setenv("FAKE_PLAN", str(plan_path))
    monkeypatch.setenv("FAKE_CALLS", str(calls))

    class Fake:
        def plan(self, **plan):
            plan_path.write_text(json.dumps(plan))

        def calls(self):
            return [json.loads(line) for line in calls.read_text().splitlines()]

    return Fake()


def run_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = parser_for(run_command.COMMAND)
    tests = tmp_path / "e2e"
    tests.mkdir(exist_ok=True)
    return parser.parse_args(["run", "--output", str(tmp_path / "out"), "--tests", str(tests), *extra])


def run_memqual(tmp_path: Path, *extra: str, terminal: bool = False) -> tuple[int, str]:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=terminal, width=120)
    status = runjob.run(run_command.config_from_args(run_args(tmp_path, *extra)), console)
    return status, buf.getvalue()


def guest_kernel_args(tmp_path: Path) -> list[str]:
    """Two guest kernels, a and b (a bzImage and a modules directory each,
    neither ever booted), as `memqual run` arguments: kernel A, then B."""
    argv = []
    for name in ("a", "b"):
        bz = tmp_path / f"bzImage-{name}"
        bz.write_bytes(name.encode() * 100)
        mods = tmp_path / f"modules-{name}"
        mods.mkdir()
        argv += ["--guest-kernel", str(bz), "--guest-modules", str(mods)]
    return argv

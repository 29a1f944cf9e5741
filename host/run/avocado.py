"""One Avocado job under memqual's supervisor: its command line, the
environment the scenarios read, the live view fed by memqual's result
events, and what the job did.  Knows nothing of arms, blocks or claims.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core import nested, settings, trust
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT, open_nofollow, write_private_atomic
from memqual.host.core.profiles import AB, AB_TAG
from memqual.host.run import jobevents
from memqual.host.run.blocks import AB_ONCE_PER_ARM_TAGS, ONCE_PER_ARM_TAGS
from memqual.host.run.config import GuestKernel, JobOutcome, RunConfig, TestOutcome
from memqual.host.run.progress import Progress
from memqual.host.run.signals import (
    INTERRUPT_GRACE_S,
    TERMINATE_GRACE_S,
    Terminated,
    end_job,
    kill_group,
    signals_held,
    start_supervised,
)

if TYPE_CHECKING:
    from rich.console import Console

# ------------------------------------------------------------ avocado


def avocado_executable() -> list[str]:
    """This venv's avocado (the one installed with memqual), or
    ``$MEMQUAL_AVOCADO``."""
    override = settings.avocado()
    if override:
        # run as root: nobody else's to change
        missing = f"{settings.AVOCADO}={override}: no such file, or not executable: point it at an avocado"
        return [str(trust.program(override, settings.AVOCADO, missing))]
    beside = Path(sys.executable).parent / "avocado"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("avocado")
    if found:
        return [found]
    raise BadInput("avocado not found: install memqual in its venv (pip install -e .) and run .venv/bin/memqual")


# The tag of a test that runs only on a host under test (its guests' host
# is L1, which it drives): left out of blocks whose guests run here.
HOST_UNDER_TEST_TAG = "host-under-test"


def tag_filters(profile: str, only: tuple[str, ...]) -> list[str]:
    """avocado --filter-by-tags arguments.  Several --filter-by-tags are
    ORed, commas inside one are ANDed: so "--only ksm --only balloon" in the
    quick profile is (ksm AND NOT slow) OR (balloon AND NOT slow)."""
    not_slow = ["-slow"] if profile != "full" else []
    args: list[str] = []
    if only:
        for tag in only:
            args.append("--filter-by-tags=" + ",".join([tag, *not_slow]))
    elif not_slow:
        # Untagged tests stay in: only tests that say "slow" are left out.
        args += ["--filter-by-tags=-slow", "--filter-by-tags-include-empty"]
    return args


def selection_filters(
    profile: str, only: tuple[str, ...], selection: str, on_a_host_under_test: bool = False
) -> list[str]:
    """tag_filters for a blocked job: "once" keeps only the tests tagged
    with one of blocks.ONCE_PER_ARM_TAGS, "blocks" leaves them out.  In the
    ab profile the blocks hold only the tests tagged ``ab`` (they record a
    primary or a negative control) and "once" only the boot checks.  Blocks
    whose guests run on this machine leave out the tests tagged
    HOST_UNDER_TEST_TAG, which run only on a host under test."""
    if not selection:
        return tag_filters(profile, only)
    not_slow = ["-slow"] if profile != "full" else []
    ab = [AB_TAG] if profile == AB else []
    if selection == "blocks":
        drop = [f"-{tag}" for tag in ONCE_PER_ARM_TAGS]
        drop += [] if on_a_host_under_test else [f"-{HOST_UNDER_TEST_TAG}"]
        terms = [[tag, *ab, *not_slow, *drop] for tag in only] if only else [[*ab, *not_slow, *drop]]
        extra = [] if only or ab else ["--filter-by-tags-include-empty"]
        return ["--filter-by-tags=" + ",".join(t) for t in terms] + extra
    once_tags = AB_ONCE_PER_ARM_TAGS if profile == AB else ONCE_PER_ARM_TAGS
    terms = [[*([tag] if tag != once else []), once, *not_slow] for tag in (only or ("",)) for once in once_tags]
    return ["--filter-by-tags=" + ",".join(t for t in term if t) for term in terms]


def test_references(config: RunConfig) -> tuple[str, ...]:
    """What a job of ``config`` names for avocado to resolve: its
    references, else its tests' directory, file or test (a bisect narrows
    its rounds to "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g"),
    relative to the repository avocado runs in."""
    if config.references:
        return config.references
    tests = config.tests
    try:
        return (str(tests.resolve().relative_to(REPO_ROOT)) + ("/" if tests.is_dir() else ""),)
    except ValueError:
        return (str(tests),)


# ``avocado list`` resolves without importing the test modules: about 1.5 s here.
LIST_TIMEOUT_S = 120.0


def list_tests(config: RunConfig) -> list[str] | None:
    """The tests a job of ``config`` would run, by name (one per test, not
    per variant): ``avocado list`` with the job's references and filters,
    read from its JSON output.  None when avocado could not say (its error
    is the job's to report)."""
    # A directory of our own (mode 0700): the file avocado writes is read back.
    with tempfile.TemporaryDirectory(prefix="memqual-list-") as tmp:
        listing = Path(tmp) / "tests.json"
        command = [
            *avocado_executable(),
            *config.avocado_global_args,
            "list",
            "--json",
            str(listing),
            *test_references(config),
            *selection_filters(config.profile, config.only, config.selection, bool(config.hosts)),
        ]
        try:
            listed = subprocess.run(
                command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False
            )
            entries = json.loads(listing.read_text()) if listed.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            return None
    if not isinstance(entries, list):
        return None
    return [str(e["Test"]) for e in entries if isinstance(e, dict) and "Test" in e]


def avocado_command(
    config: RunConfig, results_dir: Path, xunit: Path | None = None, events: Path | None = None
) -> list[str]:
    blocked = (
        ["--json-variants-load", str(config.variants_file), "--execution-order", "variants-per-test"]
        if config.variants_file is not None
        else []
    )
    return [
        *avocado_executable(),
        *config.avocado_global_args,
        "run",
        *test_references(config),
        *blocked,
        "--job-results-dir",
        str(results_dir),
        "--disable-sysinfo",  # memqual records its own fingerprint; sysinfo costs seconds
        "--max-parallel-tasks",
        str(config.parallel),  # 1 by default: benchmarks must not share the 2 cores
        *selection_filters(config.profile, config.only, config.selection, bool(config.hosts)),
        # JUnit XML for CI dashboards, beside the job (avocado's own copy is
        # inside the job directory, whose name changes every run).
        *(["--xunit", str(xunit)] if xunit is not None else []),
        # The job's events, one JSON line each (host/run/avocado_events.py):
        # what the progress display follows.
        *([jobevents.OPTION, str(events)] if events is not None else []),
    ]


def scenario_environment(config: RunConfig, kernel: GuestKernel | None) -> dict[str, str]:
    env = dict(os.environ)
    env[settings.PROFILE] = config.profile
    env[settings.CLOCK] = config.clock.label  # every guest of the job, both arms alike
    # What a run records is compared (memqual compare, history): its
    # measuring tests' guests boot cold, each an independent draw of a boot
    # rather than the one boot a warm snapshot saved (e2e/base.py).
    env[settings.COLD_MEASURING] = "1"
    for key in settings.PER_ARM:
        env.pop(key, None)
    # One host under test for the whole run is every job's; two are each
    # arm's, set by the arm's variant (e2e/base.py).
    if len(config.hosts) == 1:
        env.update(nested.environment_of(config.hosts[0]))
    if kernel is not None:
        env[settings.GUEST_KERNEL] = str(kernel.bzimage)
        if kernel.modules is not None:
            env[settings.GUEST_MODULES] = str(kernel.modules)
        if kernel.label:
            env[settings.RUN_LABEL] = kernel.label
        if kernel.cmdline_extra:
            env[settings.GUEST_CMDLINE_EXTRA] = kernel.cmdline_extra
        if kernel.kernel_build is not None:
            env[settings.GUEST_KERNEL_BUILD] = str(kernel.kernel_build)
    env.update(config.environment)
    return env


# What memqual writes into each job's directory (beside avocado's
# results.json): the job's wall time against its test runs' own.
JOB_TIME = "job-time.json"


@dataclasses.dataclass(frozen=True)
class JobTime:
    """One job's wall time, from memqual starting avocado to avocado's exit,
    against the sum of Avocado's time of each test run (which holds the
    test module's import, its lock wait and its guests' boots): the rest,
    overhead_s, is avocado's start and end and each run's runner start and
    report (blocks.job_overhead_s models it)."""

    wall_s: float
    test_runs: int
    tests_s: float

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.tests_s

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3),
            "test_runs": self.test_runs,
            "tests_s": round(self.tests_s, 3),
            "overhead_s": round(self.overhead_s, 3),
            "overhead_per_test_run_s": round(self.overhead_s / self.test_runs, 3) if self.test_runs else None,
        }


def job_time(wall_s: float, tests: list[TestOutcome]) -> JobTime:
    return JobTime(wall_s=wall_s, test_runs=len(tests), tests_s=sum(t.time or 0.0 for t in tests))


EXIT_AFTER_END_S = 60.0  # the job's last event came; avocado exits at once
POLL_S = 0.5  # how often the display reads the events file (and redraws)


def run_avocado(
    config: RunConfig, results_dir: Path, kernel: GuestKernel | None, console: Console, round_no: int = 1
) -> JobOutcome:
    """One avocado job, with a progress display; returns what it did."""
    jobevents.check_plugin()
    results_dir.mkdir(parents=True, exist_ok=True)
    xunit = results_dir.parent / "junit" / f"round-{round_no}.xml"
    xunit.parent.mkdir(parents=True, exist_ok=True)
    events = jobevents.create(results_dir, f"events-{round_no}")
    command = avocado_command(config, results_dir, xunit, events)
    before = set(results_dir.glob("job-*"))
    stderr_path = results_dir / "avocado-stderr.log"
    progress = Progress(job_title(config, kernel, round_no), console)
    reader = jobevents.EventsReader(events)
    proc: subprocess.Popen[str] | None = None
    life: int | None = None  # the write end of the supervisor's pipe: the job lives while it is open
    grace = INTERRUPT_GRACE_S
    # avocado's own console output is kept, not read: the events say it all.
    with (
        os.fdopen(open_nofollow(results_dir / "avocado-stdout.log"), "w") as stdout,
        os.fdopen(open_nofollow(stderr_path), "w") as stderr,
    ):
        try:
            # A signal between the start and the finally below would leave
            # the job running: it is held until proc is set.
            with signals_held():
                launched = time.monotonic()
                proc, life = start_supervised(command, scenario_environment(config, kernel), stdout, stderr)
            follow_job(proc, progress, reader, console)
            exit_status = proc.returncode if proc.poll() is not None else end_job(proc, grace_s=0)
            wall_s = time.monotonic() - launched
        except Terminated:
            grace = TERMINATE_GRACE_S
            raise
        finally:
            # Every exit path: a KeyboardInterrupt, SIGTERM/SIGHUP, an error
            # here, or a normal end (then only stragglers are left).
            if proc is not None:
                end_what_is_left(proc, grace)
            if life is not None:
                os.close(life)
    job_dir = progress.job_dir
    if job_dir is None or not job_dir.is_dir():
        created = sorted(set(results_dir.glob("job-*")) - before)
        job_dir = created[-1] if created else None
    tests, counts, test_names = job_results(job_dir)
    if job_dir is not None:
        # A figure to read later: the job's results stand without it.
        with contextlib.suppress(OSError):
            write_private_atomic(
                job_dir / JOB_TIME, (json.dumps(job_time(wall_s, tests).to_json(), indent=1) + "\n").encode(), 0o644
            )
    return JobOutcome(
        command=command,
        exit_status=exit_status,
        job_dir=job_dir,
        summary=job_summary(progress, exit_status, stderr_path),
        tests=tests,
        counts=counts,
        test_names=test_names,
    )


def job_title(config: RunConfig, kernel: GuestKernel | None, round_no: int) -> str:
    """The progress display's title: the arm's label, the round of how
    many, the profile."""
    return (
        "memqual run"
        + (f" [{kernel.label}]" if kernel and kernel.label else "")
        + (f" round {round_no}/{config.rounds}" if config.rounds > 1 else "")
        + f" ({config.profile})"
    )


def follow_job(
    proc: subprocess.Popen[str], progress: Progress, reader: jobevents.EventsReader, console: Console
) -> None:
    """The job's events into the progress display (live on a terminal)
    until avocado exits, or hangs on EXIT_AFTER_END_S past the job's end."""
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.live import Live

    live = (
        Live(progress.render(), console=console, refresh_per_second=2, transient=True) if console.is_terminal else None
    )
    if live is not None:
        live.start()
    ended_at: float | None = None
    try:
        while proc.poll() is None:
            print_events(reader, progress, console)
            if live is not None:
                live.update(progress.render())
            if progress.ended and ended_at is None:
                ended_at = time.monotonic()
            if ended_at is not None and time.monotonic() - ended_at > EXIT_AFTER_END_S:
                break  # the job is over but avocado hangs on: ended below
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=POLL_S)
        print_events(reader, progress, console)  # what the job wrote before it exited
    finally:
        if live is not None:
            live.stop()


def print_events(reader: jobevents.EventsReader, progress: Progress, console: Console) -> None:
    """The events written since the last read, fed to the progress; the
    lines they make printed."""
    for event in reader.read():
        printable = progress.feed(event)
        if printable:
            console.print(printable, highlight=False, markup=False, soft_wrap=True)


def end_what_is_left(proc: subprocess.Popen[str], grace_s: float) -> None:
    """A job still running ended (given ``grace_s``); an ended one's
    stragglers in its process group killed."""
    if proc.poll() is None:
        end_job(proc, grace_s=grace_s)
    else:
        kill_group(proc.pid, signal.SIGKILL)


def job_summary(progress: Progress, exit_status: int, stderr_path: Path) -> str:
    """The job's last word from its events; for a failed job without one,
    avocado's exit status and the last line of its stderr."""
    summary = progress.summary
    if not summary and exit_status != 0:
        tail = stderr_path.read_text(errors="replace").strip().splitlines()
        summary = f"avocado exited {exit_status}" + (f": {tail[-1]}" if tail else "")
    return summary


def job_results(job_dir: Path | None) -> tuple[list[TestOutcome], dict[str, int], dict[str, str]]:
    """Tests, counts and each test's results directory name -> its name,
    from avocado's results.json of the job (read once)."""
    if job_dir is None:
        return [], {}, {}
    path = job_dir / "results.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return [], {}, {}
    tests = []
    for t in data.get("tests", []):
        reason = t.get("fail_reason") or ""
        tests.append(
            TestOutcome(
                id=str(t.get("name") or t.get("id") or "?"),
                status=str(t.get("status") or "?"),
                reason="" if reason == "<unknown>" else str(reason),
                time=t.get("time_elapsed"),
            )
        )
    counts = {
        k: int(data[k])
        for k in ("pass", "errors", "failures", "skip", "warn", "interrupt", "cancel", "total")
        if isinstance(data.get(k), int)
    }
    test_names = {Path(str(t.get("logdir") or "")).name: str(t.get("name") or "") for t in data.get("tests", [])}
    return tests, counts, test_names

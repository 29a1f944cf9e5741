"""``memqual run``: the main job.

Run the qualification (avocado run e2e/), judge every claim of
claims/claims.json, write OUTPUT/results.json and OUTPUT/report.html and
print the tables.

Avocado runs as a subprocess of this venv's avocado, with its own job
results directory inside the output directory; memqual shows which test
runs and for how long (from the events memqual's Avocado plugin writes,
host/avocado_events.py), then collects the measurement records of that
job, judges every claim and writes::

    OUTPUT/avocado/job-*/     avocado's job (each test's records in its data/)
    OUTPUT/results.json       environment, verdicts, every metric's samples
    OUTPUT/report.html        the same for people, with plots

and prints the tables.  With two guest kernels (``--guest-kernel A.bzImage
--guest-kernel B.bzImage``), two QEMUs (``--qemu 7.2 --qemu 10.0.2``) or
two of each (paired in order: A is the first kernel on the first QEMU) it
runs the same scenarios on each arm into OUTPUT/A/ and OUTPUT/B/ and
compares them (OUTPUT/comparison.json, the same as ``memqual compare
OUTPUT/A/results.json OUTPUT/B/results.json``).

``--rounds N`` with one kernel runs the whole set N times, one avocado
job each, and merges each metric's records over the rounds
(``record.merge_rounds``): the samples pooled for the medians, every
round's replicates kept as independent units for the statistics.
With two arms (``run_blocked``) the given kernels' images and balloon drivers are
built first, then A and B run interleaved inside one job as Avocado
variants (host/blocks.py): N blocks, A B then B A, each test running all
its blocks before the next test; tests tagged boot or hosts run once per
arm.  The records are stamped with arm and block and split into OUTPUT/A/
and OUTPUT/B/.

Parameters reach the scenarios through the environment (avocado passes it
on to every test):

- ``MEMQUAL_PROFILE``: ``quick`` (default: sized to finish in about 15
  minutes under TCG on 2 cores) or ``full`` (the lab: more repeats, bigger
  guests).  Tests tagged ``slow`` are left out of the quick profile.
- ``MEMQUAL_GUEST_KERNEL`` / ``MEMQUAL_GUEST_MODULES``: a guest kernel
  (bzImage) and its modules directory instead of Debian's, for qualifying a
  patch; ``MEMQUAL_GUEST_KERNEL_BUILD``: the tree it was built in, from
  which the balloon driver variant is built.
- ``MEMQUAL_RUN_LABEL``: ``A`` or ``B`` in an A/B run.
- ``MEMQUAL_QEMU``: the QEMU binary (``--qemu``); in an A/B of QEMUs each
  variant names its arm's, and GuestTest sets it in the test's process.

``MEMQUAL_AVOCADO`` names another avocado executable (the tests use a fake).

avocado runs under memqual.host.supervisor, which ends the job when this
process dies without ending it (SIGKILL, SIGQUIT).

Exit status: 0 when the job ran to completion (a claim that is not
reproduced is a verdict, not a failure); 1 when avocado reported failed or
errored tests or the job itself failed; 2 for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

from memqual.host import cliargs, jobevents
from memqual.host.errors import BadInput
from memqual.host.paths import REPO_ROOT, check_output_dir, write_private_atomic
from memqual.host.profiles import AB, AB_TAG, PROFILES, QUICK

if TYPE_CHECKING:  # imported where used: a run loads the reporting only at its end
    from memqual.host.qemu_binary import QemuChoice
    from memqual.host.results import Results

# avocado's exit status bits (avocado.core.exit_codes)
AVOCADO_TESTS_FAIL = 1
AVOCADO_JOB_FAIL = 2
UNTIL_DECIDED_BUDGET_MIN = 120.0
# With 10 rounds a side the exact permutation test has 184756 splits: the
# stats module's budget; past it p turns Monte Carlo, and a run that long
# should be planned with --rounds instead.
UNTIL_DECIDED_MAX_ROUNDS = 10
# Test statuses that mean "no records from this test, and here is why".
_NOT_PASSED = ("SKIP", "CANCEL", "ERROR", "FAIL", "INTERRUPTED", "INTERRUPT", "WARN")

# The running test's messages that tell how far its repeats are (the
# scenarios log "repeat 2/5 ..." or "window {...}").
_REPEAT = re.compile(r"\b(repeat|window|iteration|round)\w*\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class GuestKernel:
    label: str  # "A" or "B" (empty for a single kernel)
    bzimage: Path
    modules: Path | None
    sha256: str
    cmdline_extra: str = ""  # appended to the guest's kernel command line (a bisect's series)
    kernel_build: Path | None = None  # the tree it was built in (the balloon driver variant's)


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of an A/B: its kernel (None: the default image's) and its
    QEMU (None: the one the job inherits, $MEMQUAL_QEMU or the system's)."""

    label: str  # "A" or "B"
    kernel: GuestKernel | None
    qemu: QemuChoice | None


@dataclasses.dataclass(frozen=True)
class RunConfig:
    output: Path
    profile: str = "quick"
    only: tuple[str, ...] = ()
    tests: Path = REPO_ROOT / "e2e"
    kernels: tuple[GuestKernel, ...] = ()
    # The --qemu of each arm, resolved (fetched) by main: one for every
    # arm, or two for A and B (blocks.arm_axes pairs them with the kernels).
    qemus: tuple[QemuChoice, ...] = ()
    parallel: int = 1
    rounds: int = 1  # avocado jobs per kernel; A and B alternate between rounds
    until_decided: bool = False  # two arms: add rounds until every metric is decided (host/bisect/until.py)
    budget_min: float = UNTIL_DECIDED_BUDGET_MIN  # wall time of the whole run with until_decided
    avocado_global_args: tuple[str, ...] = ()  # before "run": --config FILE (the lab hosts' spawner, host/hosts/)
    environment: tuple[tuple[str, str], ...] = ()  # set in the job's environment last (the lab hosts' TMPDIR)
    # A blocked A/B job (host/blocks.py): its variants file, the
    # tests it names (empty: config.tests) and which tests it selects:
    # "once" the once-per-arm tests, "blocks" the others, "" all.
    variants_file: Path | None = None
    references: tuple[str, ...] = ()
    selection: str = ""


@dataclasses.dataclass
class TestOutcome:
    id: str
    status: str
    reason: str
    time: float | None


@dataclasses.dataclass
class JobOutcome:
    """What one avocado job did."""

    command: list[str]
    exit_status: int
    job_dir: Path | None
    summary: str
    tests: list[TestOutcome]
    counts: dict[str, int]

    @property
    def completed(self) -> bool:
        return self.exit_status == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "exit_status": self.exit_status,
            "job_dir": str(self.job_dir) if self.job_dir else None,
            "summary": self.summary,
            "counts": self.counts,
        }


# ------------------------------------------------------------ avocado


def avocado_executable() -> list[str]:
    """This venv's avocado (the one installed with memqual), or
    ``$MEMQUAL_AVOCADO``."""
    override = os.environ.get("MEMQUAL_AVOCADO")
    if override:
        path = Path(override)
        if not path.is_file():
            raise BadInput(f"MEMQUAL_AVOCADO={override}: no such file")
        return [str(path)]
    beside = Path(sys.executable).parent / "avocado"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("avocado")
    if found:
        return [found]
    raise BadInput("avocado not found: install memqual in its venv (pip install -e .) and run .venv/bin/memqual")


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


def selection_filters(profile: str, only: tuple[str, ...], selection: str) -> list[str]:
    """tag_filters for a blocked job: "once" keeps only the tests tagged
    with one of blocks.ONCE_PER_ARM_TAGS, "blocks" leaves them out.  In the
    ab profile the blocks hold only the tests tagged ``ab`` (they record a
    primary or a negative control) and "once" only the boot checks."""
    from memqual.host.blocks import AB_ONCE_PER_ARM_TAGS, ONCE_PER_ARM_TAGS

    if not selection:
        return tag_filters(profile, only)
    not_slow = ["-slow"] if profile != "full" else []
    ab = [AB_TAG] if profile == AB else []
    if selection == "blocks":
        drop = [f"-{tag}" for tag in ONCE_PER_ARM_TAGS]
        terms = [[tag, *ab, *not_slow, *drop] for tag in only] if only else [[*ab, *not_slow, *drop]]
        extra = [] if only or ab else ["--filter-by-tags-include-empty"]
        return ["--filter-by-tags=" + ",".join(t) for t in terms] + extra
    once_tags = AB_ONCE_PER_ARM_TAGS if profile == AB else ONCE_PER_ARM_TAGS
    terms = [[*([tag] if tag != once else []), once, *not_slow] for tag in (only or ("",)) for once in once_tags]
    return ["--filter-by-tags=" + ",".join(t for t in term if t) for term in terms]


def avocado_command(
    config: RunConfig, results_dir: Path, xunit: Path | None = None, events: Path | None = None
) -> list[str]:
    tests = config.tests
    try:
        # A directory, or one file or test (a bisect narrows its rounds to
        # "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g").
        tests_arg = str(tests.resolve().relative_to(REPO_ROOT)) + ("/" if tests.is_dir() else "")
    except ValueError:
        tests_arg = str(tests)
    blocked = (
        ["--json-variants-load", str(config.variants_file), "--execution-order", "variants-per-test"]
        if config.variants_file is not None
        else []
    )
    return [
        *avocado_executable(),
        *config.avocado_global_args,
        "run",
        *(config.references or (tests_arg,)),
        *blocked,
        "--job-results-dir",
        str(results_dir),
        "--disable-sysinfo",  # memqual records its own fingerprint; sysinfo costs seconds
        "--max-parallel-tasks",
        str(config.parallel),  # 1 by default: benchmarks must not share the 2 cores
        *selection_filters(config.profile, config.only, config.selection),
        # JUnit XML for CI dashboards, beside the job (avocado's own copy is
        # inside the job directory, whose name changes every run).
        *(["--xunit", str(xunit)] if xunit is not None else []),
        # The job's events, one JSON line each (host/avocado_events.py):
        # what the progress display follows.
        *([jobevents.OPTION, str(events)] if events is not None else []),
    ]


def scenario_environment(config: RunConfig, kernel: GuestKernel | None) -> dict[str, str]:
    env = dict(os.environ)
    env["MEMQUAL_PROFILE"] = config.profile
    for key in (
        "MEMQUAL_GUEST_KERNEL",
        "MEMQUAL_GUEST_MODULES",
        "MEMQUAL_GUEST_KERNEL_BUILD",
        "MEMQUAL_RUN_LABEL",
        "MEMQUAL_GUEST_CMDLINE_EXTRA",
    ):
        env.pop(key, None)
    if kernel is not None:
        env["MEMQUAL_GUEST_KERNEL"] = str(kernel.bzimage)
        if kernel.modules is not None:
            env["MEMQUAL_GUEST_MODULES"] = str(kernel.modules)
        if kernel.label:
            env["MEMQUAL_RUN_LABEL"] = kernel.label
        if kernel.cmdline_extra:
            env["MEMQUAL_GUEST_CMDLINE_EXTRA"] = kernel.cmdline_extra
        if kernel.kernel_build is not None:
            env["MEMQUAL_GUEST_KERNEL_BUILD"] = str(kernel.kernel_build)
    env.update(config.environment)
    return env


class Progress:
    """Follows the job's events (host/jobevents.py): which test runs, since
    when, how many finished with which status, how many records exist so
    far, and the last "repeat" message of the running test."""

    def __init__(self, title: str, console: Any) -> None:
        self.title = title
        self.console = console
        self.start = time.monotonic()
        self.current: str | None = None
        self.current_start = self.start
        self.index = ""
        self.total = 0
        self.counts: dict[str, int] = {}
        self.job_dir: Path | None = None
        self.summary = ""
        self.ended = False  # the job's last event came
        self.repeat = ""
        self.finished: list[tuple[str, str, str, float]] = []

    def feed(self, event: jobevents.Event) -> str | None:
        """Digest one event; returns a line worth printing on a non-terminal."""
        if isinstance(event, jobevents.JobStarted):
            self.job_dir = Path(event.job_dir)
        elif isinstance(event, jobevents.TestStarted):
            self.index, self.total = event.uid, event.total
            self.current, self.current_start, self.repeat = event.name, time.monotonic(), ""
        elif isinstance(event, jobevents.TestEnded):
            self.counts[event.status] = self.counts.get(event.status, 0) + 1
            self.finished.append((event.name, event.status, event.reason, event.seconds))
            if self.current == event.name:
                self.current, self.repeat = None, ""
            # As Avocado's console has it: the reason on one line, cut at
            # 255 characters; a skipped test took no time.
            reason = event.reason if len(event.reason) <= 255 else event.reason[:255] + "..."
            return (
                f"[{self._clock(time.monotonic() - self.start)}] ({event.uid}/{event.total}) {event.name}: "
                + event.status
                + (": " + reason.replace("\n", "\\n") if reason else "")
                + (f" ({event.seconds:.1f} s)" if event.status != "SKIP" else "")
            )
        elif isinstance(event, jobevents.TestLog):
            if self.current is not None and _REPEAT.search(event.message):
                message = event.message.strip()
                self.repeat = message if len(message) <= 90 else message[:87] + "..."
        elif isinstance(event, jobevents.JobEnded):
            self.summary, self.ended = event.summary, True
        return None

    @staticmethod
    def _clock(seconds: float) -> str:
        minutes, secs = divmod(int(seconds), 60)
        return f"{minutes}:{secs:02d}"

    def _records(self) -> int:
        if self.job_dir is None or not self.job_dir.is_dir():
            return 0
        return sum(1 for _ in self.job_dir.rglob("memqual-*.json"))

    def render(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        # Text, not markup: rich draws the display again with the options
        # of each console.print (markup=False for the progress lines).
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold cyan", no_wrap=True)
        grid.add_column(overflow="fold")
        elapsed = self._clock(time.monotonic() - self.start)
        grid.add_row(Text(self.title), Text(f"elapsed {elapsed}, {self._records()} records so far"))
        if self.current:
            grid.add_row(
                Text(f"({self.index}/{self.total})"),
                Text.assemble(self.current, "  ", (self._clock(time.monotonic() - self.current_start), "bold")),
            )
            if self.repeat:
                grid.add_row(Text(""), Text(self.repeat, style="dim"))
        elif not self.finished:
            grid.add_row(Text(""), Text("avocado is discovering tests...", style="dim"))
        if self.counts:
            grid.add_row(Text(""), Text(" ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))))
        return grid


INTERRUPT_GRACE_S = 60.0  # Ctrl-C: avocado interrupts its tests and writes its results
TERMINATE_GRACE_S = 5.0  # SIGTERM/SIGHUP: the job, its guests and all must be gone within 10 s
EXIT_AFTER_END_S = 60.0  # the job's last event came; avocado exits at once
POLL_S = 0.5  # how often the display reads the events file (and redraws)


class Terminated(KeyboardInterrupt):
    """memqual run got SIGTERM or SIGHUP: ends like Ctrl-C, but sooner."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _kill_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when nothing is left in it."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def end_job(proc: subprocess.Popen[str], grace_s: float) -> int:
    """End avocado's process group: SIGINT (avocado interrupts its tests,
    and they shut their QEMUs down), then after ``grace_s`` SIGKILL to
    whatever of the group is left.  Returns avocado's exit status."""
    if grace_s > 0 and _kill_group(proc.pid, signal.SIGINT):
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(proc.pid, signal.SIGKILL)
    return proc.wait()


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Terminated in the main thread, so the
    finally blocks that end the avocado job run (the default action would
    end memqual at once and leave the job running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    raised: list[int] = []

    def handler(signum: int, frame: object) -> None:
        # Once only: a second signal must not break off the clean-up that
        # the first one started.
        if not raised:
            raised.append(signum)
            raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait for the end of the with-block and are
    then delivered to the handlers they had (terminate_as_exception's, or
    KeyboardInterrupt): for a block that starts a process the caller's
    finally must end, where an exception half-way would leave it running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: object) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            # None: a handler not set from Python; the default is the nearest
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def schedule(kernels: tuple[GuestKernel | None, ...], rounds: int) -> list[tuple[int, GuestKernel | None]]:
    """(round, kernel) in the order to run them: A B, then B A, then A B...
    (ABBA) so that a drift of the shared host -- load rising, caches
    warming, a thermal limit -- falls on both kernels alike instead of on
    whichever ran second."""
    order: list[tuple[int, GuestKernel | None]] = []
    for index in range(rounds):
        ordered = kernels if index % 2 == 0 else tuple(reversed(kernels))
        order += [(index + 1, kernel) for kernel in ordered]
    return order


def start_supervised(
    command: list[str], env: dict[str, str], stdout: IO[str], stderr: IO[str]
) -> tuple[subprocess.Popen[str], int]:
    """Start ``command`` (avocado) under memqual.host.supervisor, in a new
    session whose group it leads: avocado, its test runners and their
    QEMUs are ended together by end_job(), whatever ends memqual, and by
    the supervisor when memqual dies without ending them (a SIGKILL): it
    holds the read end of a pipe whose write end, returned here, only this
    process holds (os.pipe's ends are not inherited)."""
    life_read, life_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memqual.host.supervisor", "--grace", str(TERMINATE_GRACE_S), "--", *command],
            cwd=REPO_ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
            stdin=life_read,
            text=True,
            start_new_session=True,
        )
    except BaseException:
        os.close(life_write)
        raise
    finally:
        os.close(life_read)
    return proc, life_write


def run_avocado(
    config: RunConfig, results_dir: Path, kernel: GuestKernel | None, console: Any, round_no: int = 1
) -> JobOutcome:
    """One avocado job, with a progress display; returns what it did."""
    from rich.live import Live

    jobevents.check_plugin()
    results_dir.mkdir(parents=True, exist_ok=True)
    xunit = results_dir.parent / "junit" / f"round-{round_no}.xml"
    xunit.parent.mkdir(parents=True, exist_ok=True)
    events = jobevents.create(results_dir, f"events-{round_no}")
    command = avocado_command(config, results_dir, xunit, events)
    before = set(results_dir.glob("job-*"))
    stderr_path = results_dir / "avocado-stderr.log"
    title = (
        "memqual run"
        + (f" [{kernel.label}]" if kernel and kernel.label else "")
        + (f" round {round_no}/{config.rounds}" if config.rounds > 1 else "")
        + f" ({config.profile})"
    )
    progress = Progress(title, console)
    reader = jobevents.EventsReader(events)

    def follow() -> None:
        for event in reader.read():
            printable = progress.feed(event)
            if printable:
                console.print(printable, highlight=False, markup=False, soft_wrap=True)

    proc: subprocess.Popen[str] | None = None
    life: int | None = None  # the write end of the supervisor's pipe: the job lives while it is open
    grace = INTERRUPT_GRACE_S
    # avocado's own console output is kept, not read: the events say it all.
    with (results_dir / "avocado-stdout.log").open("w") as stdout, stderr_path.open("w") as stderr:
        try:
            # A signal between the start and the finally below would leave
            # the job running: it is held until proc is set.
            with signals_held():
                proc, life = start_supervised(command, scenario_environment(config, kernel), stdout, stderr)
            live = (
                Live(progress.render(), console=console, refresh_per_second=2, transient=True)
                if console.is_terminal
                else None
            )
            if live is not None:
                live.start()
            ended_at: float | None = None
            try:
                while proc.poll() is None:
                    follow()
                    if live is not None:
                        live.update(progress.render())
                    if progress.ended and ended_at is None:
                        ended_at = time.monotonic()
                    if ended_at is not None and time.monotonic() - ended_at > EXIT_AFTER_END_S:
                        break  # the job is over but avocado hangs on: ended below
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=POLL_S)
                follow()  # what the job wrote before it exited
            finally:
                if live is not None:
                    live.stop()
            exit_status = proc.returncode if proc.poll() is not None else end_job(proc, grace_s=0)
        except Terminated:
            grace = TERMINATE_GRACE_S
            raise
        finally:
            # Every exit path: a KeyboardInterrupt, SIGTERM/SIGHUP, an error
            # here, or a normal end (then only stragglers are left).
            if proc is not None:
                if proc.poll() is None:
                    end_job(proc, grace_s=grace)
                else:
                    _kill_group(proc.pid, signal.SIGKILL)
            if life is not None:
                os.close(life)
    job_dir = progress.job_dir
    if job_dir is None or not job_dir.is_dir():
        created = sorted(set(results_dir.glob("job-*")) - before)
        job_dir = created[-1] if created else None
    tests, counts = _job_results(job_dir)
    summary = progress.summary
    if not summary and exit_status != 0:
        tail = stderr_path.read_text(errors="replace").strip().splitlines()
        summary = f"avocado exited {exit_status}" + (f": {tail[-1]}" if tail else "")
    return JobOutcome(
        command=command,
        exit_status=exit_status,
        job_dir=job_dir,
        summary=summary,
        tests=tests,
        counts=counts,
    )


def _job_results(job_dir: Path | None) -> tuple[list[TestOutcome], dict[str, int]]:
    """Tests and counts from avocado's results.json of the job."""
    if job_dir is None:
        return [], {}
    path = job_dir / "results.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return [], {}
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
    return tests, counts


# ------------------------------------------------------------ results


def collect_records(job_dir: Path | None) -> tuple[list[Any], list[str]]:
    """Every record of the job; a broken record is reported, not fatal."""
    from memqual.host import record

    if job_dir is None:
        return [], []
    records, problems = [], []
    for path in sorted(job_dir.rglob(record.RECORD_GLOB)):
        try:
            records.append(record.load(path))
        except BadInput as exc:
            problems.append(str(exc))
    return records, problems


def write_outputs(
    out_dir: Path,
    jobs: list[JobOutcome],
    config: RunConfig,
    kernel: GuestKernel | None,
    console: Any,
) -> Results:
    """Verdicts, results.json, report.html and the tables for one kernel's
    jobs (one per round; their records pooled by ``record.merge_rounds``)."""
    from memqual.host import record

    records, problems = [], []
    for job in jobs:
        job_records, job_problems = collect_records(job.job_dir)
        records += job_records
        problems += job_problems
    tests = [(index + 1, t) for index, job in enumerate(jobs) for t in job.tests]
    return write_arm_outputs(out_dir, record.merge_rounds(records), problems, tests, jobs, config, kernel, console)


def write_arm_outputs(
    out_dir: Path,
    records: list[Any],
    problems: list[str],
    tests: list[tuple[int, TestOutcome]],
    jobs: list[JobOutcome],
    config: RunConfig,
    kernel: GuestKernel | None,
    console: Any,
    qemu: QemuChoice | None = None,
    label: str = "",
) -> Results:
    """write_outputs from records already merged and the tests (with the
    number of the job that ran each) that wrote them; ``qemu`` and
    ``label``: an A/B arm's QEMU and name where its kernel does not say."""
    from memqual.host import claims, report
    from memqual.host.results import build_results, write_results

    for problem in problems:
        console.print(f"[yellow]skipped a record:[/] {problem}", highlight=False)
    skips = [claims.Skip(test=t.id, status=t.status, reason=t.reason) for _, t in tests if t.status in _NOT_PASSED]
    verdicts = claims.evaluate(claims.load(), records, skips=skips, only=config.only)
    run_info: dict[str, Any] = {
        "profile": config.profile,
        "only": list(config.only),
        "label": label or (kernel.label if kernel else ""),
        "guest_kernel": (
            {
                "bzimage": str(kernel.bzimage),
                "modules": str(kernel.modules) if kernel.modules else None,
                "sha256": kernel.sha256,
            }
            if kernel
            else None
        ),
        "qemu": qemu_json(qemu),
        "rounds": len(jobs),
        # The first job's summary heads the report; every round's is listed.
        "avocado": jobs[0].to_json(),
        "avocado_rounds": [job.to_json() for job in jobs],
        "tests": [dataclasses.asdict(t) | {"round": number} for number, t in tests],
        "record_problems": problems,
    }
    results = build_results(verdicts, records, run=run_info)
    env = results["environment"]
    if kernel is not None and env.get("guest_kernel_sha256") is None:
        env["guest_kernel_sha256"] = kernel.sha256
        env.setdefault("environment_sources", {})["guest_kernel_sha256"] = "the --guest-kernel file (no record said)"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(results, out_dir / "results.json")
    report.write_html(results, out_dir / "report.html")
    report.print_tables(results, console)
    console.print(f"wrote {out_dir / 'results.json'} and {out_dir / 'report.html'}", highlight=False)
    return results


def run_arms(config: RunConfig) -> tuple[Arm, ...]:
    """The two arms of an A/B (blocks.arm_axes pairs the kernels and the
    QEMUs), or () when the run has one arm."""
    from memqual.host.blocks import arm_axes

    axes = arm_axes(len(config.kernels), len(config.qemus))
    if len(axes) != 2:
        return ()
    arms = []
    for label, (k, q) in zip("AB", axes, strict=True):
        kernel = dataclasses.replace(config.kernels[k], label=label) if k is not None else None
        arms.append(Arm(label, kernel, config.qemus[q] if q is not None else None))
    return tuple(arms)


def qemu_json(qemu: QemuChoice | None) -> dict[str, str] | None:
    """An arm's QEMU as results.json and comparison.json name it."""
    if qemu is None:
        return None
    return {"version": qemu.version, "origin": qemu.origin, "binary": str(qemu.binary)}


def _out_dir(config: RunConfig, kernel: GuestKernel | None) -> Path:
    return config.output / kernel.label if kernel and kernel.label else config.output


def run(config: RunConfig, console: Any = None) -> int:
    from rich.console import Console

    # Logs and CI get 120 columns; a terminal its own width.
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    config.output.mkdir(parents=True, exist_ok=True)
    arms = run_arms(config)
    if len(arms) == 2:
        return run_blocked(config, (arms[0], arms[1]), console)
    kernels: tuple[GuestKernel | None, ...] = config.kernels or (None,)
    jobs: dict[str, list[JobOutcome]] = {}

    def one_job(round_no: int, kernel: GuestKernel | None, total: int) -> None:
        label = kernel.label if kernel else ""
        with terminate_as_exception():
            job = run_avocado(
                dataclasses.replace(config, rounds=total),
                _out_dir(config, kernel) / "avocado",
                kernel,
                console,
                round_no,
            )
        console.print(
            (f"round {round_no}/{total} " if total > 1 else "")
            + (f"[{label}] " if label else "")
            + f"avocado: {job.summary or 'no summary'} (exit {job.exit_status}); job directory {job.job_dir}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        jobs.setdefault(label, []).append(job)

    for round_no, kernel in schedule(kernels, config.rounds):
        one_job(round_no, kernel, config.rounds)
    outcomes = [job for label_jobs in jobs.values() for job in label_jobs]
    for kernel in kernels:
        write_outputs(_out_dir(config, kernel), jobs[kernel.label if kernel else ""], config, kernel, console)
    return _exit_status(outcomes, console)


def _exit_status(outcomes: list[JobOutcome], console: Any) -> int:
    failed = [j for j in outcomes if not j.completed]
    if failed:
        console.print(
            "[bold red]avocado reported failed or errored tests (or the job failed):[/] "
            + "; ".join(j.summary or f"exit {j.exit_status}" for j in failed),
            highlight=False,
        )
        return 1
    return 0


# ------------------------------------------------------- A/B in blocks


class DecisionTracker(Protocol):
    """What the run needs of host/bisect/until.py's Tracker."""

    planned_looks: int

    def alpha_at(self, look: int) -> float: ...
    def update(self, look: int, records_a: list[Any], records_b: list[Any]) -> bool: ...
    def undecided_scenarios(self) -> set[str]: ...
    def to_json(self, stopped: str, budget_min: float) -> dict[str, Any]: ...


def planned_looks(left_s: float, block_s: float) -> int:
    """The looks an until-decided run plans at its first look: that one
    and one after each further block of every test that fits in what is
    left of the budget (at least 1, at most until.PLANNED_LOOKS).  Blocks
    of fewer tests (the decided scenarios drop out) are cheaper, so the
    budget may hold more blocks than planned: the run then stops at the
    planned looks, its alpha spent."""
    from memqual.host.bisect.until import PLANNED_LOOKS

    if block_s <= 0:
        return PLANNED_LOOKS  # no test's time known: the most planned
    more = max(0, int(left_s // block_s))
    return min(PLANNED_LOOKS, 1 + more)


def make_tracker() -> DecisionTracker:
    from memqual.host import compare
    from memqual.host.bisect.until import Tracker

    return cast(DecisionTracker, Tracker(threshold=compare.DEFAULT_THRESHOLD, alpha=compare.DEFAULT_ALPHA))


def prebuild(kernels: tuple[GuestKernel, ...], console: Any) -> None:
    """The given kernels' images and balloon driver variants, before any
    job: a kernel that cannot be built is bad input before anything ran,
    not a job of skips."""
    from memqual.host.errors import CapabilityMissing
    from memqual.images import balloon_driver
    from memqual.images.build import KernelSource, build

    for k in kernels:
        try:
            image = build(KernelSource(k.bzimage, k.modules))
        except (CapabilityMissing, OSError, subprocess.CalledProcessError) as exc:
            raise BadInput(f"kernel {k.label} ({k.bzimage}): its guest image cannot be built: {exc}") from None
        try:
            if k.kernel_build is not None:
                variant = balloon_driver.build_from_tree(k.kernel_build, image.release)
            elif balloon_driver.debian_release_of(k.bzimage):
                variant = balloon_driver.build(image.release)
            else:
                console.print(
                    f"kernel {k.label}: no --kernel-build tree, so the balloon driver scenario skips on it",
                    highlight=False,
                    markup=False,
                )
                continue
        except (CapabilityMissing, OSError, subprocess.CalledProcessError) as exc:
            raise BadInput(f"kernel {k.label}: its balloon driver variant cannot be built: {exc}") from None
        console.print(f"kernel {k.label}: image {image.release}, balloon driver {variant.ko}", highlight=False)


def arm_params(k: GuestKernel | None, qemu: QemuChoice | None = None, label: str = "") -> Any:
    """An arm's variant params (blocks.ArmParams): its kernel's files (none:
    the default image) and its QEMU's binary (none: the job's)."""
    from memqual.host.blocks import ArmParams

    return ArmParams(
        arm=label or (k.label if k is not None else ""),
        kernel=str(k.bzimage) if k is not None else "",
        modules=str(k.modules or "") if k is not None else "",
        kernel_build=str(k.kernel_build or "") if k is not None else "",
        cmdline_extra=k.cmdline_extra if k is not None else "",
        qemu=str(qemu.binary) if qemu is not None else "",
    )


@dataclasses.dataclass
class BlockedRun:
    """The jobs of an A/B run and what their records say."""

    jobs: list[JobOutcome] = dataclasses.field(default_factory=list)
    records: list[Any] = dataclasses.field(default_factory=list)  # stamped with arm and block
    problems: list[str] = dataclasses.field(default_factory=list)
    tests: list[tuple[int, TestOutcome]] = dataclasses.field(default_factory=list)
    scenario_tests: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # scenario -> test names
    test_seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # test name -> each variant's
    blocks: int = 0

    def take(self, job: JobOutcome, in_blocks: bool = True) -> None:
        """Add a finished job: its records stamped with the arm and block of
        the variant that wrote them.  Only a block job's tests are the ones
        more blocks of a scenario re-run: a once-per-arm check that records
        the same scenario (an off-control) runs once, and its time is no
        part of a block's."""
        from memqual.host import blocks

        self.jobs.append(job)
        number = len(self.jobs)
        self.tests += [(number, t) for t in job.tests]
        for t in job.tests:
            if t.time is not None:
                self.test_seconds.setdefault(t.id.split(";", 1)[0], []).append(float(t.time))
        if job.job_dir is None:
            return
        names = _logdir_names(job.job_dir)
        from memqual.host import record

        for path in sorted(job.job_dir.rglob(record.RECORD_GLOB)):
            try:
                m = record.load(path)
            except BadInput as exc:
                self.problems.append(str(exc))
                continue
            test_dir = blocks.record_test_dir(path)
            where = blocks.arm_and_block(test_dir.name) if test_dir else None
            if where is None:
                self.problems.append(f"{path}: not from a variant of this run (no arm, no block)")
                continue
            blocks.stamp(m, *where)
            self.records.append(m)
            name = names.get(test_dir.name) if test_dir else None
            if name and in_blocks:
                self.scenario_tests.setdefault(m.scenario, set()).add(name.split(";", 1)[0])

    def of_arm(self, arm: str) -> list[Any]:
        return [m for m in self.records if m.arm == arm]

    def tests_of_arm(self, arm: str) -> list[tuple[int, TestOutcome]]:
        from memqual.host import blocks

        return [(n, t) for n, t in self.tests if (blocks.arm_and_block(t.id) or ("",))[0] == arm]

    def seconds_per_block(self, names: set[str]) -> float:
        """About how long one more block of these tests takes: each test's
        mean time per variant, twice (A and B)."""
        return sum(2 * sum(self.test_seconds[n]) / len(self.test_seconds[n]) for n in names if self.test_seconds.get(n))


def _logdir_names(job_dir: Path) -> dict[str, str]:
    """Results directory name -> test name, from avocado's results.json."""
    try:
        data = json.loads((job_dir / "results.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {Path(str(t.get("logdir") or "")).name: str(t.get("name") or "") for t in data.get("tests", [])}


# Each avocado job starts in a few seconds here; a block's estimate adds it.
JOB_START_S = 10.0


def run_block_job(
    config: RunConfig,
    arms: dict[str, Any],
    order: list[tuple[int, str]],
    number: int,
    console: Any,
    selection: str = "blocks",
    references: tuple[str, ...] = (),
) -> JobOutcome:
    """One avocado job of the (block, arm) variants in ``order`` (arms:
    blocks.ArmParams by arm), its variants file OUTPUT/variants/job-N.json
    and its jobs under OUTPUT/avocado; feed it to BlockedRun.take."""
    from memqual.host import blocks

    variants_file = config.output / "variants" / f"job-{number}.json"
    variants_file.parent.mkdir(parents=True, exist_ok=True)
    variants_file.write_text(json.dumps(blocks.variants(order, arms), indent=1) + "\n")
    job_config = dataclasses.replace(
        config,
        variants_file=variants_file,
        selection=selection,
        references=references,
        rounds=max((block for block, _ in order), default=1),
    )
    with terminate_as_exception():
        return run_avocado(job_config, config.output / "avocado", None, console, number)


def run_blocked(config: RunConfig, run_arms: tuple[Arm, Arm], console: Any) -> int:
    """Two arms (two kernels, two QEMUs, or two of each), interleaved: the
    images and balloon drivers of the given kernels built, then the
    once-per-arm tests (block 1 of each arm) and ONE job in which every
    other test runs its blocks A B, B A, ...; with until_decided, more
    blocks of only the tests whose scenarios are undecided."""
    from memqual.host import blocks, record

    started = time.monotonic()
    given = {a.kernel.bzimage: a.kernel for a in run_arms if a.kernel is not None}
    prebuild(tuple(given.values()), console)
    for a in run_arms:
        console.print(f"arm {a.label}: {arm_line(a)}", highlight=False, markup=False, soft_wrap=True)
    arms = {a.label: arm_params(a.kernel, a.qemu, a.label) for a in run_arms}
    run_state = BlockedRun()

    def job(selection: str, first: int, count: int, references: tuple[str, ...] = ()) -> None:
        number = len(run_state.jobs) + 1
        outcome = run_block_job(config, arms, blocks.block_order(first, count), number, console, selection, references)
        what = "once per arm" if selection == "once" else f"block(s) {first}-{first + count - 1}"
        if selection == "once" and outcome.job_dir is None and "could not be created" in outcome.summary:
            # --only selected none of the once-per-arm tests: nothing ran, nothing failed.
            console.print("no once-per-arm tests selected", highlight=False, markup=False)
            return
        console.print(
            f"job {number} ({what}) avocado: {outcome.summary or 'no summary'} (exit {outcome.exit_status}); "
            f"job directory {outcome.job_dir}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        run_state.take(outcome, in_blocks=selection != "once")

    job("once", 1, 1)
    job("blocks", 1, config.rounds)
    run_state.blocks = config.rounds
    if config.until_decided:
        _until_decided_blocks(config, run_state, job, started, console)
    results = []
    for a in run_arms:
        results.append(
            write_arm_outputs(
                config.output / a.label,
                record.merge_rounds(run_state.of_arm(a.label)),
                run_state.problems,
                run_state.tests_of_arm(a.label),
                run_state.jobs,
                config,
                a.kernel,
                console,
                qemu=a.qemu,
                label=a.label,
            )
        )
    _compare_arms(config, run_arms, results, console)
    return _exit_status(run_state.jobs, console)


def _until_decided_blocks(config: RunConfig, run_state: BlockedRun, job: Any, started: float, console: Any) -> None:
    """More blocks (the order going on ABBA) of only the tests whose
    scenarios have an undecided primary, until none has or the budget is
    spent; writes OUTPUT/until-decided.json."""
    from memqual.host import blocks

    tracker = make_tracker()
    budget_s = config.budget_min * 60.0
    # Plan the looks before the first one, from wall time alone (what is
    # left of the budget over a block of every test), never from what the
    # blocks measured: alpha is then spent over the looks the budget can
    # hold, not over a fixed ten of which a 25-minute run sees two.
    every_test = set().union(*run_state.scenario_tests.values()) if run_state.scenario_tests else set()
    tracker.planned_looks = planned_looks(
        budget_s - (time.monotonic() - started), run_state.seconds_per_block(every_test) + JOB_START_S
    )
    look = 1
    done = tracker.update(look, run_state.of_arm("A"), run_state.of_arm("B"))
    stopped = "every primary decided"
    added: list[dict[str, Any]] = []
    while not done:
        undecided = tracker.undecided_scenarios()
        names = set().union(*(run_state.scenario_tests.get(s, set()) for s in undecided)) if undecided else set()
        if not names:
            stopped = "no test left to run for the undecided scenarios: " + ", ".join(sorted(undecided))
            break
        need = run_state.seconds_per_block(names) + JOB_START_S
        elapsed = time.monotonic() - started
        if elapsed + need > budget_s:
            stopped = (
                f"budget spent ({config.budget_min:g} min; one more block of {len(names)} test(s) "
                f"takes about {need / 60:.1f} min)"
            )
            break
        if tracker.alpha_at(look + 1) <= 0:
            # Every planned look's share of alpha is spent: another block
            # could not decide anything.
            stopped = f"the {tracker.planned_looks} planned looks are spent"
            break
        block = run_state.blocks + 1
        job("blocks", block, 1, tuple(sorted(blocks.test_reference(n) for n in names)))
        run_state.blocks = block
        added.append({"block": block, "scenarios": sorted(undecided), "tests": sorted(names)})
        look += 1
        done = tracker.update(look, run_state.of_arm("A"), run_state.of_arm("B"))
    summary = tracker.to_json(stopped, config.budget_min)
    summary["blocks"] = run_state.blocks
    summary["added_blocks"] = added
    summary["wall_s"] = round(time.monotonic() - started, 1)
    write_private_atomic(config.output / "until-decided.json", (json.dumps(summary, indent=2) + "\n").encode(), 0o644)
    console.print(
        f"until decided: {run_state.blocks} block(s), {stopped}", highlight=False, markup=False, soft_wrap=True
    )
    console.print(f"wrote {config.output / 'until-decided.json'}", highlight=False, markup=False)


def arm_line(arm: Arm) -> str:
    """What an arm is made of, in one line: its kernel and its QEMU."""
    kernel = f"kernel {arm.kernel.bzimage}" if arm.kernel is not None else "the default kernel"
    qemu = (
        f"QEMU {arm.qemu.version} ({arm.qemu.origin})"
        if arm.qemu is not None
        else "the QEMU of the environment ($MEMQUAL_QEMU or the system's)"
    )
    return f"{kernel}, {qemu}"


def _compare_arms(config: RunConfig, arms: tuple[Arm, Arm], results: list[Results], console: Any) -> None:
    from memqual.host import compare

    try:
        result = compare.compare_results(results[0], results[1])
    except BadInput as exc:
        console.print(f"[yellow]no comparison of A and B:[/] {exc}", highlight=False)
        return
    for a in arms:
        console.print(f"{a.label}: {arm_line(a)}", highlight=False, markup=False, soft_wrap=True)
    out = result.to_json()
    out.update({"a": str(config.output / "A" / "results.json"), "b": str(config.output / "B" / "results.json")})
    out["arms"] = {
        a.label: {
            "kernel": str(a.kernel.bzimage) if a.kernel is not None else None,
            "kernel_sha256": a.kernel.sha256 if a.kernel is not None else None,
            "qemu": qemu_json(a.qemu),
        }
        for a in arms
    }
    write_private_atomic(config.output / "comparison.json", (json.dumps(out, indent=2) + "\n").encode(), 0o644)
    compare.print_comparison(result, console)
    from memqual.host.compare_report import write_comparison_html

    write_comparison_html(result, results[0], results[1], config.output / "comparison.html")
    console.print(f"wrote {config.output / 'comparison.json'} and {config.output / 'comparison.html'}", highlight=False)


# ------------------------------------------------------------------ CLI


def job_tags(args: argparse.Namespace) -> tuple[str, ...]:
    """--only's tags, checked: each goes into avocado's command line."""
    for tag in args.only or []:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", tag):
            raise BadInput(f"--only {tag!r}: a tag is letters, digits and _ . : - (one tag per --only)")
    return tuple(args.only or ())


def output_directory(args: argparse.Namespace, parent: str) -> Path:
    """--output, else PARENT/<timestamp> below the working directory; in
    either case a folder no other user owns or may write."""
    path = Path(args.output) if args.output else Path(parent) / _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    check_output_dir(path, "output folder")
    return path


def check_budget(minutes: float) -> float:
    """A --budget in minutes: more than 0 and at most a day (nan is neither)."""
    if not 0 < minutes <= 24 * 60:
        raise BadInput(f"--budget {minutes:g}: give minutes, more than 0 and at most a day")
    return minutes


def config_from_args(args: argparse.Namespace) -> RunConfig:
    kernels_in = [Path(k) for k in args.guest_kernel or []]
    modules_in = [Path(m) for m in args.guest_modules or []]
    builds_in = [Path(b) for b in args.kernel_build or []]
    if builds_in and len(builds_in) != len(kernels_in):
        raise BadInput("give --kernel-build DIR once per --guest-kernel, in the same order (or not at all)")
    cmdlines = ["", ""]
    if args.debian_kernel:
        if kernels_in or modules_in:
            raise BadInput("give --debian-kernel or --guest-kernel/--guest-modules, not both")
        if len(args.debian_kernel) > 2:
            raise BadInput("give --debian-kernel at most twice (A and B)")
        from memqual.host.kernelspec import parse_kernel
        from memqual.images.build import debian_kernel_files

        for index, text in enumerate(args.debian_kernel):
            spec = parse_kernel(text)
            bzimage, modules_dir = debian_kernel_files(spec.version)
            kernels_in.append(bzimage)
            modules_in.append(modules_dir)
            cmdlines[index] = spec.cmdline_extra
    if len(kernels_in) > 2:
        raise BadInput("give --guest-kernel at most twice (A and B)")
    if len(modules_in) != len(kernels_in):
        # The image builder needs both: a kernel and its lib/modules/RELEASE.
        raise BadInput("give --guest-modules DIR (lib/modules/RELEASE) once per --guest-kernel, in the same order")
    from memqual.images.build import sha256_file

    kernels = []
    for index, bzimage in enumerate(kernels_in):
        if not bzimage.is_file():
            what = "not a regular file" if bzimage.exists() else "no such file"
            raise BadInput(f"--guest-kernel {bzimage}: {what}: give a bzImage (arch/x86/boot/bzImage)")
        modules = modules_in[index] if modules_in else None
        if modules is not None and not modules.is_dir():
            raise BadInput(f"--guest-modules {modules}: no such directory")
        label = "AB"[index] if len(kernels_in) == 2 else ""
        kernels.append(
            GuestKernel(
                label,
                bzimage.resolve(),
                modules.resolve() if modules else None,
                sha256_file(bzimage),
                kernel_build=builds_in[index] if builds_in else None,
                cmdline_extra=cmdlines[index],
            )
        )
    tests = Path(args.tests)
    # A directory of tests, or a test file (file.py:Class.test names one test).
    test_file = Path(str(tests).split(":", 1)[0])
    if not (tests.is_dir() or (test_file.is_file() and test_file.suffix == ".py")):
        raise BadInput(f"--tests {tests}: no directory of tests or .py test file")
    if not 1 <= args.parallel <= cliargs.COUNT_LIMIT:
        raise BadInput(f"--parallel must be at least 1 and at most {cliargs.COUNT_LIMIT}")
    from memqual.host.blocks import arm_axes

    # Which kernel and QEMU each arm has; bad combinations end here.
    two_arms = len(arm_axes(len(kernels), len(getattr(args, "qemu", None) or []))) == 2
    # Two arms: two blocks (A B, then B A) unless told; one arm: one round.
    rounds = args.rounds if args.rounds is not None else (2 if two_arms else 1)
    if not 1 <= rounds <= cliargs.COUNT_LIMIT:
        raise BadInput(f"--rounds must be at least 1 and at most {cliargs.COUNT_LIMIT}")
    only = job_tags(args)
    if args.budget is not None and not args.until_decided:
        raise BadInput("--budget applies to --until-decided only")
    if args.until_decided and not two_arms:
        raise BadInput(
            "--until-decided compares two arms: give a kernel (--debian-kernel, --guest-kernel) or --qemu twice"
        )
    budget = check_budget(UNTIL_DECIDED_BUDGET_MIN if args.budget is None else args.budget)
    return RunConfig(
        output=output_directory(args, "memqual-results"),
        profile=job_profile(args.profile, 2 if two_arms else 1),  # two kernels or two QEMUs
        only=only,
        tests=tests,
        kernels=tuple(kernels),
        parallel=args.parallel,
        rounds=rounds,
        until_decided=bool(args.until_decided),
        budget_min=budget,
    )


def job_profile(asked: str | None, arms: int) -> str:
    """The profile a run uses: the one asked for, else an A/B's sizing for
    two arms (host/profiles.py) and quick for one."""
    return asked or (AB if arms == 2 else QUICK)


def add_job_arguments(parser: argparse.ArgumentParser, output_parent: str) -> None:
    """What the avocado job runs (--profile, --only, the hidden --tests) and
    where the output goes: the options of ``memqual run`` that every
    command running the scenarios through this module takes."""
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="quick (the default with one kernel, ~12 min under TCG here), full (the lab's sizes) or ab (the "
        "default with two kernels: one fresh guest per arm and block, only the tests that record a primary or a "
        "negative control in the blocks, the boot checks once per arm; host/profiles.py)",
    )
    parser.add_argument(
        "--only", action="append", metavar="TAG", help="only tests with this avocado tag (repeatable: any of them)"
    )
    parser.add_argument(
        "--output",
        type=cliargs.output_directory,
        metavar="DIR",
        help=f"output directory (default {output_parent}/<timestamp>)",
    )
    parser.add_argument("--tests", default=str(REPO_ROOT / "e2e"), help=argparse.SUPPRESS)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="the main job: run the scenarios, judge every claim, write results.json and report.html",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    add_job_arguments(parser, "memqual-results")
    parser.add_argument(
        "--guest-kernel",
        action="append",
        metavar="BZIMAGE",
        help="guest kernel instead of Debian's; twice to compare two kernels (A, B)",
    )
    parser.add_argument(
        "--guest-modules", action="append", metavar="DIR", help="modules directory of each --guest-kernel"
    )
    parser.add_argument(
        "--kernel-build",
        action="append",
        type=cliargs.kernel_build,
        metavar="DIR",
        help="the tree each --guest-kernel was built in, in the same order: the balloon driver variant is "
        "built from it (without it the scenarios that need the variant skip)",
    )
    parser.add_argument(
        "--debian-kernel",
        type=cliargs.debian_kernel_arm,
        action="append",
        metavar="VERSION[:CMDLINE]",
        help="a Debian kernel by release or package name instead of --guest-kernel/--guest-modules; "
        "twice to compare two (memqual image kernels lists them); words after a colon are added to that "
        "arm's guest command line (6.1.0-57-amd64 against 6.1.0-57-amd64:init_on_free=1)",
    )
    cliargs.add_qemu(
        parser,
        "; twice to compare two QEMUs (A, B). With kernels: two kernels and one QEMU (or none) compare the "
        "kernels on that QEMU; one kernel (or none) and two QEMUs compare the QEMUs on that kernel; two of "
        "each pair in order (A = first kernel + first QEMU, B = second + second); other counts are refused",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="one arm: run the scenarios N times and pool the samples; two arms (kernels or QEMUs): N blocks, "
        "each test running A and B inside one job, A B then B A ... (tests tagged boot or hosts run once per arm; "
        "default 2 with two arms, else 1)",
    )
    parser.add_argument(
        "--until-decided",
        action="store_true",
        help="two arms: after the --rounds blocks, add blocks only for the tests whose scenarios have an "
        "undecided primary, until every primary is decided or the budget is spent; OUTPUT/until-decided.json",
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="MINUTES",
        help=f"wall time of a run with --until-decided (default {UNTIL_DECIDED_BUDGET_MIN:g})",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="tests avocado runs at once (default 1: benchmarks must not share the CPUs)",
    )
    parser.set_defaults(handler=main)


def resolve_qemus(specs: list[str] | None) -> tuple[QemuChoice, ...]:
    """``--qemu`` once: this process's QEMU, which the scenarios inherit
    through $MEMQUAL_QEMU; twice: both fetched (or checked) before any job,
    each named by its arm's variants."""
    from memqual.host.paths import cache_dir
    from memqual.host.qemu_binary import choose, resolve

    if not specs:
        return ()
    if len(specs) == 1:
        return (choose(specs[0]),)
    return tuple(resolve(spec, cache_dir()) for spec in specs)


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    config = dataclasses.replace(config, qemus=resolve_qemus(getattr(args, "qemu", None)))
    # What the kernel files hold is read here, at the command, rather than
    # in config_from_args: a RunConfig may name any file (the unit tests run
    # fake jobs with stand-in kernels), a user's command line may not.
    check_guest_files(config)
    return run(config)


def check_guest_files(config: RunConfig) -> None:
    """Refuse before the job starts what the image build in every scenario
    would refuse after it: a --guest-kernel without a bzImage's setup
    header (a text file, a vmlinux or another ELF) and a --guest-modules
    that is no modules tree.  The same checks as that build's."""
    from memqual.images.build import check_modules_tree
    from memqual.images.kernel import read_release

    for kernel in config.kernels:
        try:
            release = read_release(kernel.bzimage)
        except BadInput as exc:
            raise BadInput(f"--guest-kernel {exc}") from None
        if kernel.modules is not None:
            try:
                check_modules_tree(kernel.modules, release)
            except BadInput as exc:
                raise BadInput(f"--guest-modules {exc}") from None

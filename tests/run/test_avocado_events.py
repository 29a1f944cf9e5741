"""memqual's Avocado result-events plugin in a real (tiny) Avocado job, and
runjob's display fed from what it wrote: the same lines, test for test, as
Avocado's own console shows for that job."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT
from memqual.host.run import jobevents
from memqual.host.run import progress as run_progress

JOB = "tests/data/events_job.py"
# The events and Avocado's console of one real `memqual run --only boot`
# (13 tests, one of them an ERROR), recorded together.
RECORDED_EVENTS = REPO_ROOT / "tests" / "data" / "events-boot.jsonl"
RECORDED_CONSOLE = REPO_ROOT / "tests" / "data" / "events-boot-console.txt"
AVOCADO = Path(sys.executable).parent / "avocado"

# Avocado's console lines of a finished test, as runjob read them before
# the events: the reference the events are checked against.
# (A skipped test's line has no time.)
CONSOLE_FINISHED = re.compile(r"^\s*\((\d+)/(\d+)\)\s+(\S+):\s+([A-Z]+)(?::\s*(.*?))?(?:\s*\(([\d.]+)\s*s\))?\s*$")


def console_lines(console: str) -> list[str]:
    """The finished tests' lines of Avocado's console, in runjob's form."""
    lines = []
    for line in console.splitlines():
        m = CONSOLE_FINISHED.match(line)
        if m and m.group(4) != "STARTED":
            uid, total, name, status, reason, seconds = m.groups()
            lines.append(
                f"({uid}/{total}) {name}: {status}"
                + (f": {reason}" if reason else "")
                + (f" ({float(seconds):.1f} s)" if seconds else "")
            )
    return lines


SECONDS = re.compile(r" \(([0-9.]+) s\)$")


def without_seconds(line: str) -> str:
    return SECONDS.sub("", line)


def seconds_of(line: str) -> float:
    m = SECONDS.search(line)
    return float(m.group(1)) if m else -1.0


def _avocado_run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [str(AVOCADO), "run", "--job-results-dir", str(tmp_path / "results"), "--disable-sysinfo"]
    return subprocess.run(
        [*command, "--max-parallel-tasks", "1", *extra, JOB],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[jobevents.Event], str]:
    """The tiny job run once: its events and Avocado's console output."""
    tmp_path = tmp_path_factory.mktemp("events")
    events = jobevents.create(tmp_path, "events")
    done = _avocado_run(tmp_path, jobevents.OPTION, str(events))
    assert done.returncode == 0, done.stderr
    return jobevents.EventsReader(events).read(), done.stdout


def _ended(events: list[jobevents.Event]) -> list[jobevents.TestEnded]:
    return [e for e in events if isinstance(e, jobevents.TestEnded)]


def test_a_real_job_writes_one_event_per_step(job: tuple[list[jobevents.Event], str]) -> None:
    events, _ = job
    kinds = [type(e).__name__ for e in events if not isinstance(e, jobevents.TestLog)]
    assert kinds == ["JobStarted", "TestStarted", "TestEnded", "TestStarted", "TestEnded", "JobEnded"], kinds
    started = events[0]
    assert isinstance(started, jobevents.JobStarted) and started.total == 2
    assert Path(started.job_dir).is_dir()
    # The tests' messages at INFO and above, without Avocado's prefix of
    # time and logger, each while its test runs.
    logs = [e.message for e in events[2 : events.index(_ended(events)[0])] if isinstance(e, jobevents.TestLog)]
    assert "repeat 1/2: fine" in logs
    assert not any("debug line" in e.message for e in events if isinstance(e, jobevents.TestLog))
    ended = _ended(events)
    assert [(e.uid, e.name, e.status) for e in ended] == [
        ("1", f"{JOB}:Tiny.test_pass", "PASS"),
        ("2", f"{JOB}:Tiny.test_cancel", "CANCEL"),
    ]
    assert ended[0].reason == "" and ended[1].reason == "nothing to measure here"
    assert all(Path(e.logdir).is_dir() and e.seconds >= 0 for e in ended)
    last = events[-1]
    assert isinstance(last, jobevents.JobEnded)
    assert last.summary == "PASS 1 | ERROR 0 | FAIL 0 | SKIP 0 | WARN 0 | INTERRUPT 0 | CANCEL 1"


def test_the_display_shows_what_avocados_console_shows(job: tuple[list[jobevents.Event], str]) -> None:
    events, console = job
    progress = run_progress.Progress("t", Console(file=io.StringIO()))
    shown = [line for e in events if (line := progress.feed(e))]
    # "[0:01] (1/2) name: PASS (0.0 s)" without the clock
    shown = [line.split("] ", 1)[1] for line in shown]
    expected = console_lines(console)
    # The same lines; the seconds within rounding: the console prints them
    # to 0.01 s and the display to 0.1 s of the unrounded value, so 0.0496 s
    # is "0.05 s" there (0.1 once more rounded) and "0.0 s" here.
    assert len(expected) == 2 and [without_seconds(x) for x in shown] == [without_seconds(x) for x in expected]
    for here, there in zip(shown, expected, strict=True):
        assert abs(seconds_of(here) - seconds_of(there)) <= 0.1 + 1e-9, (here, there)
    results = next(line for line in console.splitlines() if line.startswith("RESULTS"))
    assert progress.summary == results.split(":", 1)[1].strip()
    assert progress.job_dir is not None and progress.job_dir.is_dir()


def test_a_recorded_job_gives_the_lines_its_console_gave() -> None:
    events = jobevents.EventsReader(RECORDED_EVENTS).read()
    progress = run_progress.Progress("t", Console(file=io.StringIO()))
    shown = [line.split("] ", 1)[1] for e in events if (line := progress.feed(e))]
    console = RECORDED_CONSOLE.read_text()
    assert len(shown) == 13 and shown == console_lines(console)
    results = next(line for line in console.splitlines() if line.startswith("RESULTS"))
    assert progress.summary == results.split(":", 1)[1].strip()
    job_log = next(line for line in console.splitlines() if line.startswith("JOB LOG"))
    assert progress.job_dir == Path(job_log.split(":", 1)[1].strip()).parent
    assert progress.counts == {"PASS": 12, "ERROR": 1} and progress.ended


def test_without_the_option_the_plugin_does_nothing() -> None:
    from memqual.host.run.avocado_events import TEST_LOGGER, EventsFile

    plugin = EventsFile({})
    before = list(logging.getLogger(TEST_LOGGER).handlers)
    plugin.pre_tests(None)  # would fail on a job it read
    plugin.start_test(None, {})
    plugin.end_test(None, {})
    plugin.post_tests(None)
    assert plugin.fd is None and logging.getLogger(TEST_LOGGER).handlers == before


def test_a_plain_avocado_run_writes_no_events(tmp_path: Path) -> None:
    """`avocado run` without the option: the job's results only."""
    done = _avocado_run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("*.jsonl"))
    assert "JOB LOG" in done.stdout  # Avocado's own console, untouched


def test_an_event_line_is_typed_or_refused() -> None:
    ended = jobevents.TestEnded("1", "t.py:T.test", 1, "PASS", "", 1.0, "/x")
    assert jobevents.from_line(jobevents.to_line(ended)) == ended
    assert jobevents.from_line(b'{"event": "test_log", "message": 3}') is None
    assert jobevents.from_line(b'{"event": "test_log", "message": "m", "extra": 1}') is None
    assert jobevents.from_line(b'{"event": "test_ended", "uid": "1"}') is None
    line = jobevents.to_line(ended).replace(b'"total": 1', b'"total": true')
    assert jobevents.from_line(line) is None


def test_a_venv_without_the_plugin_is_told_to_run_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    jobevents.check_plugin()  # this venv's
    monkeypatch.setattr(jobevents.metadata, "entry_points", lambda group: [])
    with pytest.raises(BadInput, match="run ./setup"):
        jobevents.check_plugin()

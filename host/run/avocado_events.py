"""Avocado plugins that tell ``memqual run`` what its job does: the option
``avocado run --memqual-events FILE`` and a result-events plugin that
appends one JSON line per event to FILE (the kinds: host/run/jobevents.py).

Without the option they do nothing, so a plain ``avocado run e2e/`` is
untouched.  They run in the job's own Avocado (the controller's, with lab
hosts), where every test's status arrives.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from avocado.core.plugin_interfaces import CLI, ResultEvents
from avocado.core.settings import settings

from memqual.host.run import jobevents

# The tests' logger as the job process sees it: Avocado replays each
# message a test logs under its own logger name.
TEST_LOGGER = "avocado.test"


class EventsOption(CLI):
    """``--memqual-events FILE`` on ``avocado run``."""

    name = jobevents.PLUGIN
    description = "memqual: where the job's events go (one JSON line each)"

    def configure(self, parser: Any) -> None:
        run = parser.subcommands.choices.get("run", None)
        if run is None:
            return
        settings.register_option(
            section=jobevents.SECTION,
            key=jobevents.KEY,
            default=None,
            help_msg="append the job's events to FILE, one JSON line each (for memqual run)",
            parser=run,
            long_arg=jobevents.OPTION,
            metavar="FILE",
        )

    def run(self, config: Any) -> None:
        pass


class _TestLogHandler(logging.Handler):
    """The running tests' messages, INFO and above, as TestLog events."""

    def __init__(self, sink: EventsFile) -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        # Avocado hands over "<task>: <time> <logger> <module> L<n> <LEVEL>| <message>"
        text = record.getMessage()
        message = (text.split("| ", 1)[1] if "| " in text else text).rstrip()
        if message:
            self.sink.write(jobevents.TestLog(message))


class EventsFile(ResultEvents):
    """Writes the job's events to the file ``--memqual-events`` names."""

    name = jobevents.PLUGIN
    description = "memqual: the job's events, one JSON line each"

    def __init__(self, config: dict[str, Any]) -> None:  # Avocado's plugins skip the base __init__
        path = config.get(f"{jobevents.SECTION}.{jobevents.KEY}")
        self.path: str | None = str(path) if path else None
        self.fd: int | None = None
        self.handler: _TestLogHandler | None = None

    def write(self, event: jobevents.Event) -> None:
        if self.path is None:
            return
        if self.fd is None:
            # Appended, never followed through a link: memqual made the
            # file in its own output directory.
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        # One write a line: the reader never sees half of one and the next.
        os.write(self.fd, jobevents.to_line(event))

    def pre_tests(self, job: Any) -> None:
        if self.path is None:
            return
        self.write(jobevents.JobStarted(str(job.unique_id), str(job.logdir), int(job.result.tests_total or 0)))
        self.handler = _TestLogHandler(self)
        logging.getLogger(TEST_LOGGER).addHandler(self.handler)

    def start_test(self, result: Any, state: dict[str, Any]) -> None:
        if self.path is None:
            return
        uid, name = _test_name(state)
        self.write(jobevents.TestStarted(uid, name, int(result.tests_total or 0), str(state.get("task_path", ""))))

    def test_progress(self, progress: bool = False) -> None:
        pass

    def end_test(self, result: Any, state: dict[str, Any]) -> None:
        if self.path is None:
            return
        uid, name = _test_name(state)
        status = str(state.get("status", "ERROR"))
        reason = state.get("fail_reason")
        self.write(
            jobevents.TestEnded(
                uid=uid,
                name=name,
                total=int(result.tests_total or 0),
                status="SKIP" if status == "TEST_NA" else status,
                reason="" if reason in (None, "<unknown>") else str(reason),
                seconds=float(state.get("time_elapsed", -1)),
                logdir=str(state.get("logdir", state.get("task_path", ""))),
            )
        )

    def post_tests(self, job: Any) -> None:
        if self.path is None:
            return
        if self.handler is not None:
            logging.getLogger(TEST_LOGGER).removeHandler(self.handler)
            self.handler = None
        r = job.result
        self.write(
            jobevents.JobEnded(
                status=str(job.status),
                interrupted=str(job.interrupted_reason or ""),
                passed=int(r.passed),
                errors=int(r.errors),
                failed=int(r.failed),
                skipped=int(r.skipped),
                warned=int(r.warned),
                interrupts=int(r.interrupted),
                cancelled=int(r.cancelled),
            )
        )
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _test_name(state: dict[str, Any]) -> tuple[str, str]:
    """Avocado's number of the test and its name with the variant, as its
    console shows them."""
    test_id = state.get("name")
    if test_id is None:
        return "?", "<unknown>"
    return str(test_id.str_uid), str(test_id.name) + str(test_id.str_variant)

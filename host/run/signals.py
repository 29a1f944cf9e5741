"""How a run ends: the job started under memqual.host.run.supervisor in its
own process group, SIGTERM/SIGHUP turned into an exception, signals held
while results are written, and the group ended within a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO

from memqual.host.core.paths import REPO_ROOT

INTERRUPT_GRACE_S = 60.0  # Ctrl-C: avocado interrupts its tests and writes its results
TERMINATE_GRACE_S = 5.0  # SIGTERM/SIGHUP: the job, its guests and all must be gone within 10 s


class Terminated(KeyboardInterrupt):
    """memqual run got SIGTERM or SIGHUP: ends like Ctrl-C, but sooner."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def kill_group(pgid: int, sig: int) -> bool:
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
    if grace_s > 0 and kill_group(proc.pid, signal.SIGINT):
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid, signal.SIGKILL)
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


def start_supervised(
    command: list[str], env: dict[str, str], stdout: IO[str], stderr: IO[str]
) -> tuple[subprocess.Popen[str], int]:
    """Start ``command`` (avocado) under memqual.host.run.supervisor, in a new
    session whose group it leads: avocado, its test runners and their
    QEMUs are ended together by end_job(), whatever ends memqual, and by
    the supervisor when memqual dies without ending them (a SIGKILL): it
    holds the read end of a pipe whose write end, returned here, only this
    process holds (os.pipe's ends are not inherited)."""
    life_read, life_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memqual.host.cli.supervisor", "--grace", str(TERMINATE_GRACE_S), "--", *command],
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

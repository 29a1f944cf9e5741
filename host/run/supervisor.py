"""The process that ties an Avocado job to the life of the memqual that
started it.

Why it is built so: docs/architecture.md, "Module notes", host/run/supervisor.py.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import sys

from memqual.host.core import knobs, scenario
from memqual.host.core.errors import MemqualError
from memqual.host.core.polling import poll
from memqual.host.core.process import set_child_subreaper

GRACE_S = 5.0  # SIGINT, then SIGKILL: the same as memqual run's end after SIGTERM
KILL_DEADLINE_S = 5.0  # for every killed descendant to be reaped
REAP_PERIOD_S = 1.0  # orphans reparented here are reaped this often while the job runs
LIFE_FD = 0  # the pipe from memqual


class EndJob(Exception):
    """SIGTERM or SIGHUP to the supervisor: end the job as if memqual died."""


def parent_map() -> dict[int, int]:
    """Every live (not yet ended) process's parent, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] not in (b"Z", b"X"):
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(root: int) -> list[int]:
    """The live descendants of ``root``, nearest first."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_map().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        frontier = [child for pid in frontier for child in children.get(pid, [])]
        found += frontier
    return found


class Job:
    """avocado, started here, and every child this process has to reap:
    avocado itself and the orphans reparented to its subreaper."""

    def __init__(self, argv: list[str]) -> None:
        # posix_spawn: nothing of Python runs in the child.  stdin is
        # /dev/null (fd 0 here is memqual's pipe, which the job must not
        # hold); a signal handled here is reset to its default by the exec.
        self.pid = os.posix_spawnp(
            argv[0], argv, os.environ, file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        )
        self.status: int | None = None  # as subprocess gives it: -N for a signal

    def reap(self) -> None:
        """Reap every child that ended; avocado's status is kept."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = os.waitstatus_to_exitcode(status)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for avocado to end; True when it has."""

        def ended() -> bool:
            self.reap()
            return self.status is not None

        # a bounded poll: reaping orphans as well as avocado
        return poll(ended, timeout_s, 0.02, what="the avocado job's end", raise_on_timeout=False).met

    def kill_all(self) -> None:
        """SIGKILL every descendant until none is left (a killed one's
        children are reparented here, and killed in the next pass)."""

        def none_left() -> bool:
            left = descendants(os.getpid())
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.reap()
            return not left

        # 20 ms: the kernel takes a moment to end a killed process
        poll(none_left, KILL_DEADLINE_S, 0.02, what="no process of the job left", raise_on_timeout=False)

    def end(self, grace_s: float) -> None:
        """SIGINT to the group, ``grace_s`` for avocado to end, then SIGKILL
        to whatever is left, and every child reaped."""
        if grace_s > 0 and self.status is None:
            try:
                os.killpg(os.getpgid(0), signal.SIGINT)  # this process ignores it
            except ProcessLookupError:
                pass
            self.wait(grace_s)
        self.kill_all()
        self.wait(KILL_DEADLINE_S)


def restore_host_knobs() -> None:
    """Put back the knobs a killed test left changed (a no-op without a
    stale state file)."""
    try:
        restored = knobs.restore_every_stale(scenario.knob_sets())
    except (MemqualError, OSError) as exc:
        print(f"memqual supervisor: could not restore host knobs: {exc}", file=sys.stderr, flush=True)
        return
    for each in restored:
        print(f"memqual supervisor: {each.describe()}", file=sys.stderr, flush=True)


def exit_like(status: int) -> None:
    """Exit with avocado's status: the same code, or the same signal."""
    if status >= 0:
        sys.exit(status)
    sig = -status
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a SIGQUIT or SIGSEGV repeated, not a core file
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal that does not end a process by default


def supervise(argv: list[str], grace_s: float) -> int:
    """Run ``argv`` (avocado) and end it with memqual; avocado's status."""
    if os.getpgid(0) != os.getpid():
        os.setsid()  # lead a group of our own: the SIGINT below is for the job alone
    set_child_subreaper()

    def end(signum: int, frame: object) -> None:
        raise EndJob(signal.Signals(signum).name)

    # Handlers, not SIG_IGN: exec resets a handled signal to its default,
    # so avocado gets SIGINT as usual; an ignored one would stay ignored.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGHUP, end)
    job = Job(argv)
    # avocado holds memqual's output pipe; the supervisor writes none of it,
    # so memqual's end of file on it comes when the job's writers are gone.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    pidfd = os.pidfd_open(job.pid)
    poller = select.poll()
    poller.register(LIFE_FD, select.POLLIN | select.POLLHUP)
    poller.register(pidfd, select.POLLIN)
    grace = 0.0
    try:
        while job.status is None:
            events = dict(poller.poll(REAP_PERIOD_S * 1000))
            if LIFE_FD in events and not os.read(LIFE_FD, 4096):
                print("memqual supervisor: memqual is gone: ending its avocado job", file=sys.stderr, flush=True)
                grace = grace_s
                break
            job.reap()
    except EndJob as exc:
        print(f"memqual supervisor: {exc}: ending the avocado job", file=sys.stderr, flush=True)
        grace = grace_s
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the end below is not broken off
        signal.signal(sig, lambda signum, frame: None)
    job.end(grace)
    restore_host_knobs()
    return job.status if job.status is not None else -signal.SIGKILL

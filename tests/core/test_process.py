"""host/core/process.py: a child started with ``preexec_fn=die_with_parent``
dies with its parent, also when the parent died before the prctl took
effect, and the preexec_fn loads nothing after the fork."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from fake_qemu import alive

from memqual.host.core.paths import REPO_ROOT

# The parent starts `sleep` from a thread whose preexec_fn waits, in the
# child, until the parent has died (os._exit in the main thread), and only
# then calls die_with_parent: the race of a parent that dies between fork
# and prctl, made certain.
PARENT_DIES_FIRST = textwrap.dedent(
    """\
    import os, subprocess, sys, threading, time
    from memqual.host.core.process import die_with_parent
    parent = os.getpid()
    pidfile = sys.argv[1]

    def late():
        fd = os.open(pidfile + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.rename(pidfile + ".tmp", pidfile)
        deadline = time.monotonic() + 10
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.01)  # until the parent is gone
        die_with_parent()

    threading.Thread(target=subprocess.Popen, args=(["sleep", "60"],), kwargs={"preexec_fn": late}).start()
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    os._exit(0)
    """
)
# ctypes.CDLL made to fail: a preexec_fn that loads a library after the
# fork (a dlopen, which takes the loader's lock another thread may hold)
# fails the Popen.
NO_DLOPEN_AFTER_FORK = textwrap.dedent(
    """\
    import ctypes, os, subprocess
    from memqual.host.core.process import die_with_parent

    def refuse(*args, **kwargs):
        raise AssertionError("dlopen after fork")

    ctypes.CDLL = refuse
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent)
    print(proc.pid, flush=True)
    os._exit(0)
    """
)


def wait_dead(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)  # polling /proc with a deadline
    return True


def test_a_child_whose_parent_died_before_the_prctl_ends_at_once(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    errors = tmp_path / "stderr"
    with errors.open("wb") as stderr:  # a file: an orphan that ran on would hold a pipe open
        parent = subprocess.run(
            [sys.executable, "-c", PARENT_DIES_FIRST, str(pidfile)],
            cwd=REPO_ROOT,
            timeout=30,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    assert parent.returncode == 0, errors.read_text()
    pid = int(pidfile.read_text())
    try:
        assert wait_dead(pid, 5), "the child of a dead parent ran on (exec'd sleep)"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_preexec_fn_loads_nothing_after_fork_and_the_child_dies_with_its_parent() -> None:
    parent = subprocess.run(
        [sys.executable, "-c", NO_DLOPEN_AFTER_FORK], cwd=REPO_ROOT, timeout=30, capture_output=True, text=True
    )
    assert parent.returncode == 0, parent.stderr[-800:]
    pid = int(parent.stdout)
    try:
        assert wait_dead(pid, 5), "the child outlived its parent"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)

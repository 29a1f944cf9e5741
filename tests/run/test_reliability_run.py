"""``memqual run`` ends its avocado job on every exit path: SIGTERM and
SIGHUP end the job's whole process group (avocado, its runners, their
QEMUs) within 10 s, even an avocado that ignores SIGINT; and the loop that
follows the job's events cannot wait forever."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_qemu import alive

from memqual.host.core.paths import REPO_ROOT
from memqual.host.run import avocado as run_avocado_job
from memqual.host.run import config as run_config
from memqual.host.run import signals as run_signals

# A stand-in avocado that starts a "guest" (a child that would outlive it)
# and ignores SIGINT, the worst case for the clean-up.
STUBBORN_AVOCADO = textwrap.dedent(
    """\
    #!{python}
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "600"])
    with open(os.environ["FAKE_PIDS"], "w") as fh:
        fh.write(f"{{os.getpid()}} {{child.pid}}\\n")
    print("JOB ID     : 0000", flush=True)
    print(" (1/1) e2e/test_x.py:X.test_x: STARTED", flush=True)
    while True:
        time.sleep(1)
    """
)


def memqual_run_argv(tmp_path: Path) -> list[str]:
    """`memqual run` of the fake tests in tmp_path, its output beside them."""
    return [
        sys.executable,
        "-m",
        "memqual.host.cli.main",
        "run",
        "--output",
        str(tmp_path / "out"),
        "--tests",
        str(tmp_path),
    ]


def _start_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    script = tmp_path / "avocado"
    script.write_text(STUBBORN_AVOCADO.format(python=sys.executable))
    script.chmod(0o755)
    pids = tmp_path / "pids"
    env = {
        **os.environ,
        "MEMQUAL_AVOCADO": str(script),
        "FAKE_PIDS": str(pids),
        "MEMQUAL_STATE_DIR": str(tmp_path / "state"),
    }
    proc = subprocess.Popen(
        memqual_run_argv(tmp_path),
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().endswith("\n")):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the fake avocado did not start"
        time.sleep(0.05)  # polling a file the fake writes
    avocado_pid, child_pid = map(int, pids.read_text().split())
    return proc, avocado_pid, child_pid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_avocado_job_and_its_children_within_10_s(tmp_path: Path, sig: int) -> None:
    proc, avocado_pid, child_pid = _start_run(tmp_path)
    try:
        started = time.monotonic()
        proc.send_signal(sig)
        status = proc.wait(timeout=10)
        while (alive(avocado_pid) or alive(child_pid)) and time.monotonic() - started < 10:
            time.sleep(0.05)  # polling /proc with a deadline
        assert not alive(avocado_pid), "avocado outlived memqual run"
        assert not alive(child_pid), "the job's child (a guest) outlived memqual run"
        assert time.monotonic() - started < 10
        assert status == 128 + sig
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert "Traceback" not in err and f"interrupted ({signal.Signals(sig).name})" in err
    finally:
        for pid in (avocado_pid, child_pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_job_runs_in_its_own_process_group(tmp_path: Path) -> None:
    """The group is led by the job's supervisor, avocado's parent, which
    memqual started: memqual's end_job still ends the whole job."""
    proc, avocado_pid, child_pid = _start_run(tmp_path)
    supervisor = parent(avocado_pid)
    try:
        assert parent(supervisor) == proc.pid
        assert os.getpgid(avocado_pid) == supervisor != os.getpgid(proc.pid)
        assert os.getpgid(child_pid) == supervisor
    finally:
        # Not SIGTERM: memqual would give this avocado, which ignores
        # SIGINT, its whole grace (the test above times that path).
        os.killpg(supervisor, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=10)


# A stand-in avocado whose job holds what a real one holds: a test runner
# (FAKE_RUNNER) with the measurement lock (a flock) and a KSM state file
# under the KSM lock, a "guest" that ignores SIGINT, and a process in a
# session of its own (as aexpect runs a lab host's SSH session).  It ends
# on SIGINT, as avocado does, and leaves its children behind.
HOLDING_AVOCADO = textwrap.dedent(
    """\
    #!{python}
    import os, subprocess, sys, time
    runner = subprocess.Popen([sys.executable, os.environ["FAKE_RUNNER"]], stdout=subprocess.PIPE, text=True)
    assert runner.stdout.readline() == "ready\\n"
    guest = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
    session = subprocess.Popen(["sleep", "600"], start_new_session=True)
    with open(os.environ["FAKE_PIDS"], "w") as fh:
        fh.write(f"{{os.getpid()}} {{runner.pid}} {{guest.pid}} {{session.pid}}\\n")
    print("JOB ID     : 0000", flush=True)
    print(" (1/1) e2e/test_x.py:X.test_x: STARTED", flush=True)
    while True:
        time.sleep(1)
    """
)
FAKE_RUNNER = textwrap.dedent(
    """\
    import fcntl, os, signal, time
    from memqual.host.ksm.state import HostState, ksm_snapshot
    from memqual.host.core.environment import KSM_ROOT, THP_ROOT
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a test stuck in its tearDown
    fd = os.open(os.environ["FAKE_MEASURE_LOCK"], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    state = HostState()
    assert state.try_lock()
    # What a KSM test saves before its first change; no knob in it, so the
    # restore writes none of the host's.
    state.save(ksm_snapshot(os.getpid(), None, "now", str(KSM_ROOT), {}, str(THP_ROOT)))
    print("ready", flush=True)
    time.sleep(600)
    """
)


def _no_core() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGQUIT: no core file in the checkout
    # A shell starting a job in the background without job control ignores
    # SIGQUIT in it, and an ignored signal stays ignored across exec: under
    # `./run-tests &` memqual would never see the SIGQUIT this test sends.
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGQUIT])
def test_memqual_killed_alone_takes_its_job_along(tmp_path: Path, sig: int) -> None:
    """SIGKILL (or SIGQUIT: no handler) of memqual run's own pid, not its
    group: within 10 s nothing of its job runs, the measurement lock is
    free, and the KSM state the killed test left is restored (gone)."""
    import fcntl

    script = tmp_path / "avocado"
    script.write_text(HOLDING_AVOCADO.format(python=sys.executable))
    script.chmod(0o755)
    (tmp_path / "runner.py").write_text(FAKE_RUNNER)
    pids_file, lock, state_dir = tmp_path / "pids", tmp_path / "measure.lock", tmp_path / "state"
    env = {
        **os.environ,
        "MEMQUAL_AVOCADO": str(script),
        "FAKE_RUNNER": str(tmp_path / "runner.py"),
        "FAKE_PIDS": str(pids_file),
        "FAKE_MEASURE_LOCK": str(lock),
        "MEMQUAL_STATE_DIR": str(state_dir),
    }
    proc = subprocess.Popen(
        memqual_run_argv(tmp_path),
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_no_core,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not (pids_file.exists() and pids_file.read_text().endswith("\n")):
            assert proc.poll() is None, "memqual run ended before its job was up"
            assert time.monotonic() < deadline, "the fake avocado did not start"
            time.sleep(0.05)  # polling a file the fake writes
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(alive(p) for p in pids)
        assert (state_dir / "ksm-state.json").exists()
        started = time.monotonic()
        proc.send_signal(sig)  # memqual alone: its job's group gets nothing
        assert proc.wait(timeout=10) == -sig
        while any(alive(p) for p in pids) and time.monotonic() - started < 10:
            time.sleep(0.05)  # polling /proc with a deadline
        left = [p for p in pids if alive(p)]
        assert not left, f"still running {time.monotonic() - started:.1f} s after memqual's {sig!r}: {left}"
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a holder lives
        finally:
            os.close(fd)
        while (state_dir / "ksm-state.json").exists() and time.monotonic() - started < 10:
            time.sleep(0.05)  # the supervisor restores once the last holder is gone
        assert not (state_dir / "ksm-state.json").exists(), "nothing restored the killed test's KSM state"
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_supervisor_passes_on_avocados_status() -> None:
    """memqual reads avocado's exit status through the supervisor: the same
    code, or the same signal."""
    supervise = [sys.executable, "-m", "memqual.host.cli.supervisor", "--"]

    def status(code: str) -> int:
        # stdin a pipe kept open, as memqual keeps it: its end of file would
        # end the job
        with subprocess.Popen([*supervise, sys.executable, "-c", code], cwd=REPO_ROOT, stdin=subprocess.PIPE) as proc:
            return proc.wait(timeout=30)

    assert status("raise SystemExit(3)") == 3
    assert status("import os, signal; os.kill(os.getpid(), signal.SIGTERM)") == -signal.SIGTERM


def test_end_job_kills_a_group_that_ignores_sigint() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)",
        ],
        start_new_session=True,
        text=True,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    started = time.monotonic()
    assert run_signals.end_job(proc, grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 5


# A stand-in avocado that writes the job's last event and runs on.
HANGING_AVOCADO = textwrap.dedent(
    r"""
    import json, sys, time
    events = sys.argv[sys.argv.index("--memqual-events") + 1]
    counts = dict.fromkeys(["passed", "errors", "failed", "skipped", "warned", "interrupts", "cancelled"], 0)
    with open(events, "a") as fh:
        fh.write(json.dumps(dict(event="job_ended", status="PASS", interrupted="", **counts)) + "\n")
    time.sleep(600)
    """
)
# A stand-in avocado whose output and events hold junk: bytes that are not
# UTF-8, lines that are not JSON or no event, a last line without its end.
JUNK_AVOCADO = textwrap.dedent(
    r"""
    import json, sys
    sys.stdout.buffer.write(b"\xff\xfe junk\n")
    events = sys.argv[sys.argv.index("--memqual-events") + 1]
    started = dict(event="test_started", uid="1", name="t.py:T.test", total=1, logdir="")
    ended = dict(started, event="test_ended", status="PASS", reason="", seconds=1.5)
    lines = [b"\xff\xfe", b"{not json", b"[1]", b'{"event": "nope"}', json.dumps(started).encode()]
    lines += [json.dumps(dict(started, total=True)).encode(), json.dumps(ended).encode()]
    with open(events, "ab") as fh:
        fh.write(b"\n".join(lines) + b'\n{"event": "te')
    """
)


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "avocado"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    return script


def test_an_avocado_that_hangs_after_its_job_ended_is_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """avocado wrote the job's last event but runs on: the loop still ends,
    and the job with it."""
    from rich.console import Console

    monkeypatch.setenv("MEMQUAL_AVOCADO", str(_script(tmp_path, HANGING_AVOCADO)))
    monkeypatch.setattr(run_avocado_job, "EXIT_AFTER_END_S", 1.0)
    config = run_config.RunConfig(
        output=tmp_path / "out", profile="quick", only=(), tests=tmp_path, kernels=(), parallel=1, rounds=1
    )
    started = time.monotonic()
    job = run_avocado_job.run_avocado(config, tmp_path / "out", None, Console(file=open(os.devnull, "w")))
    assert time.monotonic() - started < 15
    assert job.exit_status == -signal.SIGKILL
    assert job.summary.startswith("PASS 0 |")


def test_junk_in_the_events_or_on_stdout_does_not_end_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    monkeypatch.setenv("MEMQUAL_AVOCADO", str(_script(tmp_path, JUNK_AVOCADO)))
    config = run_config.RunConfig(output=tmp_path / "out", tests=tmp_path)
    buf = io.StringIO()
    job = run_avocado_job.run_avocado(config, tmp_path / "out", None, Console(file=buf, width=200))
    assert job.exit_status == 0
    # The one good pair of events, and only it.
    assert buf.getvalue().count("(1/1) t.py:T.test: PASS (1.5 s)") == 1
    assert buf.getvalue().count("\n") == 1

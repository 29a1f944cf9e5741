"""Nothing leaks: a guest test Avocado stops (timeout, Ctrl-C) leaves no
QEMU; SIGTERM, or SIGKILL of its pid alone, ends ``memqual run``'s job and
guests within 10 s with the KSM knobs put back; knobs of an Avocado job
killed whole are put back at memqual's next start.

Each test writes a small Avocado test outside e2e/ that boots a real guest
(or changes KSM knobs) and hangs; a nested ``avocado run`` of it is
stopped, and what it held must be gone or restored."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.polling import poll

HANGING_TEST = textwrap.dedent(
    '''\
    import os
    import time

    from memqual.e2e.base import GuestTest, measures_nothing
    from memqual.host.core.qemu import MachineConfig


    class Hang(GuestTest):
        """
        :avocado: enable
        """

        timeout = {timeout}

        @measures_nothing  # it only hangs: a shared hold, beside the test that stops it
        def test_hang(self):
            vm = self.boot(MachineConfig(memory_mib=512, cpus=1))
            with open(os.environ["MEMQUAL_LEAK_PIDFILE"], "w") as fh:
                fh.write(str(vm.pid))
            while True:  # hang until Avocado's timeout or Ctrl-C stops the test
                time.sleep(1)
    '''
)
HOLDING_KSM = textwrap.dedent(
    '''\
    import os
    import time

    import avocado

    from memqual.host.ksm.controller import KsmController


    class HoldKsm(avocado.Test):
        """
        :avocado: enable
        """

        def test_hold(self):
            ksm = KsmController()
            ksm.open()
            ksm.set(pages_to_scan={pages_to_scan}, sleep_millisecs={sleep_ms})
            with open(os.environ["MEMQUAL_LEAK_PIDFILE"], "w") as fh:
                fh.write(str(os.getpid()))
            while True:  # hang until SIGKILL
                time.sleep(1)
    '''
)
GUEST_HOLDING_KSM = textwrap.dedent(
    '''\
    import os
    import time

    from memqual.e2e.base import GuestTest, measures_nothing
    from memqual.host.ksm.controller import KsmController
    from memqual.host.core.qemu import MachineConfig


    class GuestKsm(GuestTest):
        """
        :avocado: enable
        """

        timeout = 900

        @measures_nothing  # it only hangs: a shared hold, beside the test that kills it
        def test_hold(self):
            vm = self.boot(MachineConfig(memory_mib=512, cpus=1))
            ksm = KsmController()
            ksm.open()
            ksm.set(pages_to_scan={pages_to_scan}, sleep_millisecs={sleep_ms})
            with open(os.environ["MEMQUAL_LEAK_PIDFILE"], "w") as fh:
                fh.write(str(vm.pid))
            while True:  # hang until the job is ended
                time.sleep(1)
    '''
)
# Values no host uses by default, so a knob left at them is ours.
STALE_PAGES_TO_SCAN = 4321
STALE_SLEEP_MS = 7
# The nested test's own timeouts, one per attempt.  Avocado's timeout
# covers the test's set-up and its guest's boot (warm 0.5 s, cold 2-3 s,
# more beside another guest), so a short one can come before the guest is
# up: that attempt ends with nothing left running (checked), and the next
# one has twice the time.  The first is short because the test waits all
# of it out.
HANG_TIMEOUTS_S = (6, 12, 24)
EXIT_DEADLINE_S = 120.0  # for the nested avocado to finish after it was stopped
GONE_DEADLINE_S = 10.0  # for the QEMU to be reaped after avocado returned
TERM_DEADLINE_S = 10.0  # SIGTERM to memqual run: the job and its guests gone within this
KILL_DEADLINE_S = 10.0  # SIGKILL of memqual run alone: its job, guests and changed knobs gone within this


def process_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, IndexError, ProcessLookupError):
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry))
    return found


def children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(p) for p in fh.read().split()]
    except FileNotFoundError:
        pass
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # gone: no file, or ESRCH reading a process that just exited
        return False


def processes_with(variable: str, value: str) -> list[int]:
    """Live processes whose environment sets ``variable`` to ``value``:
    every process a nested run started, whatever its parent, group or
    session became."""
    wanted = f"{variable}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
            except OSError:
                continue
            if wanted in environ and alive(int(entry)):
                found.append(int(entry))
    return found


def command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return " ".join(os.path.basename(a) for a in fh.read().decode(errors="replace").split("\0")[:3])
    except OSError:
        return "?"


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Cleanup(GuestTest):
    """
    :avocado: enable
    :avocado: tags=boot
    """

    def _start_nested(
        self,
        timeout_s: int,
        source: str | None = None,
        extra_env: dict[str, str] | None = None,
        results_name: str = "nested",
    ) -> tuple[subprocess.Popen[bytes], Path, Path]:
        work = Path(self.workdir)
        test_file = work / "hang_guest.py"
        test_file.write_text(source or HANGING_TEST.format(timeout=timeout_s))
        pidfile = work / "qemu.pid"
        results = work / results_name
        env = dict(os.environ, MEMQUAL_LEAK_PIDFILE=str(pidfile), **(extra_env or {}))
        avocado = Path(sys.executable).parent / "avocado"
        proc = subprocess.Popen(
            [str(avocado), "run", "--disable-sysinfo", "--job-results-dir", str(results), str(test_file)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: Ctrl-C goes to it alone
            # A job started in the background by a non-interactive shell
            # (nohup, CI scripts) inherits SIGINT ignored, and the nested
            # avocado would ignore the Ctrl-C this test sends: give it the
            # terminal's default back.
            preexec_fn=default_sigint,
        )
        return proc, pidfile, results

    def _start_memqual_run(
        self, name: str, source: str, extra_env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """A nested ``memqual run`` of one test file (``source``, written to
        the work directory as ``name``): the process and the file its guest's
        QEMU pid will be in.  Its own session, so that a test can signal it
        alone and a ``finally`` can end whatever it leaked by its group."""
        work = Path(self.workdir)
        test_file = work / name
        test_file.write_text(source)
        pidfile = work / "qemu.pid"
        memqual = Path(sys.executable).parent / "memqual"
        proc = subprocess.Popen(
            [str(memqual), "run", "--tests", str(test_file), "--output", str(work / "out")],
            cwd=REPO_ROOT,
            env=dict(os.environ, MEMQUAL_LEAK_PIDFILE=str(pidfile), **(extra_env or {})),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return proc, pidfile

    def _wait_pidfile(self, proc: subprocess.Popen[bytes], pidfile: Path) -> int:
        pid = self._wait_pidfile_or_end(proc, pidfile)
        if pid is None:
            raise self.failureException(f"the nested avocado ended (status {proc.returncode}) before its guest was up")
        return pid

    def _wait_pidfile_or_end(self, proc: subprocess.Popen[bytes], pidfile: Path) -> int | None:
        """The pid the nested test wrote, or None if the nested avocado
        ended before it wrote one."""

        def written() -> bool:
            return bool(pidfile.exists() and pidfile.read_text().strip()) or proc.poll() is not None

        # 50 ms: polling for a file the nested test writes
        if not poll(written, EXIT_DEADLINE_S, 0.05, what="the nested test's pid file", raise_on_timeout=False).met:
            os.killpg(proc.pid, signal.SIGKILL)
            self.fail("the nested test's guest did not come up")
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        return int(text) if text else None

    def _assert_gone(self, qemu_pid: int) -> None:
        # 50 ms: polling /proc with a deadline
        if not poll(lambda: not alive(qemu_pid), GONE_DEADLINE_S, 0.05, what="QEMU's end", raise_on_timeout=False).met:
            os.kill(qemu_pid, signal.SIGKILL)  # do not leak it ourselves
            self.fail(f"QEMU {qemu_pid} outlived its stopped test by {GONE_DEADLINE_S:.0f} s")

    def _status(self, results: Path) -> str:
        (job,) = [p for p in results.glob("job-*") if p.is_dir() and not p.is_symlink()]
        tests = json.loads((job / "results.json").read_text())["tests"]
        return tests[0]["status"] if tests else "no test"

    # Only the KSM test reads host-wide state; the others stop nested guests
    # and measure nothing (their nested tests hold the lock shared too).
    @measures_nothing
    def test_timeout_kills_the_guest(self) -> None:
        proc, qemu_pid, results, timeout_s = self._nested_guest_up_under_a_timeout()
        self.assertTrue(alive(qemu_pid), "the nested test's QEMU is not running")
        proc.wait(timeout=EXIT_DEADLINE_S + timeout_s)
        self._assert_gone(qemu_pid)
        self.assertEqual(self._status(results), "INTERRUPTED", "the nested test should end by its timeout")

    def _nested_guest_up_under_a_timeout(self) -> tuple[subprocess.Popen[bytes], int, Path, int]:
        """A nested hanging test whose guest came up before its timeout:
        the nested avocado, the guest's QEMU pid, the nested results
        directory and the timeout."""
        for attempt, timeout_s in enumerate(HANG_TIMEOUTS_S):
            proc, pidfile, results = self._start_nested(timeout_s, results_name=f"nested-{attempt}")
            qemu_pid = self._wait_pidfile_or_end(proc, pidfile)
            if qemu_pid is not None:
                return proc, qemu_pid, results, timeout_s
            # The timeout came before the guest was up: it ended the test
            # all the same, and nothing the test started may be left.
            self.assertEqual(self._status(results), "INTERRUPTED", f"the nested avocado ended ({proc.returncode})")
            self._assert_none_left(pidfile)
            self.log.info("the nested test's %d s timeout came before its guest was up: once more", timeout_s)
        raise self.failureException(
            f"the nested test's guest was not up within {HANG_TIMEOUTS_S[-1]} s, its longest timeout"
        )

    def _assert_none_left(self, pidfile: Path) -> None:
        """No process of a nested run (found by the pid file its
        environment names) is left within GONE_DEADLINE_S."""
        # 50 ms: polling /proc with a deadline
        polled = poll(
            lambda: processes_with("MEMQUAL_LEAK_PIDFILE", str(pidfile)),
            GONE_DEADLINE_S,
            0.05,
            what="no process of the nested run",
            until=lambda left: not left,
            raise_on_timeout=False,
        )
        if not polled.met:
            names = {pid: command_name(pid) for pid in polled.value}
            for pid in polled.value:
                os.kill(pid, signal.SIGKILL)  # do not leak them ourselves
            self.fail(f"left running by a nested test its timeout ended: {names}")

    @measures_nothing
    def test_ctrl_c_kills_the_guest(self) -> None:
        proc, pidfile, results = self._start_nested(900)
        qemu_pid = self._wait_pidfile(proc, pidfile)
        self.assertTrue(alive(qemu_pid), "the nested test's QEMU is not running")
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's ^C sends to the foreground group
        try:
            proc.wait(timeout=EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            self.fail(f"the nested avocado did not stop within {EXIT_DEADLINE_S:.0f} s of Ctrl-C")
        self._assert_gone(qemu_pid)

    @measures_nothing
    def test_sigterm_to_memqual_run_ends_its_job_and_guests(self) -> None:
        """memqual run (a one-test selection: a guest that hangs) gets
        SIGTERM once its guest is up: memqual, its avocado job (the whole
        process group) and the QEMU are gone within 10 s."""
        proc, pidfile = self._start_memqual_run("hang_guest.py", HANGING_TEST.format(timeout=900))
        try:
            qemu_pid = self._wait_pidfile(proc, pidfile)
            # the job's supervisor, which leads the job's process group
            (job_leader,) = children(proc.pid)
            job = process_group(job_leader)
            self.assertIn(qemu_pid, job, "the guest should be in the avocado job's process group")
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                status = proc.wait(timeout=TERM_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.fail(f"memqual run did not end within {TERM_DEADLINE_S:.0f} s of SIGTERM")
            # 50 ms: polling /proc with a deadline (the one from SIGTERM on)
            poll(
                lambda: not process_group(job_leader),
                max(0.0, TERM_DEADLINE_S - (time.monotonic() - started)),
                0.05,
                what="the job's end",
                raise_on_timeout=False,
            )
            left = process_group(job_leader)
            self.assertEqual(left, [], f"still running {time.monotonic() - started:.1f} s after SIGTERM")
            self.assertFalse(alive(qemu_pid), "the guest outlived memqual run")
            self.assertEqual(status, 128 + signal.SIGTERM)
            self.log.info("memqual run, avocado and QEMU gone %.2f s after SIGTERM", time.monotonic() - started)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for pid in process_group(proc.pid):
                os.kill(pid, signal.SIGKILL)

    @measures_nothing
    def test_sigkill_of_memqual_run_alone_ends_its_job_guests_and_knobs(self) -> None:
        """memqual run (one test: a guest up and the host's KSM knobs
        changed, then a hang) gets SIGKILL, its own pid alone: no handler,
        no finally of memqual runs, and its job's group gets nothing.
        Within 10 s no process of that run is left (avocado, the test's
        runner, the QEMU) and the knobs are as they were before the change.

        It measures nothing: its nested test changes knobs with ksmd's run
        left as it was, and this test only reads them back."""
        from memqual.host.core.environment import KSM_ROOT
        from memqual.host.core.errors import CapabilityMissing
        from memqual.host.core.knobs import Sysfs
        from memqual.host.ksm.controller import check_capability
        from memqual.host.ksm.state import HostState, restore_stale

        try:
            check_capability(KSM_ROOT)
        except CapabilityMissing as exc:
            self.skip_because(str(exc))
        fs = Sysfs(KSM_ROOT)
        self.require(
            fs.knobs().get("pages_to_scan") != str(STALE_PAGES_TO_SCAN),
            f"host KSM pages_to_scan is already {STALE_PAGES_TO_SCAN}: the check could not tell",
        )
        # The killed run's state in a folder of its own: a test starting
        # beside this one restores what a dead run left in the shared
        # folder (and says so), and would take the restore away from the
        # run checked here.  This test holds the measurement lock shared,
        # so no test that uses host KSM runs meanwhile.
        state_dir = Path(tempfile.mkdtemp(prefix="mq-state-"))
        proc, pidfile = self._start_memqual_run(
            "guest_ksm.py",
            GUEST_HOLDING_KSM.format(pages_to_scan=STALE_PAGES_TO_SCAN, sleep_ms=STALE_SLEEP_MS),
            {"MEMQUAL_STATE_DIR": str(state_dir)},
        )
        try:
            qemu_pid = self._wait_pidfile(proc, pidfile)
            self.assertEqual(fs.knobs()["pages_to_scan"], str(STALE_PAGES_TO_SCAN), "the nested test changed no knob")
            saved = HostState(state_dir).load()
            self.assertIsNotNone(saved, "the nested test left no state file")
            assert saved is not None
            run = processes_with("MEMQUAL_LEAK_PIDFILE", str(pidfile))
            names = {pid: command_name(pid) for pid in run}
            self.assertIn(qemu_pid, run, names)
            self.assertTrue(any("avocado" in n for n in names.values()), f"no avocado among {names}")
            started = time.monotonic()
            proc.kill()  # SIGKILL to memqual's pid alone
            proc.wait(timeout=KILL_DEADLINE_S)

            def restored() -> bool:
                now = fs.knobs()
                return all(now.get(k) == v for k, v in (saved.values["ksm"] or {}).items())

            # 50 ms: polling /proc and sysfs with a deadline (the one from SIGKILL on)
            poll(
                lambda: not processes_with("MEMQUAL_LEAK_PIDFILE", str(pidfile)) and restored(),
                max(0.0, KILL_DEADLINE_S - (time.monotonic() - started)),
                0.05,
                what="the run's end and the knobs restored",
                raise_on_timeout=False,
            )
            elapsed = time.monotonic() - started
            left = {pid: command_name(pid) for pid in processes_with("MEMQUAL_LEAK_PIDFILE", str(pidfile))}
            self.assertEqual(left, {}, f"still running {elapsed:.1f} s after SIGKILL of memqual run")
            self.assertFalse(alive(qemu_pid), "the guest outlived memqual run")
            now = fs.knobs()
            self.assertEqual(
                {k: now.get(k) for k in (saved.values["ksm"] or {})},
                (saved.values["ksm"] or {}),
                f"host KSM knobs still changed {elapsed:.1f} s after SIGKILL of memqual run",
            )
            self.log.info("memqual run killed: its job, guest and KSM knobs gone or restored after %.2f s", elapsed)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pid in processes_with("MEMQUAL_LEAK_PIDFILE", str(pidfile)):
                os.kill(pid, signal.SIGKILL)
            restore_stale(state_dir)  # whatever happened above, leave the host as it was
            shutil.rmtree(state_dir, ignore_errors=True)

    def test_sigkill_mid_ksm_then_memqual_restores_the_knobs(self) -> None:
        """
        :avocado: tags=ksm
        """
        from memqual.host.core.environment import KSM_ROOT
        from memqual.host.core.errors import CapabilityMissing
        from memqual.host.core.knobs import Sysfs
        from memqual.host.ksm.controller import check_capability

        try:
            check_capability(KSM_ROOT)
        except CapabilityMissing as exc:
            self.skip_because(str(exc))
        fs = Sysfs(KSM_ROOT)
        before = fs.knobs()
        self.require(
            before.get("pages_to_scan") != str(STALE_PAGES_TO_SCAN),
            f"host KSM pages_to_scan is already {STALE_PAGES_TO_SCAN}: the check could not tell",
        )
        source = HOLDING_KSM.format(pages_to_scan=STALE_PAGES_TO_SCAN, sleep_ms=STALE_SLEEP_MS)
        # The killed run's state in a folder of this test's own: every
        # memqual process on the host (another job's test, a developer's
        # command) restores what a dead run left in the shared one, and
        # could take the restore away from the command checked here.
        state_dir = Path(tempfile.mkdtemp(prefix="mq-state-"))
        private = {"MEMQUAL_STATE_DIR": str(state_dir)}
        proc, pidfile, _ = self._start_nested(900, source, private)
        try:
            self._wait_pidfile(proc, pidfile)
            changed = fs.knobs()
            self.assertEqual(changed["pages_to_scan"], str(STALE_PAGES_TO_SCAN), "the nested test did not change KSM")
            os.killpg(proc.pid, signal.SIGKILL)  # no handler, no atexit, no tearDown runs
            proc.wait(timeout=EXIT_DEADLINE_S)
            self.assertEqual(fs.knobs(), changed, "something restored the knobs after SIGKILL: the test proves nothing")
            # What the killed run saw before its change, under the KSM lock.
            # Not "before" above: a memqual process outside this suite (no
            # measurement lock) may have held changed knobs then.
            from memqual.host.ksm.state import HostState

            saved = HostState(state_dir).load()
            self.assertIsNotNone(saved, "the killed run left no state file")
            assert saved is not None
            # memqual started again: any command puts the killed run's knobs back.
            memqual = Path(sys.executable).parent / "memqual"
            start = subprocess.run(
                [str(memqual), "image", "build"],
                capture_output=True,
                text=True,
                timeout=600,
                env=dict(os.environ, **private),
            )
            self.assertEqual(start.returncode, 0, start.stderr[-500:])
            after = fs.knobs()
            self.assertEqual(
                {k: after[k] for k in (saved.values["ksm"] or {})},
                (saved.values["ksm"] or {}),
                f"memqual did not restore the knobs: {start.stderr[-500:]}",
            )
            self.assertNotEqual(after["pages_to_scan"], str(STALE_PAGES_TO_SCAN))
            self.assertIn("restored", start.stderr)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            from memqual.host.ksm.state import restore_stale

            restore_stale(state_dir)  # whatever happened above, leave the host as it was
            shutil.rmtree(state_dir, ignore_errors=True)


class GuestIsolation(GuestTest):
    """The guest reaches nothing outside through its user network
    (``restrict=on``): not a service on the host's loopback, while the
    host's SSH forward into the guest works (every command here uses it).

    :avocado: enable
    :avocado: tags=boot
    """

    @measures_nothing
    def test_guest_cannot_reach_a_host_loopback_port(self) -> None:
        import socket

        from memqual.host.core.qemu import MachineConfig

        # No thread accepts: the kernel completes the handshake of any
        # connection into the listen backlog by itself, and a non-blocking
        # accept afterwards finds it there.
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(4)
            listener.setblocking(False)
            port = listener.getsockname()[1]
            vm = self.boot(MachineConfig(memory_mib=512, cpus=1))
            # Positive control: nc itself works, on the guest's own SSH server.
            own = vm.ssh.run(["sh", "-c", "echo | nc -w 3 127.0.0.1 22"], timeout=30, check=False)
            self.assertEqual(own.status, 0, f"nc cannot reach the guest's own port 22: {own}")
            self.assertIn("SSH-", own.stdout)
            # 10.0.2.2 is the host as user networking shows it to the guest.
            out = vm.ssh.run(["sh", "-c", f"echo hello | nc -w 3 10.0.2.2 {port}"], timeout=30, check=False)
            self.assertNotEqual(out.status, 0, f"the guest reached host 127.0.0.1:{port}: {out}")
            try:
                _, peer = listener.accept()
            except BlockingIOError:
                peer = None
            self.assertIsNone(peer, "the host's loopback listener got a connection from the guest")

"""Nothing leaks: a guest test that Avocado stops, by its timeout or by
Ctrl-C, leaves no QEMU behind; host KSM knobs changed by a run killed with
SIGKILL are put back when memqual next starts.

Each test writes a small Avocado test into its work directory (outside
e2e/, so `avocado run e2e/` never runs it) that boots a real guest (or
changes the real host KSM knobs), writes a pid to a file and then hangs; a
nested `avocado run` of that file is stopped, and what it held must be
gone or restored afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from e2e.base import GuestTest
from host.paths import REPO_ROOT

HANGING_TEST = textwrap.dedent(
    '''\
    import os
    import time

    from e2e.base import GuestTest
    from host.machine import MachineConfig


    class Hang(GuestTest):
        """
        :avocado: enable
        """

        timeout = {timeout}

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

    from host.ksm import KsmController


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
# Values no host uses by default, so a knob left at them is ours.
STALE_PAGES_TO_SCAN = 4321
STALE_SLEEP_MS = 7
HANG_TIMEOUT_S = 12  # the nested test's own timeout: boot (warm 0.5 s, cold 2-3 s) plus margin
EXIT_DEADLINE_S = 120.0  # for the nested avocado to finish after it was stopped
GONE_DEADLINE_S = 10.0  # for the QEMU to be reaped after avocado returned


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


class Cleanup(GuestTest):
    """
    :avocado: enable
    :avocado: tags=boot
    """

    def _start_nested(self, timeout_s: int, source: str | None = None) -> tuple[subprocess.Popen[bytes], Path, Path]:
        work = Path(self.workdir)
        test_file = work / "hang_guest.py"
        test_file.write_text(source or HANGING_TEST.format(timeout=timeout_s))
        pidfile = work / "qemu.pid"
        results = work / "nested"
        env = dict(os.environ, MEMQUAL_LEAK_PIDFILE=str(pidfile))
        avocado = Path(sys.executable).parent / "avocado"
        proc = subprocess.Popen(
            [str(avocado), "run", "--disable-sysinfo", "--job-results-dir", str(results), str(test_file)],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: Ctrl-C goes to it alone
        )  # fmt: skip
        return proc, pidfile, results

    def _wait_pidfile(self, proc: subprocess.Popen[bytes], pidfile: Path) -> int:
        deadline = time.monotonic() + EXIT_DEADLINE_S
        while not (pidfile.exists() and pidfile.read_text().strip()):
            if proc.poll() is not None:
                self.fail(f"the nested avocado ended (status {proc.returncode}) before its guest was up")
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                self.fail("the nested test's guest did not come up")
            time.sleep(0.05)  # polling for a file the nested test writes
        return int(pidfile.read_text())

    def _assert_gone(self, qemu_pid: int) -> None:
        deadline = time.monotonic() + GONE_DEADLINE_S
        while alive(qemu_pid):
            if time.monotonic() > deadline:
                os.kill(qemu_pid, signal.SIGKILL)  # do not leak it ourselves
                self.fail(f"QEMU {qemu_pid} outlived its stopped test by {GONE_DEADLINE_S:.0f} s")
            time.sleep(0.05)  # polling /proc with a deadline

    def _status(self, results: Path) -> str:
        (job,) = [p for p in results.glob("job-*") if p.is_dir() and not p.is_symlink()]
        tests = json.loads((job / "results.json").read_text())["tests"]
        return tests[0]["status"] if tests else "no test"

    def test_timeout_kills_the_guest(self) -> None:
        proc, pidfile, results = self._start_nested(HANG_TIMEOUT_S)
        qemu_pid = self._wait_pidfile(proc, pidfile)
        self.assertTrue(alive(qemu_pid), "the nested test's QEMU is not running")
        proc.wait(timeout=EXIT_DEADLINE_S + HANG_TIMEOUT_S)
        self._assert_gone(qemu_pid)
        self.assertEqual(self._status(results), "INTERRUPTED", "the nested test should end by its timeout")

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

    def test_sigkill_mid_ksm_then_memqual_restores_the_knobs(self) -> None:
        """
        :avocado: tags=ksm
        """
        from host.errors import CapabilityMissing
        from host.ksm import KSM_ROOT, Sysfs, check_capability

        try:
            check_capability(KSM_ROOT)
        except CapabilityMissing as exc:
            self.skip_because(str(exc))
        fs = Sysfs(KSM_ROOT)
        before = fs.knobs()
        self.require(before.get("pages_to_scan") != str(STALE_PAGES_TO_SCAN),
                     f"host KSM pages_to_scan is already {STALE_PAGES_TO_SCAN}: the check could not tell")
        source = HOLDING_KSM.format(pages_to_scan=STALE_PAGES_TO_SCAN, sleep_ms=STALE_SLEEP_MS)
        proc, pidfile, _ = self._start_nested(900, source)
        try:
            self._wait_pidfile(proc, pidfile)
            changed = fs.knobs()
            self.assertEqual(changed["pages_to_scan"], str(STALE_PAGES_TO_SCAN), "the nested test did not change KSM")
            os.killpg(proc.pid, signal.SIGKILL)  # no handler, no atexit, no tearDown runs
            proc.wait(timeout=EXIT_DEADLINE_S)
            self.assertEqual(fs.knobs(), changed, "something restored the knobs after SIGKILL: the test proves nothing")
            # memqual started again: any command puts the killed run's knobs back.
            memqual = Path(sys.executable).parent / "memqual"
            start = subprocess.run([str(memqual), "image", "build"], capture_output=True, text=True, timeout=600)
            self.assertEqual(start.returncode, 0, start.stderr[-500:])
            self.assertEqual(fs.knobs(), before, f"memqual did not restore the knobs: {start.stderr[-500:]}")
            self.assertIn("restored", start.stderr)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            from host.ksm import restore_stale

            restore_stale()  # whatever happened above, leave the host as it was

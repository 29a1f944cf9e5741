"""Many lab hosts, for real: network namespaces on this machine, each with
its own veth address and sshd, driven by ``memqual hosts check`` and
``memqual run --hosts``; the lab itself is e2e/lab.py.

Run: ``avocado run e2e/test_hosts.py`` (tag: hosts); needs root and
/usr/sbin/sshd, else CANCEL with the reason.  docs/hosts.md,
"e2e/test_hosts.py", says how a host's death is placed mid-task."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import avocado

from memqual.e2e.base import MeasurementLock, skip
from memqual.e2e.lab import SSHD, NamespaceLab, alive, remove_stale_labs
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.polling import poll

MEMQUAL = Path(sys.executable).parent / "memqual"
# Generous: on a shared machine the tasks queue for the measurement lock
# behind other runs' tests.
RUN_DEADLINE_S = 420.0
RUNNING_DEADLINE_S = 60.0


def _running_hosts(output: Path) -> set[str]:
    """Hosts with a task running now, from the spawner's place files."""
    hosts = set()
    for path in output.glob("avocado/job-*/test-results/*/fleet-place.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if data.get("outcome") == "running":
                hosts.add(data["host"])
    return hosts


def _listeners() -> set[str]:
    """Local addresses with a TCP listener in this network namespace."""
    result = subprocess.run(["ss", "-H", "-l", "-t", "-n"], capture_output=True, text=True, timeout=10, check=True)
    return {line.split()[3] for line in result.stdout.splitlines() if len(line.split()) > 3}


# Run as nobody inside a lab host's namespace: can a local user there reach
# the status channel (the remote end of the session's -R forward)?
_PROBE_CHANNEL = """
import socket, sys
target = sys.argv[1]
try:
    if target.startswith("/"):
        s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(target)
    else:
        host, port = target.rsplit(":", 1); socket.create_connection((host, int(port)), timeout=5)
except OSError as exc:
    print(type(exc).__name__)
else:
    print("connected")
"""


def _status_channel_as_nobody(output: Path, ns: str, name: str) -> str:
    """What a local user of lab host ``name`` meets on the status channel:
    "connected", or the error of its connect."""
    login = json.loads((output / "fleet" / f"slot-{name}-1.json").read_text())
    words = shlex.split(login["extra_cmdline"])
    forward = words[words.index("-R") + 1]
    # "127.0.0.1:P:127.0.0.1:P" (TCP) or "/remote.sock:/local.sock"
    remote = forward.split(":")[0] if forward.startswith("/") else ":".join(forward.split(":")[:2])
    result = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            ns,
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            _PROBE_CHANNEL,
            remote,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.stdout.strip() or result.stderr.strip()


def _qemus_under(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/exe").resolve().name.startswith("qemu-system"):
                out.append(pid)
    return out


class LabHosts(avocado.Test):
    """
    :avocado: enable
    :avocado: tags=hosts
    """

    timeout = 600

    def setUp(self) -> None:
        if os.geteuid() != 0:
            skip(self, "lab hosts as network namespaces need root (ip netns)")
        if not SSHD.is_file() or not shutil.which("ssh") or not shutil.which("ip"):
            skip(self, "needs /usr/sbin/sshd (openssh-server), ssh and ip (iproute2)")
        # A run of this test that was killed (SIGKILL, a timeout) could not
        # tear its lab down: that is done now.
        remove_stale_labs()
        self.task_dirs_before = set(Path("/tmp").glob("memqual-task.*")) | set(Path("/tmp").glob("memqual-status.*"))
        self.scratch = Path(tempfile.mkdtemp(prefix="mqlab-"))
        # sshd's StrictModes refuses keys under a world-writable /tmp.
        self.lab = NamespaceLab(3, Path(tempfile.mkdtemp(prefix=f"mqlab-{os.getpid()}-", dir="/run")))
        self.lab.__enter__()

    def tearDown(self) -> None:
        scratch = getattr(self, "scratch", None)
        if scratch is not None:
            # The inner job's own logs outlive the lab: a failure here is
            # read from them (avocado's job.log holds its crash traceback).
            for log in [*scratch.glob("out/avocado/job-*/job.log"), *scratch.glob("out/avocado/*.log")]:
                shutil.copy(log, Path(self.outputdir) / f"inner-{log.parent.name}-{log.name}")
            shutil.rmtree(scratch, ignore_errors=True)
        # The lab hosts share this /tmp: the task directory of lab3's
        # interrupted task (which a real host's next memqual hosts probe
        # removes once stale) is this test's to remove.
        # So is the status channel's directory of lab3, which memqual could
        # not reach to remove.
        made = set(Path("/tmp").glob("memqual-task.*")) | set(Path("/tmp").glob("memqual-status.*"))
        for path in made - getattr(self, "task_dirs_before", set()):
            shutil.rmtree(path, ignore_errors=True)
        lab = getattr(self, "lab", None)
        if lab is not None:
            netns_pids = [pid for host in lab.hosts for pid in lab.pids(host)]
            lab.close()
            left = lab.leftovers()
            stray = [pid for pid in netns_pids if alive(pid)]
            self.assertEqual(left, [], "the lab left these behind")
            self.assertEqual(stray, [], "processes of the lab hosts (sshd, tasks, QEMU) outlived it")

    def _memqual(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(MEMQUAL), *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )

    def test_check_run_and_a_host_lost(self) -> None:
        hosts = self.lab.hosts_file(self.scratch / "hosts.toml")

        # Bad input: one line, exit 2.
        bad = self.scratch / "bad.toml"
        bad.write_text('[[host]]\nname = "x"\naddress = "10.0.0.1"\nadress = "typo"\n')
        result = self._memqual("hosts", "check", str(bad))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertIn("unknown key 'adress'", result.stderr)

        # A host key that is not the pinned one is refused, not accepted.
        wrong = self.scratch / "wrong_known_hosts"
        other_key = self.lab.known_hosts.read_text().splitlines()[1].split()[1:]
        wrong.write_text(" ".join([self.lab.hosts[0]["address"], *other_key]) + "\n")

        started = time.monotonic()
        result = self._memqual("hosts", "check", "--json", str(hosts))
        self.log.info("hosts check: %.1f s\n%s", time.monotonic() - started, result.stderr)
        checked = json.loads(result.stdout)["hosts"]
        self.assertEqual([h["host"] for h in checked], ["lab1", "lab2", "lab3"])
        # Busy is the one problem allowed: another test of this machine may
        # hold the measurement lock (then exit 1, and it says so), and may
        # take or let go of it between the three probes.
        busy = [h for h in checked if not h["usable"]]
        self.assertEqual(result.returncode, 1 if busy else 0, result.stdout + result.stderr)
        for h in checked:
            self.assertTrue(h["usable"] or h["problem"].startswith("busy: pid"), h)
            self.assertEqual(h["probe"]["lock_free"], h["usable"], h)
            self.assertTrue(h["doctor"]["qemu_version"], h)
        self.assertEqual(len({h["probe"]["boot_id"] for h in checked}), 1, "the namespaces share one kernel")

        pinned = self.scratch / "pinned.toml"
        pinned.write_text(hosts.read_text().replace(str(self.lab.known_hosts), str(wrong), 1))
        result = self._memqual("hosts", "check", str(pinned))
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("lab1", result.stdout)
        self.assertRegex(result.stdout.splitlines()[0], r"NOT READY: unreachable: .*[Hh]ost key")

        # The run: every host gets a task that blocks on the measurement lock
        # this test holds; lab3 dies then, and the lock is let go.
        output = self.scratch / "out"
        listening_before = _listeners()
        lock = MeasurementLock()
        lock.acquire()
        released = False
        started = time.monotonic()
        run = subprocess.Popen(
            # Tag fleet: two cheap scenarios (a warm boot; the memslot
            # errnos and timings on /dev/kvm, which writes records), each
            # run on every host, the boot first.
            [str(MEMQUAL), "run", "--hosts", str(hosts), "--only", "fleet", "--output", str(output)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=(self.scratch / "run.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def every_host_runs() -> bool:
                self.assertIsNone(run.poll(), (self.scratch / "run.log").read_text())
                return _running_hosts(output) == {"lab1", "lab2", "lab3"}

            poll(
                every_host_runs,
                RUNNING_DEADLINE_S,
                0.05,
                what="a task on every host",
                on_timeout=lambda _: AssertionError(f"not every host got a task: {_running_hosts(output)}"),
            )
            # The controller listens on loopback only (Avocado's status server).
            opened = _listeners() - listening_before
            self.assertTrue(all(a.startswith(("127.0.0.1:", "[::1]:")) for a in opened), opened)
            # No other user of a lab host can post to the status channel.
            for host in self.lab.hosts:
                met = _status_channel_as_nobody(output, host["ns"], host["name"])
                self.assertEqual(met, "PermissionError", f"{host['name']}: a local user there met {met!r}")
            killed = self.lab.kill(self.lab.hosts[2])
            self.log.info("lab3 killed after %.1f s: pids %s", time.monotonic() - started, killed)
            lock.release()
            released = True
            status = run.wait(timeout=RUN_DEADLINE_S)
        finally:
            if not released:
                lock.release()
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGTERM)
                run.wait(timeout=30)
        log = (self.scratch / "run.log").read_text()
        self.log.info("memqual run --hosts: %.1f s, exit %s\n%s", time.monotonic() - started, status, log)
        self.assertEqual(status, 3, "a lost host: the fleet did not complete")

        fleet = json.loads((output / "fleet.json").read_text())
        by_name = {h["name"]: h for h in fleet["hosts"]}
        self.assertEqual(by_name["lab3"]["status"], "lost", by_name["lab3"])
        # Its running task interrupted, its queued one not run (it measures
        # lab3; the other hosts run their own copies).
        self.assertEqual([t["outcome"] for t in by_name["lab3"]["tasks"]], ["interrupted", "not run"], by_name["lab3"])
        for name in ("lab1", "lab2"):
            self.assertEqual(by_name[name]["status"], "completed", by_name[name])
            self.assertEqual([t["outcome"] for t in by_name[name]["tasks"]], ["ran", "ran"], by_name[name])
        self.assertEqual(fleet["not_run"], [])
        self.assertEqual(len(fleet["shared_kernels"]), 1, fleet["shared_kernels"])
        self.assertEqual(sorted(fleet["shared_kernels"][0]["hosts"]), ["lab1", "lab2", "lab3"])
        self.assertIn("One kernel", (output / "fleet.html").read_text())
        self.assertIn("lab host lab3: LOST (1 interrupted, 1 not run)", log)
        self.assertIn("lab host lab3 was lost while the task ran; nothing of it was kept", log)

        # No half-run result: the interrupted task left no record anywhere
        # in the hosts' results; every record names its host.
        for name in ("lab1", "lab2", "lab3"):
            results = output / "hosts" / name / "results.json"
            self.assertTrue(results.is_file(), results)
            for record_path in (output / "hosts" / name / "records").glob("*.json"):
                record = json.loads(record_path.read_text())
                self.assertEqual(record["environment"]["lab_host"], name)
        self.assertEqual(list((output / "hosts" / "lab3" / "records").glob("*.json")), [])
        for name in ("lab1", "lab2"):
            self.assertTrue(list((output / "hosts" / name / "records").glob("*.json")), name)

        # compare across two hosts, as across two kernels: a verdict, not bad input.
        result = self._memqual(
            "compare", str(output / "hosts/lab1/results.json"), str(output / "hosts/lab2/results.json")
        )
        self.assertIn(result.returncode, (0, 1), result.stdout + result.stderr)

        # Nothing of lab3's task is left running, no QEMU among the lab's processes.
        survivors = [pid for host in self.lab.hosts for pid in self.lab.pids(host)]
        self.assertEqual(_qemus_under(survivors), [])
        self.assertEqual(self.lab.pids(self.lab.hosts[2]), [])

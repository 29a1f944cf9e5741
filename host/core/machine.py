"""One QEMU process: launched, reached over QMP and SSH, always reaped.

QEMU dies with its parent (PR_SET_PDEATHSIG); ``shutdown()`` is idempotent
and always reaps; a free loopback port and a fresh socket directory per
launch.  ``launch()`` runs a start strategy (a warm start through
host/core/snapshot.py, or ``boot_cold()``) built of the public steps
``start_qemu``, ``wait_ssh``, ``close_ssh``, ``kill_qemu``.
docs/architecture.md, "host/core/machine.py", has the lifecycle."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import os
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from qemu.qmp import QMPError
from qemu.qmp.legacy import QEMUMonitorProtocol

from memqual.host.core import clock, nested, probe, snapshot, stuck
from memqual.host.core.boot_deadline import BootDeadline
from memqual.host.core.console import READY_MARKER, ConsoleMarker
from memqual.host.core.errors import BadInput, CapabilityMissing, GuestError, LaunchError, MemqualError, Timeout
from memqual.host.core.paths import open_nofollow, release_tempdir, short_tempdir
from memqual.host.core.polling import poll
from memqual.host.core.process import die_with_parent
from memqual.host.core.qemu import (
    INNER_QMP_PORT,
    MachineConfig,
    command_line,
    qemu_binary,
    qemu_version,
)
from memqual.host.core.qemu_binary import host_firmware_dirs, runtime_env
from memqual.host.core.ssh import SSH, HostKeyMismatch, banner_ready
from memqual.images import agents, symbols
from memqual.images import build as images_build
from memqual.images import host_image as l1_image

log = logging.getLogger("memqual.machine")
T = TypeVar("T")
# What the wait for the guest's SSH is called: its timeout says so in words tests and users know.
SSH_WAIT = "SSH to the guest"
_LIVE: weakref.WeakSet[Machine] = weakref.WeakSet()


def free_port() -> int:
    """A loopback port free right now.  Another process may take it before
    QEMU binds it: launch() retries on that specific failure."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@atexit.register
def _reap_all() -> None:
    for machine in list(_LIVE):
        machine.shutdown(timeout=2)


BANNER_PROBE_S = 0.1  # a guest whose network is up answers in well under this
# Every QMP command answers at once (migrate and balloon return before the
# work is done); one that takes this long means QEMU is stuck.
QMP_TIMEOUT_S = 60.0
# The longest a wait for an event holds the monitor at once.
EVENT_SLICE_S = 0.5


StartStrategy = Callable[["Machine"], None]


def default_start(config: MachineConfig) -> StartStrategy:
    """How a machine not given a start strategy starts: from a saved guest
    (memqual.host.core.snapshot) when its config asks for warm starts and the
    snapshot directory is usable, else a cold boot."""
    if config.warm and snapshot.usable():
        return snapshot.start
    return Machine.boot_cold


class Machine:
    """A guest.  Use as a context manager::

    with Machine(MachineConfig(memory_mib=1024)) as vm:
        vm.ssh.run(["uname", "-r"])
    """

    def __init__(
        self,
        config: MachineConfig | None = None,
        image: Any = None,
        log_dir: Path | None = None,
        boot_timeout: float = 90.0,
        start: StartStrategy | None = None,
        host: nested.HostUnderTest | None = None,
    ) -> None:
        if not (isinstance(boot_timeout, (int, float)) and math.isfinite(boot_timeout) and boot_timeout > 0):
            raise BadInput(f"boot timeout {boot_timeout!r} is not a positive number of seconds: give e.g. 90")
        self.config = config or MachineConfig()
        self._image = image
        self._start = start
        # The guest's host: None for this machine's own; else a host kernel
        # under test (L1) that this machine's QEMU boots and whose KVM runs
        # the guest (host/core/nested.py).
        self.host = host
        self.host_image: Any = None
        self.host_accel = ""
        self.host_ssh_port = 0
        self._host_qmp: QEMUMonitorProtocol | None = None
        self._host_ssh: SSH | None = None
        self._guest_qmp_port = 0
        self._log_dir = Path(log_dir) if log_dir else None
        self.boot_timeout = float(boot_timeout)
        self.qmp_timeout = QMP_TIMEOUT_S
        self.accel = ""
        self.accel_reason = ""
        self.clock = clock.WALL_CLOCK  # resolved at launch (_pre_launch)
        self.boot_to_ssh_s = float("nan")
        self.started_warm = False
        self.command: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._qemu_started = float("inf")  # time.monotonic() at this QEMU's start
        self._qmp: QEMUMonitorProtocol | None = None
        self._qmp_lock = threading.Lock()
        self._sockdir: Path | None = None
        self._ssh: SSH | None = None
        self.console_log = Path("/dev/null")
        self.ssh_port = 0
        self._stuck_count = 0

    # -- properties -------------------------------------------------------
    @property
    def image(self) -> Any:
        if self._image is None:
            self._image = images_build.build()
        return self._image

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise GuestError("the machine is not running")
        return self._proc.pid

    @property
    def ssh(self) -> SSH:
        if self._ssh is None:
            raise GuestError("the machine is not running (no SSH session)")
        return self._ssh

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- launch -----------------------------------------------------------
    def __enter__(self) -> Machine:
        self.launch()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def launch(self) -> None:
        if self.is_running():
            # A second launch would orphan the first QEMU (this object holds
            # one process); "with Machine(...)" has already launched.
            raise GuestError(f"launch() on a running machine (QEMU pid {self.pid}): shut it down first")
        self._pre_launch()
        _LIVE.add(self)
        try:
            self._launch()
        except BaseException:
            self.shutdown(timeout=2)
            raise

    def _pre_launch(self) -> None:
        """The clock and the accelerator, a fresh socket directory, the
        console log."""
        self.clock = clock.parse(self.config.clock) if self.config.clock else clock.current()
        if self.host is not None:
            self.clock = nested.host_clock(self.clock, self.host.shift_cap)
            vcpus = nested.host_vcpus(self.config.cpus, self.clock)
            if vcpus != self.config.cpus:
                log.info("the host under test's guest runs %d vCPU on %s", vcpus, self.clock.label)
                self.config = dataclasses.replace(self.config, cpus=vcpus)
        if self.clock.auto:
            # A plan names no clock for one guest: a test resolves it first
            # (e2e/base.py), from the scenario it runs.
            raise BadInput(
                f"clock {self.clock.label} is a run's plan, not a guest's clock: give a guest wall or "
                f"icount:{self.clock.shift}"
            )
        try:
            forced = clock.resolve_accel(self.clock, self.config.accel)
        except BadInput as exc:
            # A guest that needs KVM (the /dev/kvm scenarios') cannot run on
            # the icount clock: missing here, not the scenario's error.
            raise CapabilityMissing(str(exc)) from None
        self.accel, self.accel_reason = forced or probe.resolve_accel(self.config.accel)
        if self.clock.icount:
            vcpus = 1 if self.host is not None else self.config.cpus  # the host under test's L1 has one
            clock.check_vcpus(self.clock, vcpus, qemu_version(qemu_binary()))
        if self.host is not None:
            self._prepare_host(self.host)
        self._sockdir = short_tempdir("mq")
        log_dir = self._log_dir or self._sockdir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.console_log = log_dir / f"console-{os.getpid()}-{id(self):x}.log"

    def _prepare_host(self, host: nested.HostUnderTest) -> None:
        """L1's image, built before the clock starts; the guest runs under
        L1's KVM and this machine's accelerator runs L1."""
        source = images_build.KernelSource(debian=host.kernel.version)
        nested.check_params(host, l1_image.module_parameters(source))
        binary = qemu_binary()
        self.host_image = l1_image.build_host(
            source, self.image, Path(binary), host_firmware_dirs(binary), runtime_env(binary)
        )
        self.host_accel = self.accel
        self.accel = "kvm"
        self.accel_reason = f"under the host under test's KVM: {host.label(self.host_accel)}"

    @property
    def host_label(self) -> str:
        """The host the guest ran on, as records and pages name it."""
        if self.host is None:
            return nested.this_machine_label(self.accel)
        return self.host.label(self.host_accel)

    def _launch(self) -> None:
        (self._start or default_start(self.config))(self)

    def boot_cold(self) -> None:
        """Boot the kernel and wait for SSH."""
        started = time.monotonic()
        self.start_qemu(incoming=None)
        self.wait_ssh(started)

    def start_qemu(self, incoming: str | None = None) -> None:
        """Start QEMU with QMP connected (``incoming``: restore a saved
        state instead of booting); retries when the port was taken."""
        if self._sockdir is None:
            raise GuestError("start_qemu() outside launch(): the machine has no socket directory")
        for attempt in range(3):
            self.ssh_port = free_port()
            qmp_path = self._sockdir / "qmp.sock"
            qmp_path.unlink(missing_ok=True)
            # memqual is the QMP server and QEMU connects to it: no polling
            # for a socket to appear.
            self._qmp = QEMUMonitorProtocol(str(qmp_path), server=True)
            self.command = (
                self._host_command(qmp_path, incoming)
                if self.host is not None
                else command_line(
                    self.config,
                    self.accel,
                    self.image.kernel,
                    self.image.initrd,
                    qmp_path,
                    self.console_log,
                    self.ssh_port,
                    incoming,
                    self.clock,
                )
            )
            log.info("launch: %s", " ".join(self.command))
            stderr_path = self._sockdir / "qemu.stderr"
            # never through a link: the folder is fresh and ours, but root writes here
            with os.fdopen(open_nofollow(stderr_path), "wb") as stderr:
                self._qemu_started = time.monotonic()
                self._proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent,
                    close_fds=True,
                    env=runtime_env(self.command[0]),
                )
            try:
                self._accept_qmp(qmp_path)
                if self.host is not None and incoming is None:
                    # A restored L1 stays paused until the snapshot has
                    # loaded: its guest's monitor is reached after that
                    # (resume_nested_guest).
                    self._connect_guest_monitor(self._boot_deadline(time.monotonic()), after_ready=True)
                return
            except LaunchError as exc:
                if "host forwarding rule" in exc.output and attempt < 2:
                    log.warning("port %d was taken; retrying with another", self.ssh_port)
                    self.kill_qemu()
                    continue
                raise

    def _host_command(self, qmp_path: Path, incoming: str | None) -> list[str]:
        """The outer QEMU's argv: L1, with the guest's argv in fw_cfg and
        three forwards (L1's SSH, the guest's SSH and monitor); ``incoming``
        restores a saved L1 with its guest instead of booting it."""
        assert self.host is not None and self._sockdir is not None
        argv_file = self._sockdir / "guest-argv"
        argv = nested.guest_argv(self.config, self.clock, l1_image.L2_KERNEL, l1_image.L2_INITRD, self.host.cpu)
        nested.write_argv(argv, argv_file)
        self.host_ssh_port = free_port()
        self._guest_qmp_port = free_port()
        l1 = nested.host_config(self.config, self.host, argv_file, self.host_accel, self.clock)
        return command_line(
            l1,
            self.host_accel,
            self.host_image.kernel,
            self.host_image.initrd,
            qmp_path,
            self.console_log,
            self.host_ssh_port,
            incoming,
            self.clock,
            forwards=((self.ssh_port, nested.INNER_SSH_PORT), (self._guest_qmp_port, INNER_QMP_PORT)),
        )

    def _connect_guest_monitor(self, deadline: BootDeadline, after_ready: bool = False) -> None:
        """Swap the outer monitor (L1's QEMU) for the guest's, once L1 has
        booted and started the guest's QEMU, by ``deadline``; a failure L1
        reports on its console, or the outer QEMU's exit, ends the wait at
        once.  ``after_ready`` (a cold boot): first the guest's own
        "memqual-ready" on L1's console, read from its log: a connection
        attempt into L1 is L1's work at a moment this machine's pace sets,
        and while the guest boots it would land on the clock L1 and the
        guest keep (two cold boots polled so differed 1.7-4.5 % in the
        guest's own boot timestamps)."""
        failed = ConsoleMarker(self.console_log, nested.HOST_FAILED.encode())
        ready = ConsoleMarker(self.console_log, READY_MARKER)

        def greeted() -> Any:
            if failed.seen() or (self._proc is not None and self._proc.poll() is not None):
                raise self._boot_failed("the host under test did not start the guest")
            if after_ready and not ready.seen():
                return None
            return nested.monitor_greets(self._guest_qmp_port, timeout=1.0)

        sock = self._until_booted(greeted, deadline, 0.1, "the guest's monitor in the host under test")
        self._host_qmp, self._qmp = self._qmp, nested.connect_monitor(sock)

    def _accept_qmp(self, qmp_path: Path) -> None:
        assert self._qmp is not None and self._proc is not None
        proc = self._proc
        accepted = threading.Event()

        accept_s = min(30.0, self.boot_timeout)

        def unblock_if_qemu_exits() -> None:
            # accept() returns only on a connection or its timeout: when QEMU
            # dies before connecting (bad option, port taken), connect and
            # hang up ourselves so accept fails now, not at the timeout.  A
            # pause ends as soon as accept() is over (the sleep is the event's).
            exited = poll(
                lambda: accepted.is_set() or proc.poll() is not None,
                accept_s + 1.0,
                0.02,
                what="QEMU's QMP connection or its exit",
                sleep=accepted.wait,
                raise_on_timeout=False,
            )
            if exited.met and not accepted.is_set():
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                        sock.connect(str(qmp_path))
                except OSError:
                    pass

        watcher = threading.Thread(target=unblock_if_qemu_exits, name="qmp-accept-watch", daemon=True)
        watcher.start()
        try:
            self._qmp.accept(timeout=accept_s)
        except (QMPError, OSError, TimeoutError) as exc:
            accepted.set()
            watcher.join()
            state = self._exit_description()  # before the kill, which would hide it
            self.kill_qemu()
            output = self.qemu_output()
            last_line = (output.strip().splitlines() or [str(exc) or type(exc).__name__])[-1]
            raise LaunchError(f"QEMU did not come up ({state}): {last_line}", self.command, output) from exc
        finally:
            accepted.set()

    def wait_ssh(self, started: float, first_command: list[str] | None = None, probe_banner: bool = True) -> None:
        """Wait for a working SSH command, with a deadline; a QEMU that exits
        or a guest that panics ends the wait at once.

        QEMU's user network accepts TCP before the guest listens and then
        drops the connection, so a failed attempt costs little; each try is
        a full SSH connect (banner, key exchange, auth) and one command."""
        deadline = self._boot_deadline(started)
        console = ConsoleMarker(self.console_log, READY_MARKER)

        def connected() -> SSH | None:
            """One readiness check, and one SSH attempt once it passes."""
            if self._proc is not None and self._proc.poll() is not None:
                raise self._boot_failed("QEMU exited during boot")
            # During a cold boot a cheap check avoids a full SSH attempt
            # every poll; a restored guest is up at once.  The check is the
            # guest's own "memqual-ready" on the console (guest/rc.sh prints
            # it once dropbear is started), or else the SSH banner.  The
            # banner alone made cold boots bimodal: before the guest's network
            # is up, QEMU holds the probe's connection open, so each probe
            # cost its whole timeout.
            if probe_banner and not (console.seen() or banner_ready(self.ssh_port, timeout=BANNER_PROBE_S)):
                return None
            ssh = SSH(self.ssh_port, self.image.key, slowdown=nested.BOOT_TIMEOUT_FACTOR if self.host else 1.0)
            try:
                ssh.connect(timeout=max(1.0, min(10.0, deadline.wall_deadline - time.monotonic())))
                ssh.run(first_command or ["true"], timeout=10)
            except HostKeyMismatch:
                # Not a guest still booting: another key will not change by waiting.
                ssh.close()
                raise
            except GuestError:
                ssh.close()
                return None
            return ssh

        # 20 ms: the poll period of the readiness check, not a wait for an event
        ssh = self._until_booted(connected, deadline, 0.02, SSH_WAIT)
        if self.clock.icount:
            # Each keepalive lands in the guest at a moment the
            # host's pace sets and costs it about a millisecond of
            # its instruction clock: a timed guest loop spread
            # 0.06 % across boots with them, 0.011 % without.
            ssh.set_keepalive(0)
        ssh.on_stuck = self.stuck_evidence
        self._ssh = ssh
        self.boot_to_ssh_s = time.monotonic() - started
        log.info("SSH ready after %.2f s (%s)", self.boot_to_ssh_s, self.accel)

    @property
    def ssh_ready(self) -> bool:
        """Is there an SSH session (``ssh``) to the guest?"""
        return self._ssh is not None

    def close_ssh(self) -> None:
        """Close the SSH session; the guest runs on (``wait_ssh`` opens
        another)."""
        if self._ssh is not None:
            self._ssh.close()
            self._ssh = None
        if self._host_ssh is not None:
            self._host_ssh.close()
            self._host_ssh = None

    def pause_nested_guest(self) -> None:
        """Before a save of the host under test: its guest's QEMU stopped
        (L1 leaves guest mode) and its one-client monitor let go; memqual's
        monitor is L1's QEMU's until ``resume_nested_guest``.  Nothing on
        this machine.  docs/host-under-test.md, "Warm starts of L1"."""
        if self.host is None or self._host_qmp is None:
            return
        self.qmp("stop")
        guest_monitor, self._qmp, self._host_qmp = self._qmp, self._host_qmp, None
        if guest_monitor is not None:
            guest_monitor.close()

        def l1_sockets() -> str:
            # tcp6 where L1 has it: the guest's QEMU may listen on either
            read = self.host_ssh.run(["cat", "/proc/net/tcp", "/proc/net/tcp6"], timeout=10.0, check=False)
            return str(read.stdout)

        nested.wait_monitor_released(l1_sockets, INNER_QMP_PORT, snapshot.RESTORE_DEADLINE_S)
        # L1's SSH closed again: the save holds no session of it either
        self.close_ssh()

    def resume_nested_guest(self) -> None:
        """Once L1 runs again: memqual's monitor the guest's again, the
        guest's QEMU continued; a restored one's silent monitor is a bad
        snapshot.  Nothing on this machine."""
        if self.host is None or self._host_qmp is not None:
            return
        try:
            # The restore's own deadline, in wall time: the guest's QEMU in
            # L1 has booted already, and only has to answer.
            self._connect_guest_monitor(BootDeadline(time.monotonic(), snapshot.RESTORE_DEADLINE_S))
        except Timeout as exc:
            raise snapshot.Unloadable(f"the guest's monitor in the restored host did not answer: {exc}") from exc
        if not self.qmp("query-status").get("running"):
            self.qmp("cont")

    @property
    def host_ssh(self) -> SSH:
        """An SSH session to the host under test (L1), opened at first use.
        Each command costs L1 instructions at a moment this machine paces:
        for checks and reads around a measurement, not inside one."""
        if self.host is None or self.host_image is None or not self.is_running():
            raise GuestError("the guest has no host under test running (no --host-kernel)")
        if self._host_ssh is None:
            ssh = SSH(self.host_ssh_port, self.host_image.key)
            ssh.connect(timeout=30)
            if self.clock.icount:
                ssh.set_keepalive(0)
            self._host_ssh = ssh
        return self._host_ssh

    def _boot_failed(self, what: str) -> LaunchError:
        """A boot that ended: how QEMU ended, the console's last line, and
        QEMU's output with the console's tail for the record."""
        return LaunchError(
            f"{what} ({self._exit_description()}); console: {self._console_tail(1)}",
            self.command,
            self.qemu_output() + "\n--- console ---\n" + self._console_tail(20),
        )

    def _boot_deadline(self, started: float) -> BootDeadline:
        """The boot's deadline from ``started``: ``boot_timeout`` of QEMU's
        CPU time on the icount clock (host/core/boot_deadline.py), of wall
        time otherwise.  The CPU time counts from QEMU's start when it
        started after ``started`` (a boot), else from now (a resume)."""
        if self._proc is None:
            return BootDeadline(started, self.boot_timeout)
        return BootDeadline.for_boot(
            started, self.boot_timeout, self._proc.pid, self.clock.icount, from_start=self._qemu_started >= started
        )

    def _until_booted(self, check: Callable[[], T | None], deadline: BootDeadline, period: float, what: str) -> T:
        """``check`` every ``period`` s until it gives something, by the
        boot's ``deadline``; past it, the timeout that names the console,
        as every wait of a boot ends."""

        def checked() -> T | None:
            if deadline.cpu_spent():
                raise self._boot_timeout(deadline, what)
            return check()

        found = poll(
            checked,
            max(0.0, deadline.wall_deadline - time.monotonic()),
            period,
            what=what,
            on_timeout=lambda _: self._boot_timeout(deadline, what),
        )
        assert found.value is not None  # poll waits until the value is true
        return found.value

    def _boot_timeout(self, deadline: BootDeadline, what: str) -> Timeout:
        """A boot's wait for ``what`` that ran out, with the console's tail
        and, for a guest of this machine whose QEMU still runs, what its
        vCPUs were doing (a kernel that hangs before it prints, under
        ``quiet``, leaves the console nothing to say)."""
        waited = "the guest did not answer SSH" if what == SSH_WAIT else f"no answer from {what}"
        # a host under test's guest monitor is in L1, which may not be up yet
        stuck = self.stuck_evidence() if self.host is None and not self.qemu_exited() else ""
        return Timeout(
            f"{waited} within {deadline.describe()} "
            f"(accel {self.accel}); console: {self._console_tail(1)} — see {self.console_log}"
            + (f"; its vCPUs: {stuck}" if stuck else "")
        )

    # -- control ----------------------------------------------------------
    def qmp(self, command: str, **arguments: Any) -> Any:
        if self._qmp is None:
            raise GuestError("the machine is not running (no QMP)")
        with self._qmp_lock:  # tearDown may run on another thread
            try:
                self._qmp.settimeout(self.qmp_timeout)
                return self._qmp.cmd(command, **arguments)
            except QMPError as exc:
                raise GuestError(f"QMP {command} failed: {exc}") from exc
            except TimeoutError as exc:
                raise Timeout(
                    f"QMP {command} got no answer within {self.qmp_timeout:.0f} s: QEMU is stuck "
                    f"(see {self.console_log})"
                ) from exc

    def qmp_event(self, name: str, deadline_s: float) -> dict[str, Any] | None:
        """The next QMP event called ``name`` within ``deadline_s`` seconds,
        or None at the deadline; other events are dropped.  The monitor is
        held only a short slice at a time, so a command from another thread
        (tearDown's) waits no longer than that."""
        if self._qmp is None:
            raise GuestError("the machine is not running (no QMP)")
        end = time.monotonic() + deadline_s
        while (left := end - time.monotonic()) > 0:
            with self._qmp_lock:
                try:
                    # A float: the legacy monitor waits forever on True.
                    event = self._qmp.pull_event(wait=float(min(left, EVENT_SLICE_S)))
                except TimeoutError:
                    continue
                except (QMPError, OSError, EOFError) as exc:
                    raise GuestError(f"QMP events ended waiting for {name}: {exc!r} (see {self.console_log})") from exc
            if event is not None and event.get("event") == name:
                return event
        return None

    def qmp_drop_events(self) -> None:
        """Forget the QMP events received and not yet read: a wait for the
        next event must not take one another move sent earlier."""
        if self._qmp is None:
            raise GuestError("the machine is not running (no QMP)")
        with self._qmp_lock:
            self._qmp.clear_events()

    def hmp(self, command_line: str) -> str:
        return str(self.qmp("human-monitor-command", **{"command-line": command_line}))

    def console_expect(self, pattern: str, timeout: float = 30.0) -> str:
        """Wait until the serial console shows ``pattern`` (a regular
        expression); returns the matching text.  QEMU itself drains the
        console into the log file, so nothing stalls while nobody reads;
        pexpect follows that file (with tail -F) only while a test waits."""
        import pexpect

        follower = pexpect.spawn(
            "tail", ["-n", "+1", "-F", str(self.console_log)], encoding="utf-8", codec_errors="replace", timeout=timeout
        )
        try:
            follower.expect(pattern)
            return str(follower.match.group(0))
        except pexpect.TIMEOUT as exc:
            raise Timeout(
                f"console did not show {pattern!r} within {timeout:.0f} s; last line: {self._console_tail(1)}"
            ) from exc
        finally:
            follower.close(force=True)

    def wait_exit(self, timeout: float) -> int:
        """QEMU's exit status once it ends by itself (a guest panic with
        panic=-1 and -no-reboot, a poweroff), within ``timeout``."""
        if self._proc is None:
            raise GuestError("the machine was never launched")
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise Timeout(f"QEMU still running {timeout:.0f} s after it should have ended") from exc

    def deploy(self, agent: str) -> str:
        """Build guest/<agent>.c (cached) and stream it into the guest."""
        guest_path = f"/tmp/{agent}"
        self.ssh.push(agents.build_agent(agent), guest_path)
        return guest_path

    # -- shutdown ---------------------------------------------------------
    def shutdown(self, timeout: float = 10.0) -> None:
        self.close_ssh()
        if self._proc is not None and self._proc.poll() is None and self._qmp is not None:
            try:
                with self._qmp_lock:
                    self._qmp.settimeout(2)
                    self._qmp.cmd("quit")
            except Exception:  # any failure here means: kill it
                log.info("QMP quit failed; killing QEMU")
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_qemu()
        self._post_shutdown()

    def _post_shutdown(self) -> None:
        if self._sockdir is not None:
            release_tempdir(self._sockdir)
            self._sockdir = None
        _LIVE.discard(self)

    def kill_qemu(self) -> None:
        """Kill this QEMU (if it runs), reap it and drop its QMP connection.
        The launch's socket directory stays: ``start_qemu`` may follow."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
        for monitor in (self._qmp, self._host_qmp):
            if monitor is not None:
                try:
                    monitor.close()
                except Exception:  # the peer is gone already
                    pass
        self._qmp = self._host_qmp = None

    # -- diagnostics ------------------------------------------------------
    def stuck_evidence(self) -> str:
        """What the guest's vCPUs are doing, read from outside it
        (host/core/stuck.py): the whole evidence in ``stuck-N.txt`` of the
        log directory, one line returned for the error that asked.  Never
        raises: a guest that stopped must not hide the error it caused."""
        kernel = Path(self._image.kernel) if self._image is not None else None
        threads = None
        if self.host is not None and self.host_image is not None:

            def threads() -> str:
                return self.host_ssh.run(["sh", "-c", stuck.L1_QEMU_THREADS], timeout=30, check=False).stdout

        evidence = stuck.collect(self.hmp, (lambda: symbols.of_kernel(kernel)) if kernel else None, threads)
        line = evidence.summary()
        if self._log_dir is not None:
            self._stuck_count += 1
            path = self._log_dir / f"stuck-{self._stuck_count}.txt"
            try:
                with os.fdopen(open_nofollow(path), "w") as out:
                    out.write(evidence.text())
                line += f" (evidence: {path})"
            except (MemqualError, OSError) as exc:
                line += f" (evidence not written: {exc})"
        log.info("the guest stopped answering: %s", line)
        return line

    def qemu_exited(self) -> bool:
        """Was QEMU started, and has it ended?"""
        return self._proc is not None and self._proc.poll() is not None

    def _exit_description(self) -> str:
        if self._proc is None or self._proc.poll() is None:
            return "still running"
        code = self._proc.returncode
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def qemu_output(self) -> str:
        """The end of what QEMU wrote on its stdout and stderr."""
        if self._sockdir is None:
            return ""
        path = self._sockdir / "qemu.stderr"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _console_tail(self, lines: int) -> str:
        try:
            text = self.console_log.read_text(errors="replace")
        except OSError:
            return ""
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        return "\n".join(tail)

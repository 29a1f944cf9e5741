"""memqual.host.core.machine.Machine against a fake QEMU (tests/support/fake_qemu.py): launch
failures, SSH deadlines, shutdown of a QEMU that ignores quit, death with
the parent, and the retry when the SSH port was taken.  No real QEMU and no
guest: every case runs in a second or two."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import TypeVar

import fake_qemu
import pytest
from fakes import FakeImage

from memqual.host.core import machine as machine_module
from memqual.host.core.errors import LaunchError, Timeout
from memqual.host.core.machine import Machine
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.qemu import MachineConfig


@pytest.fixture
def image(tmp_path: Path) -> FakeImage:
    return FakeImage.in_dir(tmp_path / "img")


def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> Path:
    fake = fake_qemu.install(tmp_path / "qemu", mode)
    monkeypatch.setenv("MEMQUAL_QEMU", str(fake))
    return fake


def wait_dead(pid: int, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not fake_qemu.alive(pid):
            return True
        time.sleep(0.02)  # polling /proc with a deadline
    return False


class NoSSHMachine(Machine):
    """A Machine that stops after QMP is up (the fake has no guest)."""

    def wait_ssh(self, started: float, first_command: list[str] | None = None, probe_banner: bool = True) -> None:
        self.boot_to_ssh_s = time.monotonic() - started


TCG = MachineConfig(accel="tcg", warm=False)  # no KVM probe, no snapshot


E = TypeVar("E", bound=Exception)


def failed_launch(vm: Machine, error: type[E], match: str | None = None) -> tuple[E, float]:
    """Launch ``vm``, which must fail with ``error``: the error, and the
    seconds until it came."""
    started = time.monotonic()
    with pytest.raises(error, match=match) as caught:
        vm.launch()
    return caught.value, time.monotonic() - started


def left_no_qemu(fake: Path) -> bool:
    """The one QEMU the fake started is gone (within 2 s)."""
    (pid,) = fake_qemu.pids(fake)
    return wait_dead(pid, 2)


def test_launch_failure_raises_launch_error_with_command_and_output(tmp_path, monkeypatch, image):
    fake = install(tmp_path, monkeypatch, "exit")
    vm = Machine(TCG, image=image, boot_timeout=20)
    error, elapsed = failed_launch(vm, LaunchError)
    # Noticed when QEMU exits, not when the QMP accept times out.
    assert elapsed < 5
    assert error.command[0] == str(fake)
    assert "-netdev" in error.command
    assert "fake failure for the test" in error.output
    assert "fake failure for the test" in str(error)  # the last line is in the message
    assert "exit status 1" in str(error)
    assert shlex_join_ok(error.details(), fake)
    assert not vm.is_running()


def shlex_join_ok(details: str, fake: Path) -> bool:
    """details() gives a command line a user can paste."""
    return f"command: {fake} " in details and "output (tail):" in details


def test_qemu_that_never_connects_fails_within_the_boot_deadline(tmp_path, monkeypatch, image):
    fake = install(tmp_path, monkeypatch, "hang")
    _, elapsed = failed_launch(Machine(TCG, image=image, boot_timeout=1.0), LaunchError, "did not come up")
    assert elapsed < 4
    assert left_no_qemu(fake)


def test_ssh_that_never_answers_times_out_and_leaves_nothing(tmp_path, monkeypatch, image):
    # The fake accepts on the SSH port but never sends a banner (slirp does
    # that while the guest is not listening).  The deadline leaves a loaded
    # host time to start the fake and connect QMP.
    fake = install(tmp_path, monkeypatch, "qmp")
    vm = Machine(TCG, image=image, boot_timeout=2.5)
    error, elapsed = failed_launch(vm, Timeout, "did not answer SSH within")
    # the deadline, plus one readiness poll (0.5 s), the vCPUs' reading
    # (five samples 0.2 s apart) and the shutdown
    assert 2.5 <= elapsed < 2.5 + 5
    assert left_no_qemu(fake), "QEMU survived a failed launch"
    # a QEMU that still runs is asked what its vCPUs do before it is ended,
    # and the error says what it answered
    commands = fake_qemu.qmp_commands(fake)
    assert commands[0] == "qmp_capabilities" and commands[-1] == "quit"
    assert set(commands[1:-1]) == {"human-monitor-command"}
    assert "; its vCPUs: " in str(error)
    assert not vm.is_running()


def test_shutdown_quits_politely_when_qemu_obeys(tmp_path, monkeypatch, image):
    fake = install(tmp_path, monkeypatch, "qmp")
    with NoSSHMachine(TCG, image=image, boot_timeout=10) as vm:
        assert vm.is_running()
        vm.qmp("query-status")
        process = vm._proc
    assert process is not None and process.returncode == 0  # exited by itself after quit
    assert fake_qemu.qmp_commands(fake) == ["qmp_capabilities", "query-status", "quit"]


def test_shutdown_kills_a_qemu_that_ignores_quit(tmp_path, monkeypatch, image):
    fake = install(tmp_path, monkeypatch, "ignore-quit")
    vm = NoSSHMachine(TCG, image=image, boot_timeout=10)
    vm.launch()
    process = vm._proc
    started = time.monotonic()
    vm.shutdown(timeout=0.5)
    assert time.monotonic() - started < 3
    assert process is not None and process.returncode == -signal.SIGKILL
    assert fake_qemu.qmp_commands(fake)[-1] == "quit"  # it was asked first
    vm.shutdown()  # idempotent


def test_sockets_live_in_a_short_private_directory_removed_at_shutdown(tmp_path, monkeypatch, image):
    install(tmp_path, monkeypatch, "qmp")
    vm = NoSSHMachine(TCG, image=image, boot_timeout=10)
    vm.launch()
    qmp_arg = next(a for a in vm.command if a.startswith("socket,id=qmp,"))
    qmp_path = Path(qmp_arg.split("path=", 1)[1])
    assert len(str(qmp_path).encode()) < 108  # AF_UNIX limit
    assert qmp_path.parent.stat().st_mode & 0o077 == 0
    vm.shutdown()
    assert not qmp_path.parent.exists()


def test_port_taken_between_choice_and_bind_is_retried(tmp_path, monkeypatch, image):
    fake = install(tmp_path, monkeypatch, "qmp")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        ports = iter([busy, machine_module.free_port()])
        monkeypatch.setattr(machine_module, "free_port", lambda: next(ports))
        with NoSSHMachine(TCG, image=image, boot_timeout=10) as vm:
            assert vm.ssh_port != busy
            assert vm.is_running()
    calls = fake_qemu.invocations(fake)
    assert len(calls) == 2
    assert f"hostfwd=tcp:127.0.0.1:{busy}-:22" in " ".join(calls[0])
    first, second = fake_qemu.pids(fake)
    assert not fake_qemu.alive(first) and wait_dead(second, 2)


def test_free_port_is_bindable_and_never_fixed():
    ports = {machine_module.free_port() for _ in range(5)}
    assert len(ports) > 1
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_qemu_dies_with_its_parent_process(tmp_path, image):
    """PR_SET_PDEATHSIG: kill -9 the Python process that launched QEMU
    (what an Avocado timeout does) and QEMU goes too."""
    fake = fake_qemu.install(tmp_path / "qemu", "qmp")
    child = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from memqual.host.core.machine import Machine
        from memqual.host.core.qemu import MachineConfig
        class Image:
            kernel = initrd = key = Path({str(image.kernel)!r})
        Machine(MachineConfig(accel="tcg", warm=False), image=Image(), boot_timeout=120).launch()
        """
    )
    # The killed parent cannot remove its socket directory: keep it in ours.
    sockets = Path(tempfile.mkdtemp(prefix="mqt-", dir="/tmp"))
    env = {**os.environ, "MEMQUAL_QEMU": str(fake), "MEMQUAL_SOCKET_DIR": str(sockets)}
    parent = subprocess.Popen(
        [sys.executable, "-c", child], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        qmp_log = fake_qemu.state_dir(fake) / "qmp.log"
        deadline = time.monotonic() + 10
        while not qmp_log.exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # until QEMU is up and talking QMP
        assert qmp_log.exists(), "the fake QEMU never came up"
        (pid,) = fake_qemu.pids(fake)
        assert fake_qemu.alive(pid)
    finally:
        parent.kill()
        parent.wait()
    assert wait_dead(pid, 3), "QEMU outlived the process that launched it"
    shutil.rmtree(sockets, ignore_errors=True)


def test_a_second_launch_is_refused_not_a_second_qemu(tmp_path, monkeypatch, image):
    from memqual.host.core.errors import GuestError

    fake = install(tmp_path, monkeypatch, "qmp")
    with NoSSHMachine(TCG, image=image, boot_timeout=10) as vm:
        with pytest.raises(GuestError, match="running machine"):
            vm.launch()  # the with statement already launched it
        assert len(fake_qemu.pids(fake)) == 1
        assert vm.is_running()


@pytest.mark.parametrize(
    ("clock_label", "names"),
    [
        # A QEMU that works (as a booting guest's TCG does) spends its CPU
        # time: on icount the boot ends when it has spent the timeout's
        # (its wall-clock cap, for a QEMU that idles: test_boot_deadline.py).
        ("icount:4", "within 3 s of QEMU's CPU time"),
        # On the wall clock the timeout is wall time, however busy QEMU is.
        ("wall", "within 3 s (accel"),
    ],
)
def test_on_icount_the_boot_deadline_counts_qemu_s_cpu_time(tmp_path, monkeypatch, image, clock_label, names):
    fake = install(tmp_path, monkeypatch, "spin")
    monkeypatch.setenv("MEMQUAL_CLOCK", clock_label)
    # One vCPU: this fake QEMU's version runs no more on icount.  3 s: the
    # fake's own start (a Python interpreter) and its QMP take their share
    # of the same deadline, over 2 s at load 3 on 2 cores.
    vm = Machine(MachineConfig(accel="tcg", warm=False, cpus=1), image=image, boot_timeout=3.0)
    error, elapsed = failed_launch(vm, Timeout, "did not answer SSH within")
    assert names in str(error)
    assert elapsed < 3 * 3.0 + 3  # never past the cap, the readiness polls and the shutdown
    assert left_no_qemu(fake)

"""The unit tests' stand-ins for a guest, its shell, its image and its QEMU
monitor, in one place.  Each fake satisfies the Protocol of the host code
it stands for (host/core/shell.py's Shell and Background, the QmpMachine of
host/balloon/device.py and host/virtio_mem.py, the KsmHost and Guest of
host/ksm/scenarios.py); mypy checks that at the
end of this file.  What a fake says is scripted by the test that uses it;
nothing here starts a process or opens a socket."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from memqual.host.core.clock import WALL_CLOCK
from memqual.host.core.errors import GuestError
from memqual.host.core.kernelspec import KernelSpec
from memqual.host.core.nested import HostUnderTest
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.ssh import CommandResult
from memqual.host.ksm.procfs import ProcessKsm
from memqual.host.ksm.sysfs import KsmCounters

MIB = 1 << 20


class FakeClock:
    """A monotonic clock that moves only when slept on (or told to)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


# ---------------------------------------------------------------- the shell


class FakeBackground:
    """A guest command in the background (shell.Background) that prints
    ``lines`` and exits ``status``; with ``gate``, it holds its third line
    back until the gate opens."""

    def __init__(self, lines: list[str], status: int = 0, gate: threading.Event | None = None) -> None:
        self._lines, self.status, self._gate = lines, status, gate
        self.killed = self.waited = False

    def lines(self, timeout: float = 0) -> Iterator[str]:
        for index, line in enumerate(self._lines):
            if self._gate is not None and index == 2:
                self._gate.wait(5)
            yield line

    def wait(self, timeout: float = 0) -> CommandResult:
        self.waited = True
        return CommandResult([], self.status, "".join(line + "\n" for line in self._lines), "", 0.0)

    def kill(self) -> None:
        self.killed = True


class FakeShell:
    """A guest shell (shell.Shell) whose background command is ``background``;
    what was started and run is kept, in order."""

    def __init__(self, background: FakeBackground) -> None:
        self.background = background
        self.started: list[list[str]] = []
        self.ran: list[list[str]] = []

    def start(self, argv: list[str]) -> FakeBackground:
        self.started.append(argv)
        return self.background

    def run(self, argv: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None) -> None:
        self.ran.append(argv)


class AgentShell:
    """A guest shell (shell.Shell) whose commands answer from ``answers``:
    the first key that starts the command's argv (its second word for an
    agent, ``["/tmp/balloon_agent", "stat"]`` is keyed ``"stat"``, else its
    first) gives the stdout; a list of stdouts is used in turn, its last one
    repeating.  What ran is kept in ``ran``."""

    def __init__(self, answers: dict[str, str | list[str]], background: FakeBackground | None = None) -> None:
        self.answers = {k: list(v) if isinstance(v, list) else [v] for k, v in answers.items()}
        self.background = background or FakeBackground([])
        self.ran: list[list[str]] = []

    def start(self, argv: list[str]) -> FakeBackground:
        self.ran.append(argv)
        return self.background

    def run(
        self, argv: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None
    ) -> CommandResult:
        self.ran.append(argv)
        key = argv[1] if argv[0].startswith("/tmp/") and len(argv) > 1 else argv[0]
        outputs = self.answers.get(key, [""])
        stdout = outputs.pop(0) if len(outputs) > 1 else outputs[0]
        return CommandResult(argv, 0, stdout, "", 0.0)


# ---------------------------------------------------------------- the image


@dataclasses.dataclass(frozen=True)
class FakeImage:
    """What Machine, the KVM probe and the snapshots read of a guest image
    (images.build.Image); its files are never booted."""

    directory: Path
    kernel: Path
    initrd: Path
    key: Path  # the client key; the guest's host key beside it
    kernel_sha256: str = "k" * 64
    initramfs_sha256: str = "i" * 64

    @classmethod
    def in_dir(cls, directory: Path) -> FakeImage:
        """An image's files in ``directory``: an empty kernel and initrd, a
        client key and a host key."""
        keys = directory / "ssh"
        keys.mkdir(parents=True, exist_ok=True)
        (directory / "kernel").write_bytes(b"")
        (directory / "initrd").write_bytes(b"")
        (keys / "id_ed25519").write_text("client key 1")
        (keys / "host_key.pub").write_text("ssh-ed25519 AAAA1")
        return cls(directory, directory / "kernel", directory / "initrd", keys / "id_ed25519")


# ---------------------------------------------------------------- QMP


class FakeQmp:
    """A QEMU monitor: every command is kept in ``sent`` and answered by
    ``answer`` (a subclass's model of the device); no HMP."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def qmp(self, command: str, **arguments: Any) -> Any:
        self.sent.append((command, arguments))
        return self.answer(command, arguments)

    def answer(self, command: str, arguments: dict[str, Any]) -> Any:
        return {}

    def hmp(self, command_line: str) -> str:
        raise AssertionError(f"HMP is not used here: {command_line}")


class RefusingQmp(FakeQmp):
    """Answers like QEMU, but refuses device_add at the addresses given,
    with QEMU's message."""

    def __init__(self, refuse: dict[int, str] | None = None) -> None:
        super().__init__()
        self.refuse = refuse or {}

    def answer(self, command: str, arguments: dict[str, Any]) -> Any:
        if command == "device_add" and arguments["addr"] in self.refuse:
            raise GuestError(f"QMP device_add failed: {self.refuse[arguments['addr']]}")
        return {}


class PmemQmp(FakeQmp):
    """pmemsave like QEMU: writes the guest page it holds for a frame
    (``pages``: frame number -> 4 KiB), zeros for any other."""

    def __init__(self, pages: dict[int, bytes]) -> None:
        super().__init__()
        self.pages = pages

    def answer(self, command: str, arguments: dict[str, Any]) -> Any:
        assert command == "pmemsave" and arguments["size"] == 4096
        Path(arguments["filename"]).write_bytes(self.pages.get(arguments["val"] // 4096, bytes(4096)))
        return {}


class VirtioMemQmp(FakeQmp):
    """QOM's virtio-mem: ``size`` follows ``requested-size`` by ``step``
    bytes a poll, never below ``floor`` (memory the guest cannot give)."""

    def __init__(self, step: int, floor: int = 0) -> None:
        super().__init__()
        self.size = 0
        self.requested = 0
        self.step = step
        self.floor = floor

    def answer(self, command: str, arguments: dict[str, Any]) -> Any:
        if command == "qom-set":
            self.requested = int(arguments["value"])
            return {}
        if command == "qom-get" and arguments["property"] == "memaddr":
            return 1 << 32
        assert command == "qom-get" and arguments["property"] == "size"
        target = max(self.requested, self.floor)
        if self.size < target:
            self.size = min(target, self.size + self.step)
        elif self.size > target:
            self.size = max(target, self.size - self.step)
        return self.size


@dataclasses.dataclass
class FakeVirtioMemGuest:
    """A booted guest as host/virtio_mem.py's procedures see it (its Guest):
    QMP from ``machine``, a shell ``ssh``, and a flat view in which the
    device's plugged memory is one 1 GiB memslot per started GiB."""

    machine: VirtioMemQmp
    ssh: AgentShell
    memdev: str = "vmem0"

    def qmp(self, command: str, **arguments: Any) -> Any:
        return self.machine.qmp(command, **arguments)

    def hmp(self, command_line: str) -> str:
        assert command_line == "info mtree -f"
        lines = ["FlatView #0", ' AS "memory", root: system', " Root memory region: system"]
        lines.append("  0000000000000000-000000001fffffff (prio 0, ram): pc.ram")
        plugged, base = self.machine.size, 1 << 32
        for start in range(0, plugged, 1 << 30):
            end = base + min(plugged, start + (1 << 30)) - 1
            lines.append(f"  {base + start:016x}-{end:016x} (prio 0, ram): {self.memdev} @{start:016x}")
        return "\n".join(lines) + "\n"


class BalloonQmp(FakeQmp):
    """Answers QMP like QEMU 7.2 does for a guest of ``ram`` bytes with a
    virtio-balloon (unless ``balloon`` is False); query-balloon walks a
    canned sequence of actual values (the last one repeats forever).
    Each command costs the clock a QMP round trip."""

    def __init__(self, actuals: list[int], clock: FakeClock, balloon: bool = True, ram: int = 1024 * MIB) -> None:
        super().__init__()
        self.actuals = list(actuals)
        self.clock = clock
        self.balloon = balloon
        self.ram = ram
        self.interval = 0
        self.stats_updates = 0
        # target -> actual sequences, one per command with that target (the last repeats)
        self.after_balloon: dict[int, list[list[int]]] = {}

    def answer(self, command: str, arguments: dict[str, Any]) -> Any:
        self.clock.t += 0.0002  # a QMP round trip
        if command == "query-memory-size-summary":
            return {"base-memory": self.ram, "plugged-memory": 0}
        if command in ("balloon", "query-balloon"):
            return self.balloon_answer(command, arguments)
        if command == "qom-list":
            return self.qom_list(arguments["path"])
        if command == "device_del":
            self.balloon = False
            return {}
        if command == "device_add":
            self.balloon = True
            return {}
        if command in ("qom-set", "qom-get"):
            return self.stats_property(command, arguments)
        raise AssertionError(f"unexpected QMP command {command}")

    def balloon_answer(self, command: str, arguments: dict[str, Any]) -> Any:
        """``balloon`` (a target, which may start its own sequence of
        actuals) and ``query-balloon`` (the next actual)."""
        if not self.balloon:
            raise GuestError("No balloon device has been activated")
        if command == "query-balloon":
            value = self.actuals.pop(0) if len(self.actuals) > 1 else self.actuals[0]
            return {"actual": value}
        if arguments["value"] <= 0:
            raise GuestError("Parameter 'target' expects a size")
        seqs = self.after_balloon.get(arguments["value"])
        if seqs:
            self.actuals = list(seqs.pop(0) if len(seqs) > 1 else seqs[0])
        return {}

    def qom_list(self, path: str) -> list[dict[str, str]]:
        if path == "/machine/peripheral":
            return [{"name": "balloon0", "type": "child<virtio-balloon-pci>"}]
        if path == "/machine/peripheral/balloon0":
            return [
                {"name": "guest-stats", "type": "guest statistics"},
                {"name": "guest-stats-polling-interval", "type": "int"},
            ]
        raise GuestError(f"Device '{path}' not found")

    def stats_property(self, command: str, arguments: dict[str, Any]) -> Any:
        """qom-set of the stats polling interval; qom-get of it or of the
        guest's stats (a fresh update every third read)."""
        if command == "qom-set":
            assert arguments["property"] == "guest-stats-polling-interval"
            if arguments["value"] < 0:
                raise GuestError("timer value must be greater than zero")
            self.interval = arguments["value"]
            return {}
        if arguments["property"] == "guest-stats-polling-interval":
            return self.interval
        self.stats_updates += 1
        updated = 1000 + self.stats_updates // 3  # a fresh update every third read
        return {"stats": {"stat-free-memory": 5 * MIB, "stat-swap-in": -1}, "last-update": updated}


@dataclasses.dataclass
class FakeBalloonGuest:
    """A booted guest as the balloon scenarios see it (balloon.scenarios.Guest):
    its QMP is ``machine``'s, its shell ``ssh``."""

    machine: BalloonQmp
    ssh: AgentShell

    @property
    def pid(self) -> int:
        return self.machine.pid

    def qmp(self, command: str, **arguments: Any) -> Any:
        return self.machine.qmp(command, **arguments)


# ---------------------------------------------------------------- a machine


class FakeMachine(FakeQmp):
    """What the warm start (host/core/snapshot.py) uses of a Machine, scripted:
    QMP's stop/cont/migrate/query-migrate/query-status, the steps of a
    start, and ``calls`` listing commands and steps in order."""

    def __init__(
        self,
        tmp_path: Path,
        migrate_status: str = "completed",
        restore_error: Exception | None = None,
        qemu_output: str = "",
    ) -> None:
        super().__init__()
        self.config = MachineConfig()
        self.accel = "tcg"
        self.clock = WALL_CLOCK
        self.image = FakeImage.in_dir(tmp_path / "img")
        self.migrate_status = migrate_status
        self.restore_error = restore_error
        self.output = qemu_output
        self.calls: list[str] = []
        self.boot_to_ssh_s = 2.0
        self.started_warm = False
        self.ssh: Any = SimpleNamespace(close=lambda: None)
        self.running = True
        # A host under test (``under_host``): its steps around a save and a
        # restore are listed in ``calls``; on this machine they do nothing.
        self.host: Any = None
        self.host_image: Any = None
        self.host_accel = ""
        self.resume_error: Exception | None = None
        self.restored = False  # the last start was a restore

    def under_host(self, tmp_path: Path, resume_error: Exception | None = None) -> FakeMachine:
        """This guest under a host under test (L1 from ``tmp_path``'s image);
        ``resume_error``: what reaching its restored guest's monitor raises."""
        self.host = HostUnderTest(KernelSpec("6.1.0-57-amd64"))
        self.host_image = SimpleNamespace(
            directory=tmp_path / "l1", initrd_sha256="r" * 64, key=FakeImage.in_dir(tmp_path / "l1").key
        )
        self.host_accel = "tcg"
        self.resume_error = resume_error
        return self

    def pause_nested_guest(self) -> None:
        if self.host is not None:
            self.calls.append("pause_nested")

    def resume_nested_guest(self) -> None:
        if self.host is not None:
            self.calls.append("resume_nested")
            if self.resume_error is not None and self.restored:
                raise self.resume_error

    @property
    def ssh_ready(self) -> bool:
        return self.ssh is not None

    def close_ssh(self) -> None:
        self.ssh = None

    def qemu_exited(self) -> bool:
        return False

    def answer(self, command: str, arguments: dict[str, Any]) -> Any:
        self.calls.append(command)
        if command == "stop":
            self.running = False
        elif command == "cont":
            self.running = True
        elif command == "migrate":
            path = arguments["uri"].split("> ", 1)[1].strip("'")
            if self.migrate_status == "completed":
                Path(path).write_bytes(b"state" * 10)
        elif command == "query-migrate":
            return {"status": self.migrate_status, "error-desc": "disk full"}
        elif command == "query-status":
            return {"running": self.running, "status": "running" if self.running else "paused"}
        return {}

    def wait_ssh(self, started: float, first_command: Any = None, probe_banner: bool = True) -> None:
        self.calls.append("wait_ssh")
        if first_command is not None and self.restore_error is not None:
            raise self.restore_error
        self.ssh = SimpleNamespace(close=lambda: None)  # what Machine.wait_ssh leaves

    def start_qemu(self, incoming: str | None = None) -> None:
        self.calls.append(f"start:{'incoming' if incoming else 'cold'}")
        self.running = True
        self.restored = incoming is not None

    def boot_cold(self) -> None:
        self.calls.append("cold")
        self.restored = False

    def kill_qemu(self) -> None:
        self.calls.append("kill")

    def qemu_output(self) -> str:
        return self.output


# ---------------------------------------------------------------- host KSM


class FakeKsmSysfs:
    """The KSM sysfs files the scenarios read, from their FakeKsmHost."""

    def __init__(self, host: FakeKsmHost, present: tuple[str, ...]) -> None:
        self.host, self.present = host, present

    def read_int(self, name: str) -> int:
        value = self.read_int_or_none(name)
        assert value is not None, name
        return value

    def read_int_or_none(self, name: str) -> int | None:
        if name == "full_scans":
            return self.host.full_scans
        return 0 if name in self.present else None

    def has(self, name: str) -> bool:
        return name == "full_scans" or name in self.present


class FakeKsmHost:
    """Host KSM (host/ksm/scenarios.py's KsmHost) on a script.  A full scan
    takes ``scan_s`` of the fake clock while run=1; ``merging(host, pid)``
    says a process's merged pages and ``sharing(host)`` the global
    (pages_shared, pages_sharing); run=2 unmerges everything.  ``sleep``
    and every wait move the clock; ksmd's CPU time is half of it."""

    def __init__(
        self,
        merging: Callable[[FakeKsmHost, int], int] = lambda host, pid: 0,
        sharing: Callable[[FakeKsmHost], tuple[int, int]] = lambda host: (0, 0),
        scan_s: float = 0.05,
        present: tuple[str, ...] = ("smart_scan", "pages_skipped"),
    ) -> None:
        self.merging, self.sharing, self.scan_s = merging, sharing, scan_s
        self.fs = FakeKsmSysfs(self, present)
        self.now = 0.0
        self.scanned_s = 0.0  # time spent with run=1
        self.run = 0
        self.guests = 0
        self.knobs: list[dict[str, int | str]] = []
        self.thp: list[dict[str, str]] = []

    @property
    def full_scans(self) -> int:
        return int(self.scanned_s / self.scan_s + 1e-9)

    def clock(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        self.now += dt
        if self.run == 1:
            self.scanned_s += dt

    def set(self, **knobs: int | str) -> None:
        self.knobs.append(knobs)
        self.run = int(knobs.get("run", self.run))

    def set_thp(self, **knobs: str) -> None:
        self.thp.append(knobs)

    def unmerge(self) -> None:
        self.set(run=2)

    def process(self, pid: int) -> ProcessKsm:
        merged = 0 if self.run == 2 else self.merging(self, pid)
        return ProcessKsm(pid, merged, {"ksm_rmap_items": str(merged)}, None)

    def counters(self) -> KsmCounters:
        shared, sharing = (0, 0) if self.run == 2 else self.sharing(self)
        return KsmCounters(self.now, self.full_scans, shared, sharing, 0, 0, None, None, None, self.now / 2)

    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]:
        return [self.wait_full_scans(1, timeout_s) for _ in range(scans)]

    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = 0.005) -> KsmCounters:
        self.sleep(n * self.scan_s)
        return self.counters()

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
        while not predicate():
            self.sleep(self.scan_s)
            assert self.now < 1e4, what


@dataclasses.dataclass
class FakeGuest:
    """A booted guest as the KSM scenarios see it (scenarios.Guest)."""

    pid: int
    ssh: Any = None
    started_warm: bool = True
    boot_to_ssh_s: float = 0.5
    qmp_log: list[str] = dataclasses.field(default_factory=list)

    @property
    def running(self) -> bool:
        """Not stopped by QMP's ``stop`` since its last ``cont``."""
        return not self.qmp_log or self.qmp_log[-1] != "stop"

    def deploy(self, agent: str) -> str:
        return f"/tmp/{agent}"

    def qmp(self, command: str, **arguments: Any) -> Any:
        self.qmp_log.append(command)
        return {}


if TYPE_CHECKING:
    # mypy: each fake is what it stands for.
    from memqual.host import virtio_mem
    from memqual.host.balloon import device as balloon_device
    from memqual.host.balloon import scenarios as balloon_scenarios
    from memqual.host.core import shell
    from memqual.host.fault import anon
    from memqual.host.ksm import scenarios, sharing

    _shell: shell.Shell = FakeShell(FakeBackground([]))
    _agent_shell: shell.Shell = AgentShell({})
    _balloon_guest: balloon_scenarios.Guest = FakeBalloonGuest(BalloonQmp([0], FakeClock()), AgentShell({}))
    _background: shell.Background = FakeBackground([])
    _balloon: balloon_device.QmpMachine = BalloonQmp([0], FakeClock())
    _virtio_mem: virtio_mem.QmpMachine = VirtioMemQmp(1)
    _virtio_mem_guest: virtio_mem.Guest = FakeVirtioMemGuest(VirtioMemQmp(1), AgentShell({}))
    _monitor: virtio_mem.QmpMachine = RefusingQmp()
    _ksm: scenarios.KsmHost = FakeKsmHost()
    _fault_guest: anon.Guest = FakeGuest(1, AgentShell({}))
    _guest: scenarios.Guest = FakeGuest(1)
    _pausable: sharing.PausableGuest = FakeGuest(1)

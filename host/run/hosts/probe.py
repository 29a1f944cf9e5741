"""What a lab host says about itself: ``memqual hosts probe``, run on the
host over SSH at the start of every fleet run and by ``memqual hosts check``.

It is also where a host cleans up after a lost connection: a QEMU that
memqual started and whose parent is gone (its runner died with the SSH
session and the QEMU somehow outlived it) is ended here, and the task
directory such a task left is removed, as the KSM and THP knobs a killed
run left are restored by every memqual start.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from memqual.host.core import locks
from memqual.host.core import probe as host_probe
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.knobs import default_state_dir
from memqual.host.core.paths import cache_dir
from memqual.host.core.polling import poll
from memqual.host.core.qemu_binary import choose

SCHEMA = "memqual.hostprobe/1"
QEMU_EXIT_WAIT_S = 5.0
STALE_TASK_S = 2 * 1200.0  # twice the spawner's limit for one task (host/run/hosts/fleet.py TASK_TIMEOUT_S)
# A run's status channel directory lives as long as its job: twice the
# job's limit (host/run/hosts/fleet.py JOB_TIMEOUT_S).
STALE_STATUS_S = 2 * 12 * 3600.0


@dataclasses.dataclass(frozen=True)
class HostProbe:
    """A lab host's answer."""

    version: str  # memqual's version there
    boot_id: str  # the running kernel's boot id: equal on two "hosts" that share one kernel
    environment: dict[str, Any]  # memqual.host.core.environment.Environment.to_json() of the host
    lock_path: str
    lock_free: bool  # no other memqual holds the host's measurement lock
    lock_holder: int | None
    cleaned_qemu: tuple[int, ...] = ()  # pids of QEMUs left behind, ended now
    # Asked for a QEMU (``--qemu``): its binary there, which the host's tasks
    # run, or why the host cannot have it ("" when it can, or none was asked).
    qemu_binary: str = ""
    qemu_problem: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **dataclasses.asdict(self), "cleaned_qemu": list(self.cleaned_qemu)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostProbe:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} answer")
        return cls(
            version=str(data["version"]),
            boot_id=str(data["boot_id"]),
            environment=dict(data.get("environment") or {}),
            lock_path=str(data.get("lock_path", "")),
            lock_free=bool(data["lock_free"]),
            lock_holder=data.get("lock_holder"),
            cleaned_qemu=tuple(int(p) for p in data.get("cleaned_qemu") or ()),
            qemu_binary=str(data.get("qemu_binary") or ""),
            qemu_problem=str(data.get("qemu_problem") or ""),
        )


def memqual_version() -> str:
    try:
        return version("memqual")
    except PackageNotFoundError:
        return "unknown"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def measure_lock_path() -> Path:
    """Where the tests' host-wide measurement lock lives (e2e/base.py's
    MeasurementLock): the state directory, or the cache when that cannot be
    written."""
    state = default_state_dir()
    if state.is_dir() and os.access(state, os.W_OK):
        return state / "measure.lock"
    return cache_dir() / "measure.lock"


def lock_state(path: Path) -> tuple[bool, int | None]:
    """(free, holder pid): a non-blocking try of the lock, let go at once.
    Exclusive: a test that measures nothing holds the lock shared, and a
    host running any memqual test is busy."""
    if locks.is_free(path) is not False:
        return True, None
    return False, locks.holder(path)


def orphaned_qemus(marker: str, proc: Path = Path("/proc")) -> list[int]:
    """QEMUs of this user whose parent is gone (adopted by init) and whose
    command line names ``marker`` (memqual's cache directory, where every
    guest image of memqual's lives)."""
    found = []
    uid = os.getuid()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if not argv or not os.path.basename(argv[0].decode(errors="replace")).startswith("qemu-system"):
            continue
        # The parent pid is the 2nd field after the command name in parentheses.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == 1 and any(marker.encode() in arg for arg in argv):
            found.append(int(entry.name))
    return found


def end_processes(pids: list[int], wait_s: float = QEMU_EXIT_WAIT_S) -> list[int]:
    """SIGTERM, then SIGKILL what is left after ``wait_s``; the pids ended."""
    ended = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            ended.append(pid)
        except ProcessLookupError:
            pass
    poll(lambda: not any(_alive(pid) for pid in ended), wait_s, 0.05, what="the QEMUs' end", raise_on_timeout=False)
    for pid in ended:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return ended


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_task_dirs(
    now: float, max_age_s: float = STALE_TASK_S, tmp: Path = Path("/tmp"), pattern: str = "memqual-task.*"
) -> list[Path]:
    """Task directories (the spawner's ``mktemp -d /tmp/memqual-task.*``)
    that no task can still be using: the task of a lost connection never
    came back to remove its own.  A task ends within the spawner's timeout,
    so a directory untouched for twice that is stale.  The same for a
    run's status channel directories (``memqual-status.*``) with the job's
    timeout."""
    stale = []
    uid = os.getuid()
    for path in tmp.glob(pattern):
        try:
            st = path.lstat()
            newest = max([st.st_mtime, *(p.lstat().st_mtime for p in path.iterdir())])
        except OSError:
            continue
        if st.st_uid == uid and path.is_dir() and not path.is_symlink() and now - newest > max_age_s:
            stale.append(path)
    return stale


def probe(qemu: str | None = None) -> HostProbe:
    """This host's answer.  ``qemu`` (a version of Debian's archive or a
    path here): that QEMU is made this process's first, so the environment
    describes it; a version is fetched from this host's own apt mirror into
    its own cache, checked against this host's signed lists (nothing
    executable comes from the controller).  A QEMU the host cannot have is
    an answer (``qemu_problem``), not a failed probe."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built

    binary, problem = "", ""
    if qemu:
        try:
            binary = str(choose(qemu).binary)
        except (BadInput, CapabilityMissing) as exc:
            problem = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__

    cleaned = end_processes(orphaned_qemus(str(cache_dir())))
    now = time.time()
    for path in stale_task_dirs(now) + stale_task_dirs(now, STALE_STATUS_S, pattern="memqual-status.*"):
        shutil.rmtree(path, ignore_errors=True)
    lock = measure_lock_path()
    free, holder = lock_state(lock)
    return HostProbe(
        version=memqual_version(),
        boot_id=boot_id(),
        environment=host_probe.environment().to_json(),
        lock_path=str(lock),
        lock_free=free,
        lock_holder=holder,
        cleaned_qemu=tuple(cleaned),
        qemu_binary=binary,
        qemu_problem=problem,
    )

"""Host-wide KSM state: a lock so one memqual run at a time drives KSM, and
a state file holding the knobs as they were before the first change.

Files, in a root-owned directory (``/run/memqual`` by default,
``$MEMQUAL_STATE_DIR`` or the constructor override it):

- ``ksm.lock``: held with fcntl.flock(LOCK_EX) for as long as a run drives
  KSM.  The kernel drops a flock when its holder dies, even by SIGKILL, so a
  lock is never stale.  The holder writes its pid into the file for messages.
- ``ksm-state.json``: written (atomically, fsync'd) before the first knob
  changes, deleted after the knobs are put back.  Its owner removes it
  before releasing the lock, so whoever takes the lock and still finds the
  file knows its owner died mid-run: it restores first (``restore_stale``).

/run is a tmpfs: a reboot clears the state file, and a reboot also resets
the knobs to the kernel's defaults, so nothing is lost.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from host.errors import CapabilityMissing, MemqualError
from host.ksm import procfs
from host.ksm.sysfs import KSM_ROOT, THP_KNOBS, THP_ROOT, Sysfs, write_order

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/run/memqual")
STATE_SCHEMA = "memqual.ksm-state/1"


def default_state_dir() -> Path:
    override = os.environ.get("MEMQUAL_STATE_DIR")
    return Path(override) if override else DEFAULT_STATE_DIR


@dataclasses.dataclass
class Snapshot:
    """The knobs before memqual touched them, and who took the snapshot."""

    pid: int
    pid_start: int | None
    taken: str
    ksm_root: str
    ksm: dict[str, str]
    thp_root: str
    thp: dict[str, str] | None = None  # only once a scenario touches THP

    def to_json(self) -> dict[str, Any]:
        return {"schema": STATE_SCHEMA, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> "Snapshot":
        if data.get("schema") != STATE_SCHEMA:
            raise MemqualError(f"{source}: not a memqual KSM state file (schema {data.get('schema')!r})")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


class RestoreFailed(MemqualError):
    """Some knobs could not be put back; the state file stays for a retry."""


def restore_knobs(fs: Sysfs, saved: dict[str, str]) -> list[str]:
    """Write back every saved knob whose value differs now; return the names
    written.  ksmd is stopped first when it runs and should not, so the
    other knobs change while it is idle; run itself is written last."""
    current = fs.knobs(list(saved))
    changed = [n for n, v in saved.items() if n in current and current[n] != v]
    if not changed:
        return []
    failures: list[str] = []
    if "run" in changed and current.get("run") == "1":
        _try_write(fs, "run", "0", failures)
    for name in write_order(changed):
        _try_write(fs, name, saved[name], failures)
    if failures:
        raise RestoreFailed(f"could not restore {fs.root}: " + "; ".join(failures))
    return changed


def _try_write(fs: Sysfs, name: str, value: str, failures: list[str]) -> None:
    try:
        fs.write(name, value)
    except OSError as exc:
        failures.append(f"{name}={value}: {exc.strerror or exc}")


class HostState:
    """The lock and the state file.  Not reentrant: one holder per object."""

    def __init__(
        self,
        state_dir: Path | None = None,
        ksm_root: Path = KSM_ROOT,
        thp_root: Path = THP_ROOT,
        proc_root: Path = procfs.PROC_ROOT,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.lock_path = self.state_dir / "ksm.lock"
        self.state_path = self.state_dir / "ksm-state.json"
        self.ksm = Sysfs(ksm_root)
        self.thp = Sysfs(thp_root)
        self.proc_root = proc_root
        self._lock_fd: int | None = None

    # -- the lock ---------------------------------------------------------
    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    def _open_lock(self) -> int:
        try:
            self.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CapabilityMissing(
                f"host KSM: cannot use the state directory {self.state_dir} ({exc.strerror}); "
                "run as root or set MEMQUAL_STATE_DIR to a root-owned directory"
            ) from exc

    def try_lock(self) -> bool:
        """Take the lock if it is free; True when held."""
        if self._lock_fd is not None:
            return True
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        return True

    def lock(self, timeout_s: float, poll_s: float = 0.05) -> None:
        """Wait up to timeout_s for the lock; CapabilityMissing naming the
        holder when it stays taken (the scenario then skips)."""
        deadline = time.monotonic() + timeout_s
        while not self.try_lock():
            if time.monotonic() >= deadline:
                raise CapabilityMissing(
                    f"host KSM is driven by another memqual run (pid {self.holder() or '?'}, "
                    f"lock {self.lock_path}); waited {timeout_s:.0f} s"
                )
            time.sleep(poll_s)

    def unlock(self) -> None:
        if self._lock_fd is None:
            return
        fd, self._lock_fd = self._lock_fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing drops the flock

    def holder(self) -> int | None:
        """The pid written by the lock's current (or last) holder."""
        try:
            text = self.lock_path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    # -- the state file ---------------------------------------------------
    def load(self) -> Snapshot | None:
        try:
            data = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as exc:
            # A torn write is impossible (rename), but a hand-edited file is
            # not: say so instead of guessing.
            raise MemqualError(
                f"{self.state_path}: not JSON ({exc.msg}); compare it with the kernel defaults and delete it"
            ) from exc
        return Snapshot.from_json(data, str(self.state_path))

    def save(self, snapshot: Snapshot) -> None:
        """Atomic and durable: a crash leaves the old file or the new one."""
        self._require_lock()
        tmp = self.state_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(snapshot.to_json(), indent=2, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.state_path)
        dir_fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def new_snapshot(self, with_thp: bool = False) -> Snapshot:
        return Snapshot(
            pid=os.getpid(),
            pid_start=procfs.start_time(os.getpid(), self.proc_root),
            taken=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            ksm_root=str(self.ksm.root),
            ksm=self.ksm.knobs(),
            thp_root=str(self.thp.root),
            thp=self.thp.knobs(THP_KNOBS) if with_thp else None,
        )

    def restore(self, snapshot: Snapshot) -> list[str]:
        """Put the snapshot's knobs back, then delete the state file.  On a
        failure the file stays, so the next start tries again."""
        self._require_lock()
        written = [f"ksm/{n}" for n in restore_knobs(Sysfs(Path(snapshot.ksm_root)), snapshot.ksm)]
        if snapshot.thp:
            written += [f"thp/{n}" for n in restore_knobs(Sysfs(Path(snapshot.thp_root)), snapshot.thp)]
        self.state_path.unlink(missing_ok=True)
        return written

    def owner_alive(self, snapshot: Snapshot) -> bool:
        start = procfs.start_time(snapshot.pid, self.proc_root)
        return start is not None and (snapshot.pid_start is None or start == snapshot.pid_start)

    def _require_lock(self) -> None:
        if self._lock_fd is None:
            raise RuntimeError("HostState: take the lock before touching the state file")


@dataclasses.dataclass(frozen=True)
class StaleRestore:
    """What restore_stale did: the dead owner and the knobs written back."""

    owner_pid: int
    owner_alive: bool
    taken: str
    written: list[str]

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        knobs = ", ".join(self.written) or "none differed"
        who = "still running (pid reused?)" if self.owner_alive else "gone"
        return f"restored host KSM knobs left by memqual pid {self.owner_pid} ({who}, snapshot {self.taken}): {knobs}"


def restore_stale(
    state_dir: Path | None = None,
    ksm_root: Path = KSM_ROOT,
    thp_root: Path = THP_ROOT,
    proc_root: Path = procfs.PROC_ROOT,
    lock_timeout_s: float = 0.0,
) -> StaleRestore | None:
    """Put back the knobs a dead memqual run left changed.

    Call it at start (CLI, test session).  Cheap and quiet when there is
    nothing to do: no state dir, no state file, or the lock is held by a live
    run (that run restores on its own exit).  The lock is taken only while
    restoring.  Raises RestoreFailed when knobs cannot be written back."""
    state = HostState(state_dir, ksm_root, thp_root, proc_root)
    if not state.state_path.exists():
        return None
    try:
        if lock_timeout_s > 0:
            state.lock(lock_timeout_s)
        elif not state.try_lock():
            log.info("host KSM state %s belongs to a live run (pid %s)", state.state_path, state.holder())
            return None
    except CapabilityMissing as exc:
        log.info("%s", exc)
        return None
    try:
        return _restore_locked(state)
    finally:
        state.unlock()


def _restore_locked(state: HostState) -> StaleRestore | None:
    """With the lock held: any state file left is stale, since an owner
    deletes it before it lets go of the lock."""
    snapshot = state.load()
    if snapshot is None:
        return None
    alive = state.owner_alive(snapshot) and snapshot.pid != os.getpid()
    written = state.restore(snapshot)
    result = StaleRestore(snapshot.pid, alive, snapshot.taken, written)
    log.warning("%s", result.describe())
    return result

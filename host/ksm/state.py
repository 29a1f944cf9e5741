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
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from memqual.host.core import settings
from memqual.host.core.environment import KSM_ROOT, THP_ROOT
from memqual.host.core.errors import BadInput, CapabilityMissing, MemqualError
from memqual.host.core.locks import FileLock
from memqual.host.core.paths import UntrustedDirectory, check_ancestors, check_trusted_stat
from memqual.host.core.polling import poll
from memqual.host.ksm import procfs
from memqual.host.ksm.sysfs import THP_KNOBS, Sysfs, write_order

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/run/memqual")
STATE_SCHEMA = "memqual.ksm-state/1"
# A knob is a plain sysfs attribute name: no separators, nothing relative.
_KNOB_NAME = re.compile(r"[a-z][a-z0-9_]*")


def default_state_dir() -> Path:
    return settings.state_dir() or DEFAULT_STATE_DIR


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
    def from_json(cls, data: dict[str, Any], source: str) -> Snapshot:
        if data.get("schema") != STATE_SCHEMA:
            raise MemqualError(f"{source}: not a memqual KSM state file (schema {data.get('schema')!r})")
        fields = {f.name for f in dataclasses.fields(cls)}
        try:
            snapshot = cls(**{k: v for k, v in data.items() if k in fields})
        except TypeError as exc:
            raise BadInput(
                f"{source}: incomplete memqual KSM state file ({exc}); check the knobs by hand and delete it"
            ) from exc
        for group in (snapshot.ksm, snapshot.thp or {}):
            if not isinstance(group, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and _KNOB_NAME.fullmatch(k) for k, v in group.items()
            ):
                raise BadInput(
                    f"{source}: knob names or values are not plain sysfs attributes; "
                    "check the knobs by hand and delete the file"
                )
        return snapshot


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
        self._lock = FileLock(self.lock_path, mode=0o644, holder_pid=True)

    # -- the lock ---------------------------------------------------------
    def check_dir(self) -> None:
        """The state directory must be the running user's and writable by
        nobody else: root writes back to sysfs what its files say."""
        try:
            st = os.stat(self.state_dir)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise BadInput(f"state directory {self.state_dir}: {exc.strerror or exc}") from exc
        check_trusted_stat(st, self.state_dir, "state directory")
        check_ancestors(self.state_dir, "state directory")

    def _prepare_dir(self) -> None:
        try:
            self.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise CapabilityMissing(
                f"host KSM: cannot use the state directory {self.state_dir} ({exc.strerror}); "
                "run as root or set MEMQUAL_STATE_DIR to a root-owned directory"
            ) from exc
        self.check_dir()

    def try_lock(self) -> bool:
        """Take the lock if it is free; True when held."""
        if self._lock.held:
            return True
        self._prepare_dir()
        try:
            return self._lock.try_take()
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UntrustedDirectory(f"{self.lock_path} is a symlink: refused; remove it") from exc
            raise CapabilityMissing(
                f"host KSM: cannot use the state directory {self.state_dir} ({exc.strerror}); "
                "run as root or set MEMQUAL_STATE_DIR to a root-owned directory"
            ) from exc

    def lock(self, timeout_s: float, poll_s: float = 0.05) -> None:
        """Wait up to timeout_s for the lock; CapabilityMissing naming the
        holder when it stays taken (the scenario then skips)."""
        poll(
            self.try_lock,
            timeout_s,
            poll_s,
            what="the host KSM lock",
            on_timeout=lambda _: CapabilityMissing(
                f"host KSM is driven by another memqual run (pid {self.holder() or '?'}, "
                f"lock {self.lock_path}); waited {timeout_s:.0f} s"
            ),
        )

    def unlock(self) -> None:
        self._lock.release()

    def holder(self) -> int | None:
        """The pid written by the lock's current (or last) holder."""
        return self._lock.holder()

    # -- the state file ---------------------------------------------------
    def load(self) -> Snapshot | None:
        self.check_dir()
        try:
            data = json.loads(_read_nofollow(self.state_path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BadInput(
                    f"{self.state_path} is a symlink: refused (memqual writes these files itself); remove it"
                ) from exc
            raise BadInput(f"{self.state_path}: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            # A torn write is impossible (rename), but a hand-edited file is
            # not: say so instead of guessing.
            raise MemqualError(
                f"{self.state_path}: not JSON ({exc}); compare it with the kernel defaults and delete it"
            ) from exc
        if not isinstance(data, dict):
            raise BadInput(f"{self.state_path}: not a memqual KSM state file; check the knobs by hand and delete it")
        return Snapshot.from_json(data, str(self.state_path))

    def save(self, snapshot: Snapshot) -> None:
        """Atomic and durable: a crash leaves the old file or the new one."""
        self._require_lock()
        # mkstemp: an unpredictable name created with O_EXCL, so never
        # through a symlink someone planted.
        fd, tmp = tempfile.mkstemp(prefix=".ksm-state.", dir=self.state_dir)
        try:
            try:
                os.write(fd, (json.dumps(snapshot.to_json(), indent=2, sort_keys=True) + "\n").encode())
                os.fchmod(fd, 0o644)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.state_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
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
        self._check_roots(snapshot)
        written = [f"ksm/{n}" for n in restore_knobs(self.ksm, snapshot.ksm)]
        if snapshot.thp:
            written += [f"thp/{n}" for n in restore_knobs(self.thp, snapshot.thp)]
        self.state_path.unlink(missing_ok=True)
        return written

    def _check_roots(self, snapshot: Snapshot) -> None:
        """Knobs are written back only under the sysfs roots this object
        was made for (the kernel's KSM and THP directories), whatever the
        file says, and only THP's known knobs."""
        roots = [("ksm_root", snapshot.ksm_root, self.ksm.root)]
        if snapshot.thp:
            roots.append(("thp_root", snapshot.thp_root, self.thp.root))
        for name, named, allowed in roots:
            if os.path.normpath(str(named)) != os.path.normpath(str(allowed)):
                raise BadInput(
                    f"{self.state_path}: {name} {named!r} is not {allowed}: refusing to write knobs there; "
                    "check the knobs by hand and delete the file"
                )
        unknown = sorted(set(snapshot.thp or {}) - set(THP_KNOBS))
        if unknown:
            raise BadInput(
                f"{self.state_path}: THP knobs {', '.join(unknown)} are not memqual's to restore; "
                "check them by hand and delete the file"
            )

    def owner_alive(self, snapshot: Snapshot) -> bool:
        start = procfs.start_time(snapshot.pid, self.proc_root)
        return start is not None and (snapshot.pid_start is None or start == snapshot.pid_start)

    def _require_lock(self) -> None:
        if not self._lock.held:
            raise RuntimeError("HostState: take the lock before touching the state file")


def _read_nofollow(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode()


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
    if not os.path.lexists(state.state_path):
        return None
    try:
        state.check_dir()
    except UntrustedDirectory:
        if os.geteuid() != 0:
            # Another user's (root's) state: this user could not write the
            # knobs anyway, and every memqual command runs this at start.
            log.info("host KSM state %s is not this user's; leaving it to its owner", state.state_path)
            return None
        raise
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
        return restore_stale_locked(state)
    finally:
        state.unlock()


def restore_stale_locked(state: HostState) -> StaleRestore | None:
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

"""Host knobs a scenario changes, saved before the first change and put
back on every exit, also after a kill, for any subject.

A ``KnobSet`` is the knobs one lock guards and one state file saves, in a
root-owned directory; whoever takes the lock and still finds the file
restores first; ``restore_every_stale`` does it at start for every set a
scenario row declares.  docs/ksm.md, "Host knobs are always put back"."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memqual.host.core import settings
from memqual.host.core.errors import BadInput, CapabilityMissing, MemqualError
from memqual.host.core.locks import FileLock
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.polling import poll
from memqual.host.core.trust import Untrusted, check_before_making, trusted_dir

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/run/memqual")
PROC_ROOT = Path("/proc")
# A knob is a plain sysfs attribute name: no separators, nothing relative.
KNOB_NAME = re.compile(r"[a-z][a-z0-9_]*")


def default_state_dir() -> Path:
    return settings.state_dir() or DEFAULT_STATE_DIR


def selected(text: str) -> str:
    """'always [madvise] never' -> 'madvise'; '100' -> '100'."""
    text = text.strip()
    if "[" in text and "]" in text:
        return text[text.index("[") + 1 : text.index("]")]
    return text


class Sysfs:
    """A directory of sysfs attribute files.  A "knob" is a file the owner
    may write (mode u+w); a multiple-choice knob ("always [madvise] never")
    reads as its selected word, which is also what it accepts."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def exists(self) -> bool:
        return self.root.is_dir()

    def has(self, name: str) -> bool:
        return (self.root / name).is_file()

    def read(self, name: str) -> str:
        return selected((self.root / name).read_text())

    def read_int(self, name: str) -> int:
        return int(self.read(name))

    def read_int_or_none(self, name: str) -> int | None:
        try:
            return self.read_int(name)
        except FileNotFoundError:
            return None

    def write(self, name: str, value: str | int) -> None:
        """Write one value; sysfs wants it in one write() call."""
        path = self.root / name
        data = f"{value}\n".encode()
        # O_TRUNC is what a shell's "echo 1 > knob" does: sysfs ignores it,
        # a fake tree (plain files) needs it when a value gets shorter.
        # O_NOFOLLOW: sysfs attributes are never symlinks; one is planted.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            os.write(fd, data)
        except OSError as exc:
            raise OSError(exc.errno, f"writing {value!r} to {path}: {os.strerror(exc.errno or errno.EIO)}") from exc
        finally:
            os.close(fd)

    def writable_names(self) -> list[str]:
        """Every file the owner may write: the knobs."""
        names = []
        for entry in sorted(self.root.iterdir()):
            try:
                mode = entry.stat().st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and mode & stat.S_IWUSR:
                names.append(entry.name)
        return names

    def knobs(self, names: tuple[str, ...] | list[str] | None = None) -> dict[str, str]:
        """Current value of the given knobs (default: every writable file)."""
        chosen = list(names) if names is not None else self.writable_names()
        return {n: self.read(n) for n in chosen if self.has(n)}


def sorted_order(names: list[str]) -> list[str]:
    return sorted(names)


@dataclasses.dataclass(frozen=True)
class KnobGroup:
    """One directory of knobs: every writable file (``names`` empty: a
    newer kernel's knobs are saved without code changes) or only ``names``.
    ``pause`` = (knob, running, idle): when that knob changes and is
    ``running`` now, it is set ``idle`` first, so the others change while
    the work it starts is stopped (KSM's run).  ``order``: the order the
    changed knobs are written back in."""

    name: str
    root: Path
    names: tuple[str, ...] = ()
    pause: tuple[str, str, str] | None = None
    order: Callable[[list[str]], list[str]] = sorted_order

    def dir(self) -> Sysfs:
        return Sysfs(self.root)


@dataclasses.dataclass(frozen=True)
class KnobSet:
    """Knobs one lock guards and one state file saves.  ``what`` names them
    in messages ("host KSM")."""

    name: str
    what: str
    groups: tuple[KnobGroup, ...]
    # What a dead run may have left beside its knobs (a mount in the state
    # directory), removed after its knobs are put back: called with the
    # state directory.
    after_restore: Callable[[Path], None] | None = None

    @property
    def schema(self) -> str:
        return f"memqual.{self.name}-state/1"

    def group(self, name: str) -> KnobGroup:
        return next(g for g in self.groups if g.name == name)

    def with_roots(self, **roots: Path) -> KnobSet:
        """The same set on other roots (a fake tree in tests)."""
        return dataclasses.replace(
            self,
            groups=tuple(
                dataclasses.replace(g, root=Path(roots[g.name])) if g.name in roots else g for g in self.groups
            ),
        )


@dataclasses.dataclass
class Snapshot:
    """The knobs before memqual touched them, and who took the snapshot.
    ``values`` by group; a group is None until a scenario touches it."""

    pid: int
    pid_start: int | None
    taken: str
    roots: dict[str, str]
    values: dict[str, dict[str, str] | None]

    def to_json(self, schema: str) -> dict[str, Any]:
        data: dict[str, Any] = {"schema": schema, "pid": self.pid, "pid_start": self.pid_start, "taken": self.taken}
        for name, root in self.roots.items():
            data[f"{name}_root"] = root
            data[name] = self.values.get(name)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], knob_set: KnobSet, source: str) -> Snapshot:
        if data.get("schema") != knob_set.schema:
            raise MemqualError(f"{source}: not a memqual {knob_set.name} state file (schema {data.get('schema')!r})")
        first = knob_set.groups[0].name
        try:
            pid, taken = data["pid"], data["taken"]
            roots = {g.name: data[f"{g.name}_root"] for g in knob_set.groups if f"{g.name}_root" in data}
            values = {g.name: data.get(g.name) for g in knob_set.groups if f"{g.name}_root" in data}
            if first not in roots or not isinstance(pid, int) or not isinstance(taken, str):
                raise KeyError(f"{first}_root")
        except KeyError as exc:
            raise BadInput(
                f"{source}: incomplete memqual {knob_set.name} state file (missing {exc}); "
                "check the knobs by hand and delete it"
            ) from exc
        for group in values.values():
            if group is not None and not (
                isinstance(group, dict)
                and all(isinstance(k, str) and isinstance(v, str) and KNOB_NAME.fullmatch(k) for k, v in group.items())
            ):
                raise BadInput(
                    f"{source}: knob names or values are not plain sysfs attributes; "
                    "check the knobs by hand and delete the file"
                )
        pid_start = data.get("pid_start")
        return cls(pid, pid_start if isinstance(pid_start, int) else None, taken, roots, values)


class RestoreFailed(MemqualError):
    """Some knobs could not be put back; the state file stays for a retry."""


def restore_knobs(fs: Sysfs, saved: dict[str, str], group: KnobGroup | None = None) -> list[str]:
    """Write back every saved knob whose value differs now; return the names
    written (the group's pause knob idled first, its order kept)."""
    current = fs.knobs(list(saved))
    changed = [n for n, v in saved.items() if n in current and current[n] != v]
    if not changed:
        return []
    failures: list[str] = []
    pause = group.pause if group else None
    if pause and pause[0] in changed and current.get(pause[0]) == pause[1]:
        _try_write(fs, pause[0], pause[2], failures)
    for name in group.order(changed) if group else sorted(changed):
        _try_write(fs, name, saved[name], failures)
    if failures:
        raise RestoreFailed(f"could not restore {fs.root}: " + "; ".join(failures))
    return changed


def _try_write(fs: Sysfs, name: str, value: str, failures: list[str]) -> None:
    try:
        fs.write(name, value)
    except OSError as exc:
        failures.append(f"{name}={value}: {exc.strerror or exc}")


def process_start_time(pid: int, proc_root: Path = PROC_ROOT) -> int | None:
    """Field 22 of /proc/PID/stat (ticks since boot): with the pid it names
    one process for good, even after the pid is reused.  None if gone."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class KnobState:
    """A knob set's lock and state file.  Not reentrant: one holder per object."""

    def __init__(self, knob_set: KnobSet, state_dir: Path | None = None, proc_root: Path = PROC_ROOT) -> None:
        self.knob_set = knob_set
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.lock_path = self.state_dir / f"{knob_set.name}.lock"
        self.state_path = self.state_dir / f"{knob_set.name}-state.json"
        self.dirs = {g.name: g.dir() for g in knob_set.groups}
        self.proc_root = proc_root
        self._lock = FileLock(self.lock_path, mode=0o644, holder_pid=True)

    # -- the lock ---------------------------------------------------------
    def check_dir(self) -> None:
        """The state directory must be the running user's and writable by
        nobody else: root writes back to sysfs what its files say."""
        if os.path.lexists(self.state_dir):
            trusted_dir(self.state_dir, "state directory", create=False)

    def _unusable(self, exc: OSError) -> CapabilityMissing:
        return CapabilityMissing(
            f"{self.knob_set.what}: cannot use the state directory {self.state_dir} ({exc.strerror}); "
            "run as root or set MEMQUAL_STATE_DIR to a root-owned directory"
        )

    def _prepare_dir(self) -> None:
        if not os.path.lexists(self.state_dir):
            check_before_making(self.state_dir, "state directory")
        try:
            self.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unusable(exc) from exc
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
                raise Untrusted(f"{self.lock_path} is a symlink: refused; remove it") from exc
            raise self._unusable(exc) from exc

    def lock(self, timeout_s: float, poll_s: float = 0.05) -> None:
        """Wait up to timeout_s for the lock; CapabilityMissing naming the
        holder when it stays taken (the scenario then skips)."""
        poll(
            self.try_lock,
            timeout_s,
            poll_s,
            what=f"the {self.knob_set.what} lock",
            on_timeout=lambda _: CapabilityMissing(
                f"{self.knob_set.what} is driven by another memqual run (pid {self.holder() or '?'}, "
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
            raise BadInput(
                f"{self.state_path}: not a memqual {self.knob_set.name} state file; "
                "check the knobs by hand and delete it"
            )
        return Snapshot.from_json(data, self.knob_set, str(self.state_path))

    def save(self, snapshot: Snapshot) -> None:
        """Atomic and durable: a crash leaves the old file or the new one."""
        self._require_lock()
        text = json.dumps(snapshot.to_json(self.knob_set.schema), indent=2, sort_keys=True) + "\n"
        write_private_atomic(self.state_path, text.encode(), 0o644)

    def new_snapshot(self, groups: tuple[str, ...] | None = None) -> Snapshot:
        """The knobs of ``groups`` (default: all) as they are now; the
        others' roots are written, their values left None until taken."""
        chosen = groups if groups is not None else tuple(g.name for g in self.knob_set.groups)
        return Snapshot(
            pid=os.getpid(),
            pid_start=process_start_time(os.getpid(), self.proc_root),
            taken=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            roots={g.name: str(g.root) for g in self.knob_set.groups},
            values={g.name: self.current_values(g.name) if g.name in chosen else None for g in self.knob_set.groups},
        )

    def current_values(self, group: str) -> dict[str, str]:
        """One group's knobs as they are now."""
        names = self.knob_set.group(group).names
        return self.dirs[group].knobs(names or None)

    def restore(self, snapshot: Snapshot) -> list[str]:
        """Put the snapshot's knobs back, then delete the state file.  On a
        failure the file stays, so the next start tries again."""
        self._require_lock()
        self._check_roots(snapshot)
        written: list[str] = []
        for group in self.knob_set.groups:
            saved = snapshot.values.get(group.name)
            if saved:
                written += [f"{group.name}/{n}" for n in restore_knobs(self.dirs[group.name], saved, group)]
        self.state_path.unlink(missing_ok=True)
        return written

    def _check_roots(self, snapshot: Snapshot) -> None:
        """Knobs are written back only under the roots this object was made
        for, whatever the file says, and only a group's listed knobs."""
        for group in self.knob_set.groups:
            saved = snapshot.values.get(group.name)
            if not saved and group is not self.knob_set.groups[0]:
                continue
            named = snapshot.roots.get(group.name, "")
            if os.path.normpath(str(named)) != os.path.normpath(str(group.root)):
                raise BadInput(
                    f"{self.state_path}: {group.name}_root {named!r} is not {group.root}: refusing to write knobs "
                    "there; check the knobs by hand and delete the file"
                )
            unknown = sorted(set(saved or {}) - set(group.names)) if group.names else []
            if unknown:
                raise BadInput(
                    f"{self.state_path}: {group.name} knobs {', '.join(unknown)} are not memqual's to restore; "
                    "check them by hand and delete the file"
                )

    def owner_alive(self, snapshot: Snapshot) -> bool:
        start = process_start_time(snapshot.pid, self.proc_root)
        return start is not None and (snapshot.pid_start is None or start == snapshot.pid_start)

    def _require_lock(self) -> None:
        if not self._lock.held:
            raise RuntimeError(f"{type(self).__name__}: take the lock before touching the state file")


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
    what: str = "host KSM"

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        knobs = ", ".join(self.written) or "none differed"
        who = "still running (pid reused?)" if self.owner_alive else "gone"
        return (
            f"restored {self.what} knobs left by memqual pid {self.owner_pid} ({who}, snapshot {self.taken}): {knobs}"
        )


def restore_stale(state: KnobState, lock_timeout_s: float = 0.0) -> StaleRestore | None:
    """Put back the knobs a dead memqual run left changed.

    Cheap and quiet when there is nothing to do: no state file, or the lock
    is held by a live run (that run restores on its own exit).  The lock is
    taken only while restoring.  Raises RestoreFailed when knobs cannot be
    written back."""
    if not os.path.lexists(state.state_path):
        return None
    try:
        state.check_dir()
    except Untrusted:
        if os.geteuid() != 0:
            # Another user's (root's) state: this user could not write the
            # knobs anyway, and every memqual command runs this at start.
            log.info("%s state %s is not this user's; leaving it to its owner", state.knob_set.what, state.state_path)
            return None
        raise
    try:
        if lock_timeout_s > 0:
            state.lock(lock_timeout_s)
        elif not state.try_lock():
            log.info(
                "%s state %s belongs to a live run (pid %s)", state.knob_set.what, state.state_path, state.holder()
            )
            return None
    except CapabilityMissing as exc:
        log.info("%s", exc)
        return None
    try:
        return restore_stale_locked(state)
    finally:
        state.unlock()


def restore_stale_locked(state: KnobState) -> StaleRestore | None:
    """With the lock held: any state file left is stale, since an owner
    deletes it before it lets go of the lock."""
    snapshot = state.load()
    if snapshot is None:
        return None
    alive = state.owner_alive(snapshot) and snapshot.pid != os.getpid()
    written = state.restore(snapshot)
    if state.knob_set.after_restore is not None:
        state.knob_set.after_restore(state.state_dir)
    result = StaleRestore(snapshot.pid, alive, snapshot.taken, written, state.knob_set.what)
    log.warning("%s", result.describe())
    return result


def restore_every_stale(knob_sets: tuple[KnobSet, ...], state_dir: Path | None = None) -> list[StaleRestore]:
    """restore_stale for each of ``knob_sets`` (host/core/scenario.py's
    ``declared_knob_sets()`` at a start: every set a scenario row names)."""
    restored = []
    for knob_set in knob_sets:
        found = restore_stale(KnobState(knob_set, state_dir))
        if found is not None:
            restored.append(found)
    return restored


@contextlib.contextmanager
def changing(knob_set: KnobSet, state_dir: Path | None = None, lock_timeout_s: float = 600.0) -> Iterator[KnobState]:
    """Hold ``knob_set`` for a block that changes it: the lock taken, a
    state file a dead run left restored, every group saved before the
    block, everything restored and the lock dropped after it, however it
    ends (a kill: the next start's restore_every_stale)."""
    state = KnobState(knob_set, state_dir)
    state.lock(lock_timeout_s)
    try:
        restore_stale_locked(state)
        state.save(state.new_snapshot())
        try:
            yield state
        finally:
            snapshot = state.load()
            if snapshot is not None:
                state.restore(snapshot)
    finally:
        state.unlock()

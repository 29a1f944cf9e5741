"""KsmController: the one object a scenario uses to drive host KSM.

    with KsmController() as ksm:          # capability check, lock, stale restore
        ksm.set(pages_to_scan=4000, sleep_millisecs=10, run=1)  # snapshot first
        ksm.wait_full_scans(3, timeout_s=60)
    # knobs restored here, on an exception, on SIGTERM/SIGINT, at exit;
    # after a SIGKILL, at the next start (restore_stale)

The snapshot is taken before the first change: reading changes nothing."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, Self

from memqual.host.core.closable import Closable
from memqual.host.core.environment import KSM_ROOT, THP_ROOT
from memqual.host.core.errors import CapabilityMissing, Timeout
from memqual.host.core.knobs import StaleRestore, Sysfs, restore_stale_locked
from memqual.host.core.polling import poll
from memqual.host.ksm import procfs
from memqual.host.ksm.state import HostState
from memqual.host.ksm.sysfs import COUNTERS, THP_KNOBS, KsmCounters, write_order

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_S = 600.0
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def check_capability(ksm_root: Path = KSM_ROOT, euid: Callable[[], int] = os.geteuid) -> None:
    """CapabilityMissing, with the reason, unless this process can drive KSM."""
    root = Path(ksm_root)
    if not root.is_dir():
        raise CapabilityMissing(f"host KSM: {root} does not exist (kernel built without CONFIG_KSM)")
    if euid() != 0:
        raise CapabilityMissing(f"host KSM: writing {root} needs root (running as uid {euid()})")
    run = root / "run"
    if not run.is_file():
        raise CapabilityMissing(f"host KSM: {run} is missing")
    st = os.statvfs(root)
    if st.f_flag & os.ST_RDONLY or not os.access(run, os.W_OK):
        raise CapabilityMissing(f"host KSM: {root} is read-only (sysfs mounted ro, e.g. in a container)")


class KsmDriver(Protocol):
    """What a scenario's measurement drives of host KSM: ``KsmController``,
    or a scripted fake in tests."""

    def set(self, **knobs: int | str) -> None: ...
    def counters(self) -> KsmCounters: ...
    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = ...) -> KsmCounters: ...
    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]: ...


class KsmController(Closable):
    """Host KSM for one scenario: lock, snapshot, knobs, counters, waits."""

    def __init__(
        self,
        ksm_root: Path = KSM_ROOT,
        thp_root: Path = THP_ROOT,
        state_dir: Path | None = None,
        proc_root: Path = procfs.PROC_ROOT,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        euid: Callable[[], int] = os.geteuid,
        install_signal_handlers: bool = True,
    ) -> None:
        self.fs = Sysfs(ksm_root)
        self.thp = Sysfs(thp_root)
        self.proc_root = Path(proc_root)
        self.state = HostState(state_dir, ksm_root, thp_root, proc_root)
        self.lock_timeout_s = lock_timeout_s
        self._euid = euid
        self._install_signals = install_signal_handlers
        self._snapshot_taken = False
        self._thp_in_snapshot = False
        self._active = False
        self._previous_handlers: dict[int, Any] = {}
        # close() may come from another thread than the one driving KSM
        # (Avocado runs tearDown beside the test body): no knob is written
        # once close() has begun.
        self._mutex = threading.RLock()
        self._ksmd_pid: int | None = None
        self.stale_restored: StaleRestore | None = None

    # -- lifetime ----------------------------------------------------------
    def __enter__(self) -> Self:
        # Built closed: the capability check, the host-wide lock and the
        # stale restore are open()'s, here or called by the owner itself.
        self.open()
        return self

    def open(self) -> None:
        check_capability(self.fs.root, self._euid)
        self.state.lock(self.lock_timeout_s)
        try:
            # Holding the lock, a state file left behind is stale: put those
            # knobs back before taking our own snapshot of the originals.
            self.stale_restored = restore_stale_locked(self.state)
        except BaseException:
            self.state.unlock()
            raise
        self._active = True
        atexit.register(self._restore_at_exit)
        if self._install_signals and threading.current_thread() is threading.main_thread():
            for sig in _HANDLED_SIGNALS:
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def close(self) -> None:
        """Restore every changed knob, drop the state file and the lock.
        Safe from any thread; idempotent."""
        with self._mutex:
            if not self._active:
                return
            self._active = False
            try:
                self.restore()
            finally:
                if threading.current_thread() is threading.main_thread():
                    for sig, handler in self._previous_handlers.items():
                        signal.signal(sig, handler)
                    self._previous_handlers.clear()
                atexit.unregister(self._restore_at_exit)
                self.state.unlock()

    def restore(self) -> list[str]:
        """Put the snapshot back now (idempotent); the lock stays held."""
        with self._mutex:
            return self._restore()

    def _restore(self) -> list[str]:
        snapshot = self.state.load() if self._snapshot_taken else None
        self._snapshot_taken = self._thp_in_snapshot = False
        if snapshot is None:
            return []
        written = self.state.restore(snapshot)
        if written:
            log.info("restored host knobs: %s", ", ".join(written))
        return written

    def _restore_at_exit(self) -> None:
        try:
            self.close()
        except Exception as exc:  # at exit there is no one left to raise to
            log.error("host KSM restore at exit failed: %s", exc)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        try:
            self.close()
        except Exception as exc:
            log.error("host KSM restore on signal %d failed: %s", signum, exc)
        # Then behave as if we had not been there.
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # -- changes -----------------------------------------------------------
    def _require_active(self) -> None:
        if not self._active:
            raise RuntimeError("KsmController: not open (use it as a context manager), or already closed")

    def _ensure_snapshot(self, with_thp: bool) -> None:
        if self._snapshot_taken and (self._thp_in_snapshot or not with_thp):
            return
        if self._snapshot_taken:
            # Add THP's original values to the file we already wrote: the
            # KSM part must keep its originals, not the current values.
            snapshot = self.state.load()
            assert snapshot is not None
            snapshot.values["thp"] = self.thp.knobs(THP_KNOBS)
        else:
            snapshot = self.state.new_snapshot(with_thp=with_thp)
        self.state.save(snapshot)
        self._snapshot_taken = True
        self._thp_in_snapshot = self._thp_in_snapshot or with_thp

    def set(self, **knobs: int | str) -> None:
        """Write KSM knobs (snapshot first).  advisor_mode is written first
        (it resets pages_to_scan), run last."""
        unknown = [n for n in knobs if not self.fs.has(n)]
        if unknown:
            raise CapabilityMissing(f"host KSM: this kernel has no knob {', '.join(unknown)} in {self.fs.root}")
        with self._mutex:
            self._require_active()
            self._ensure_snapshot(with_thp=False)
            for name in write_order(list(knobs)):
                self.fs.write(name, knobs[name])

    def set_thp(self, **knobs: str) -> None:
        """Write THP's enabled/defrag (snapshot of both first)."""
        if not self.thp.exists():
            raise CapabilityMissing(f"host THP: {self.thp.root} does not exist (kernel without THP)")
        bad = [n for n in knobs if n not in THP_KNOBS]
        if bad:
            raise ValueError(f"set_thp: only {THP_KNOBS} are snapshotted, not {bad}")
        with self._mutex:
            self._require_active()
            self._ensure_snapshot(with_thp=True)
            for name, value in knobs.items():
                self.thp.write(name, value)

    def unmerge(self) -> None:
        """run=2: the kernel breaks every KSM page back into private copies
        before the write returns; ksmd then stays stopped."""
        self.set(run=2)

    # -- readings ----------------------------------------------------------
    def knobs(self) -> dict[str, str]:
        return self.fs.knobs()

    def ksmd_pid(self) -> int | None:
        if self._ksmd_pid is None:
            self._ksmd_pid = procfs.find_ksmd(self.proc_root)
        return self._ksmd_pid

    def counters(self) -> KsmCounters:
        return read_counters(self.fs, self.proc_root, self.ksmd_pid())

    def process(self, pid: int) -> procfs.ProcessKsm:
        return procfs.process_ksm(pid, self.proc_root)

    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = 0.005) -> KsmCounters:
        """Wait until full_scans has grown by n; Timeout if it does not
        within timeout_s.  Returns the reading that saw the n-th scan."""
        start = self.fs.read_int("full_scans")
        target = start + n
        first: list[KsmCounters] = []  # the first reading that saw too few, for the diagnosis only
        now = start

        def scanned() -> KsmCounters | None:
            nonlocal now
            now = self.fs.read_int("full_scans")
            if now >= target:
                return self.counters()
            if not first:
                first.append(self.counters())
            return None

        def too_slow() -> Timeout:
            return Timeout(
                f"host KSM: full_scans went {start} -> {now} in {timeout_s:.1f} s, "
                f"waited for {n} more (run={self.fs.read('run')}, "
                f"pages_to_scan={self.fs.read('pages_to_scan')}, "
                f"sleep_millisecs={self.fs.read('sleep_millisecs')}; " + _diagnosis(first[0], self.counters()) + ")"
            )

        return poll(scanned, timeout_s, poll_s, what="KSM's full scans", on_timeout=lambda _: too_slow()).value

    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]:
        """One reading at each of the next ``scans`` full-scan ends
        (``timeout_s`` for each)."""
        return [self.wait_full_scans(1, timeout_s) for _ in range(scans)]

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
        poll(predicate, timeout_s, poll_s, what=f"host KSM: {what}")


def read_counters(fs: Sysfs, proc_root: Path = procfs.PROC_ROOT, ksmd_pid: int | None = None) -> KsmCounters:
    values = {name: fs.read_int_or_none(name) for name in COUNTERS}
    cpu: float | None = None
    if ksmd_pid is not None:
        try:
            cpu = procfs.cpu_seconds(ksmd_pid, proc_root)
        except (OSError, ValueError):
            cpu = None
    return KsmCounters(
        taken_s=time.monotonic(),
        full_scans=values["full_scans"] or 0,
        pages_shared=values["pages_shared"] or 0,
        pages_sharing=values["pages_sharing"] or 0,
        pages_unshared=values["pages_unshared"] or 0,
        pages_volatile=values["pages_volatile"] or 0,
        pages_skipped=values["pages_skipped"],
        pages_scanned=values["pages_scanned"],
        general_profit=values["general_profit"],
        ksmd_cpu_s=cpu,
    )


def _diagnosis(start: KsmCounters, end: KsmCounters) -> str:
    """Why scans are slow: ksmd starved of CPU, or a lot to scan and merge
    (other guests' mergeable memory counts too)."""
    wall = max(end.taken_s - start.taken_s, 1e-9)
    parts = []
    if start.ksmd_cpu_s is not None and end.ksmd_cpu_s is not None:
        parts.append(f"ksmd used {100 * (end.ksmd_cpu_s - start.ksmd_cpu_s) / wall:.0f} % of a CPU")
    if start.pages_scanned is not None and end.pages_scanned is not None:
        parts.append(f"compared {(end.pages_scanned - start.pages_scanned) / wall:.0f} pages/s")
    parts.append(f"pages_sharing {start.pages_sharing} -> {end.pages_sharing}")
    return ", ".join(parts)

"""Host KSM's knobs as host/core/knobs.py saves and restores them: the KSM
directory (every writable file; ``run`` idled first and written last) and
THP's ``enabled`` and ``defrag`` once a scenario touches them, under one
lock (``ksm.lock``) and one state file (``ksm-state.json``)."""

from __future__ import annotations

from pathlib import Path

from memqual.host.core.environment import KSM_ROOT, THP_ROOT
from memqual.host.core.knobs import (
    PROC_ROOT,
    KnobGroup,
    KnobSet,
    KnobState,
    Snapshot,
    StaleRestore,
)
from memqual.host.core.knobs import restore_stale as restore_stale_of
from memqual.host.ksm.sysfs import THP_KNOBS, write_order

KNOBS = KnobSet(
    "ksm",
    "host KSM",
    (
        KnobGroup("ksm", KSM_ROOT, pause=("run", "1", "0"), order=write_order),
        KnobGroup("thp", THP_ROOT, names=THP_KNOBS),
    ),
)


class HostState(KnobState):
    """The KSM knob set's lock and state file, on the given roots."""

    def __init__(
        self,
        state_dir: Path | None = None,
        ksm_root: Path = KSM_ROOT,
        thp_root: Path = THP_ROOT,
        proc_root: Path = PROC_ROOT,
    ) -> None:
        super().__init__(KNOBS.with_roots(ksm=Path(ksm_root), thp=Path(thp_root)), state_dir, proc_root)
        self.ksm = self.dirs["ksm"]
        self.thp = self.dirs["thp"]

    def new_snapshot(self, groups: tuple[str, ...] | None = None, with_thp: bool = False) -> Snapshot:
        return super().new_snapshot(groups or (("ksm", "thp") if with_thp else ("ksm",)))


def ksm_snapshot(
    pid: int, pid_start: int | None, taken: str, ksm_root: str, ksm: dict[str, str], thp_root: str
) -> Snapshot:
    """A KSM state file's content, as a test writes one by hand."""
    return Snapshot(pid, pid_start, taken, {"ksm": ksm_root, "thp": thp_root}, {"ksm": ksm, "thp": None})


def restore_stale(
    state_dir: Path | None = None,
    ksm_root: Path = KSM_ROOT,
    thp_root: Path = THP_ROOT,
    proc_root: Path = PROC_ROOT,
    lock_timeout_s: float = 0.0,
) -> StaleRestore | None:
    """Put back the KSM knobs a dead memqual run left changed (at start;
    host/core/knobs.py restore_stale)."""
    return restore_stale_of(HostState(state_dir, ksm_root, thp_root, proc_root), lock_timeout_s)

"""Host KSM: knobs, counters, lock and restore (see docs/ksm.md).

Public API:
    KsmController      lock + lazy snapshot + knobs + counters + waits
    restore_stale()    call at start: put back knobs a killed run left
    check_capability() CapabilityMissing unless host KSM can be driven
    KsmCounters, ProcessKsm, read_counters, find_ksmd
"""

from memqual.host.core.environment import KSM_ROOT, THP_ROOT
from memqual.host.ksm.controller import KsmController, check_capability, read_counters
from memqual.host.ksm.procfs import ProcessKsm, find_ksmd, process_ksm
from memqual.host.ksm.state import HostState, RestoreFailed, StaleRestore, restore_stale
from memqual.host.ksm.sysfs import KsmCounters, Sysfs

__all__ = [
    "KSM_ROOT",
    "THP_ROOT",
    "HostState",
    "KsmController",
    "KsmCounters",
    "ProcessKsm",
    "RestoreFailed",
    "StaleRestore",
    "Sysfs",
    "check_capability",
    "find_ksmd",
    "process_ksm",
    "read_counters",
    "restore_stale",
]

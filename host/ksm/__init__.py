"""Host KSM: knobs, counters, lock and restore (see docs/ksm.md).

controller.py's ``KsmController`` (lock, lazy snapshot, knobs, counters,
waits) and ``check_capability``; state.py's knob set and ``restore_stale``
(call at start: put back knobs a killed run left); sysfs.py's counters;
procfs.py a process's KSM figures; and the scenarios' procedures.
"""

"""Child processes that cannot outlive memqual.

``die_with_parent`` (PR_SET_PDEATHSIG=SIGKILL, between fork and exec, with
no work that could take a lock there) and ``set_child_subreaper`` for the
job supervisor.  docs/architecture.md, "host/core/process.py", says why the
signal is tied to the forking thread and how a parent that died before
prctl is caught."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

# Resolved here, in the parent, once: ctypes.CDLL(None) is a dlopen(3), which
# takes the dynamic loader's lock.
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int

# The pid of the process that is about to fork, noted in that process just
# before the fork (subprocess runs at-fork hooks when a preexec_fn is given);
# the child inherits it.
_forking_pid = os.getpid()


def _note_forking_pid() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


os.register_at_fork(before=_note_forking_pid)


def die_with_parent() -> None:
    """A ``preexec_fn``: runs in the child between fork and exec.  The child
    gets SIGKILL when its parent dies; when the parent died already (before
    the prctl), the child kills itself now, as the signal would have."""
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(127)  # the kernel refused: no child that could outlive us
    if os.getppid() != _forking_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def set_child_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants."""
    if _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")

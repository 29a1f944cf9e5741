"""Child processes that cannot outlive memqual.

QEMU gets PR_SET_PDEATHSIG=SIGKILL (``preexec_fn=die_with_parent``), so the
kernel kills it when the Python process that started it dies (an Avocado
timeout, kill -9).  The kernel ties that signal to the *thread* that forked:
start such a child from a thread that lives as long as the child should.

``die_with_parent`` runs between fork and exec in a process that has other
threads (paramiko's transport, QMP readers): a lock one of them held at the
fork stays held in the child for ever.  So it does no work there that could
take one: prctl is looked up once, at import (no dlopen, no import after the
fork), and the parent's pid is noted just before every fork by an at-fork
hook, so that the child can tell whether its parent died before prctl took
effect (then no signal will ever come, and the child ends itself at once).

``set_child_subreaper`` is for the job supervisor (memqual.host.run.supervisor):
orphaned descendants are reparented to it, not to init, so that it can end
every one of them.
"""

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

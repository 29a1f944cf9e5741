"""Child processes that cannot outlive memqual: QEMU gets
PR_SET_PDEATHSIG=SIGKILL, so the kernel kills it when the Python process
that started it dies (an Avocado timeout, kill -9)."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A ``preexec_fn``: runs in the child between fork and exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

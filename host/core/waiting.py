"""The one way memqual waits for something that has no event to wait on: a
predicate polled at an interval until it holds or a deadline passes.  Never
a fixed sleep, never a wait without a deadline.  Knows nothing of what it
waits for: the caller names it (``what``) and may say what to raise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

from memqual.host.core.errors import Timeout

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    interval: float,
    what: str,
    on_timeout: Callable[[], BaseException] | None = None,
) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns a true
    value, and return that value.  It is always called once, and once more
    at the deadline, so a slow poll never turns a success into a timeout.
    Past ``timeout`` seconds: the exception ``on_timeout`` builds, else
    Timeout("<what> did not happen within N s")."""
    if not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"a wait for {what} needs a finite timeout, not {timeout!r}")
    if not interval > 0:
        raise ValueError(f"a wait for {what} needs an interval above 0, not {interval!r}")
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(interval, left))
    if on_timeout is not None:
        raise on_timeout()
    raise Timeout(f"{what} did not happen within {timeout:.1f} s")


def within(timeout: float, predicate: Callable[[], object], *, interval: float, what: str) -> bool:
    """Whether ``predicate`` came true within ``timeout`` seconds (the same
    wait, for a caller that goes on either way)."""
    try:
        wait_until(predicate, timeout=timeout, interval=interval, what=what)
    except Timeout:
        return False
    return True

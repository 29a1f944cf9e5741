"""The one way memqual waits for something that has no event to wait on:
``poll`` calls a predicate at an interval until it holds or a deadline
passes, and says what it saw (``Polled``: the value, the seconds, the number
of polls).  Never a fixed sleep, never a wait without a deadline.  The clock
and the sleep are arguments, so tests run it on a fake clock; a sleep may
also be an event's ``wait``, which ends the pause early when the event fires.
docs/waiting.md says how to write a wait; tests/core/test_polling_loops.py keeps
every loop that sleeps in here.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, Literal, TypeVar, overload

from memqual.host.core.errors import Timeout

T = TypeVar("T")
Interval = float | Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Polled(Generic[T]):
    """What a poll saw.  ``value`` is the predicate's last value: the one
    that held when ``met``, else the one seen at the deadline.
    ``elapsed_s`` runs from the call to the end of the last poll, on the
    clock the poll was given; ``polls`` counts the predicate's calls."""

    value: T
    met: bool
    elapsed_s: float
    polls: int


def _check(timeout: float, interval: Interval, what: str) -> None:
    if not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"a wait for {what} needs a finite timeout, not {timeout!r}")
    if not callable(interval) and not interval >= 0:
        raise ValueError(f"a wait for {what} needs an interval of 0 or more, not {interval!r}")


def _pause(interval: Interval, left: float) -> float:
    """The next sleep: the interval, never past the deadline (so the
    predicate is always called once more at the deadline)."""
    step = interval() if callable(interval) else interval
    return max(0.0, min(step, left))


def _timed_out(
    polled: Polled[Any], timeout: float, what: str, on_timeout: Callable[[Polled[Any]], BaseException] | None
) -> BaseException:
    if on_timeout is not None:
        return on_timeout(polled)
    return Timeout(f"{what} did not happen within {timeout:.1f} s ({polled.polls} polls)")


def _steps(
    predicate: Callable[[], Any],
    timeout: float,
    interval: Interval,
    until: Callable[[Any], object],
    clock: Callable[[], float],
) -> Generator[float, None, Polled[Any]]:
    """The loop both polls run: call the predicate, stop when it holds or
    the deadline has passed, else yield the pause to take; returns what
    was seen.  The caller sleeps (``poll``) or awaits (``poll_async``)."""
    start = clock()
    polls = 0
    while True:
        value = predicate()
        polls += 1
        elapsed = clock() - start
        met = bool(until(value))
        if met or elapsed >= timeout:
            return Polled(value, met, elapsed, polls)
        yield _pause(interval, timeout - elapsed)


def _outcome(
    polled: Polled[Any],
    timeout: float,
    what: str,
    on_timeout: Callable[[Polled[Any]], BaseException] | None,
    raise_on_timeout: bool,
) -> Polled[Any]:
    if polled.met or not raise_on_timeout:
        return polled
    raise _timed_out(polled, timeout, what, on_timeout)


@overload
def poll(
    predicate: Callable[[], T | None],
    timeout: float,
    interval: Interval,
    *,
    what: str,
    clock: Callable[[], float] = ...,
    sleep: Callable[[float], object] = ...,
    on_timeout: Callable[[Polled[Any]], BaseException] | None = ...,
    raise_on_timeout: Literal[True] = ...,
) -> Polled[T]: ...


@overload
def poll(
    predicate: Callable[[], T],
    timeout: float,
    interval: Interval,
    *,
    what: str,
    until: Callable[[T], object] = ...,
    clock: Callable[[], float] = ...,
    sleep: Callable[[float], object] = ...,
    on_timeout: Callable[[Polled[Any]], BaseException] | None = ...,
    raise_on_timeout: bool = ...,
) -> Polled[T]: ...


def poll(
    predicate: Callable[[], Any],
    timeout: float,
    interval: Interval,
    *,
    what: str,
    until: Callable[[Any], object] = bool,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
    on_timeout: Callable[[Polled[Any]], BaseException] | None = None,
    raise_on_timeout: bool = True,
) -> Polled[Any]:
    """Call ``predicate`` now, then every ``interval`` seconds (a number, or
    a callable asked before each pause), until ``until(value)`` holds (by
    default: the value is true) or ``timeout`` seconds have passed on
    ``clock``.  It is always called once more at the deadline, so a slow
    poll never turns a success into a timeout.

    Past the deadline: the exception ``on_timeout(polled)`` builds, else
    Timeout("<what> did not happen within N s"); with
    ``raise_on_timeout=False``, the Polled with ``met`` False instead (for a
    caller that goes on either way).  ``what`` names the awaited thing."""
    _check(timeout, interval, what)
    steps = _steps(predicate, timeout, interval, until, clock)
    try:
        while True:
            sleep(next(steps))
    except StopIteration as done:
        return _outcome(done.value, timeout, what, on_timeout, raise_on_timeout)


async def poll_async(
    predicate: Callable[[], T],
    timeout: float,
    interval: Interval,
    *,
    what: str,
    until: Callable[[T], object] = bool,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] | None = None,
    on_timeout: Callable[[Polled[Any]], BaseException] | None = None,
    raise_on_timeout: bool = True,
) -> Polled[T]:
    """``poll`` for a coroutine: the same deadline and result, pausing with
    ``await sleep`` (asyncio.sleep unless given) so the event loop runs
    meanwhile."""
    import asyncio  # only a coroutine's caller pays for it

    pause = sleep or asyncio.sleep
    _check(timeout, interval, what)
    steps = _steps(predicate, timeout, interval, until, clock)
    try:
        while True:
            await pause(next(steps))
    except StopIteration as done:
        return _outcome(done.value, timeout, what, on_timeout, raise_on_timeout)

"""poll: the value once the predicate holds, with the seconds and polls it
took on the clock it was given; Timeout naming what was awaited once the
deadline passes; no wait without a deadline.  On a fake clock throughout."""

from __future__ import annotations

import asyncio

import pytest
from fakes import FakeClock

from memqual.host.core.errors import Timeout
from memqual.host.core.polling import Polled, poll, poll_async


def test_returns_the_value_the_seconds_and_the_polls() -> None:
    clock = FakeClock()
    calls = iter([None, 0, "ready"])
    polled = poll(lambda: next(calls), 5, 0.5, what="x", clock=clock, sleep=clock.sleep)
    assert polled == Polled("ready", True, 1.0, 3)


def test_times_out_naming_what_it_waited_for() -> None:
    clock = FakeClock()
    with pytest.raises(Timeout, match=r"the door did not happen within 2.0 s \(5 polls\)"):
        poll(lambda: False, 2, 0.5, what="the door", clock=clock, sleep=clock.sleep)
    assert clock.t == 2.0  # never slept past the deadline


def test_raises_what_the_caller_builds_from_what_it_saw() -> None:
    clock = FakeClock()
    with pytest.raises(KeyError, match="3 polls"):
        poll(
            lambda: False,
            1,
            0.5,
            what="x",
            clock=clock,
            sleep=clock.sleep,
            on_timeout=lambda polled: KeyError(f"{polled.polls} polls"),
        )


def test_looks_once_more_at_the_deadline() -> None:
    """A predicate that came true during the last pause is a success, and
    the last pause is cut to end at the deadline."""
    clock = FakeClock()
    polled = poll(lambda: clock.t >= 3, 3, 2.0, what="x", clock=clock, sleep=clock.sleep)
    assert (polled.met, polled.elapsed_s, polled.polls) == (True, 3.0, 3)


def test_a_caller_that_goes_on_either_way_gets_the_last_value() -> None:
    clock = FakeClock()
    readings = iter(range(100))
    polled = poll(
        lambda: next(readings),
        1,
        0.25,
        what="x",
        until=lambda n: n > 50,
        clock=clock,
        sleep=clock.sleep,
        raise_on_timeout=False,
    )
    assert polled == Polled(4, False, 1.0, 5)


def test_until_decides_instead_of_the_values_truth() -> None:
    clock = FakeClock()
    readings = iter([3, 2, 0, 5])
    polled = poll(lambda: next(readings), 9, 1, what="x", until=lambda n: n == 0, clock=clock, sleep=clock.sleep)
    assert (polled.value, polled.polls) == (0, 3)


def test_an_interval_may_change_from_pause_to_pause() -> None:
    clock = FakeClock()
    pauses = iter([0.1, 0.2, 0.4])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.sleep(seconds)

    poll(lambda: len(slept) == 3, 9, lambda: next(pauses), what="x", clock=clock, sleep=sleep)
    assert slept == [0.1, 0.2, 0.4]


def test_a_blocking_predicate_needs_no_pause() -> None:
    clock = FakeClock()

    def one_scan() -> bool:
        clock.sleep(1.0)  # the predicate itself waits (one full scan)
        return clock.t >= 3

    polled = poll(one_scan, 10, 0, what="x", clock=clock, sleep=clock.sleep)
    assert (polled.elapsed_s, polled.polls) == (3.0, 3)


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1.0])
def test_refuses_a_wait_without_a_deadline(timeout: float) -> None:
    with pytest.raises(ValueError, match="finite timeout"):
        poll(lambda: True, timeout, 0.1, what="x")


def test_refuses_a_negative_interval() -> None:
    with pytest.raises(ValueError, match="interval of 0 or more"):
        poll(lambda: True, 1, -0.1, what="x")


def test_the_real_clock_by_default() -> None:
    polled = poll(lambda: False, 0.02, 0.005, what="x", raise_on_timeout=False)
    assert not polled.met and 0.02 <= polled.elapsed_s < 2 and polled.polls >= 2


def test_the_async_poll_pauses_without_blocking_the_loop() -> None:
    clock = FakeClock()
    ticks: list[float] = []

    async def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        ticks.append(clock.t)
        await asyncio.sleep(0)

    async def main() -> Polled[bool]:
        return await poll_async(lambda: len(ticks) >= 2, 5, 0.5, what="x", clock=clock, sleep=sleep)

    assert asyncio.run(main()) == Polled(True, True, 1.0, 3)
    with pytest.raises(Timeout):
        asyncio.run(poll_async(lambda: False, 1, 0.5, what="x", clock=clock, sleep=sleep))

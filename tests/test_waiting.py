"""wait_until: the value once the predicate holds, Timeout naming what was
awaited once the deadline passes, and no wait without a deadline."""

from __future__ import annotations

import time

import pytest

from memqual.host.core.errors import Timeout
from memqual.host.core.waiting import wait_until, within


def test_returns_the_predicates_value_once_it_holds() -> None:
    calls = iter([None, 0, "ready"])
    assert wait_until(lambda: next(calls), timeout=5, interval=0.001, what="x") == "ready"


def test_times_out_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(Timeout, match="the door did not happen within 0.1 s"):
        wait_until(lambda: False, timeout=0.05, interval=0.01, what="the door")
    assert time.monotonic() - started < 2


def test_raises_what_the_caller_builds() -> None:
    with pytest.raises(KeyError):
        wait_until(lambda: False, timeout=0.01, interval=0.005, what="x", on_timeout=lambda: KeyError("k"))


def test_looks_once_more_at_the_deadline() -> None:
    """A predicate that came true during the last sleep is a success."""
    deadline = time.monotonic() + 0.05
    assert wait_until(lambda: time.monotonic() >= deadline, timeout=0.05, interval=1.0, what="x")


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1.0])
def test_refuses_a_wait_without_a_deadline(timeout: float) -> None:
    with pytest.raises(ValueError, match="finite timeout"):
        wait_until(lambda: True, timeout=timeout, interval=0.1, what="x")


def test_within_says_whether_it_held() -> None:
    assert within(1, lambda: True, interval=0.01, what="x")
    assert not within(0.02, lambda: False, interval=0.01, what="x")

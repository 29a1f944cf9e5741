"""e2e/base.py: a failing test asks its guests whether they still answer,
in the test's own thread (its guests' QEMUs die with it), and a guest that
does not leaves what its vCPUs were doing with the failure."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from avocado.core import exceptions

from memqual.e2e.base import ALIVE_PROBE_S, GuestTest
from memqual.host.core.errors import GuestStopped, Timeout
from memqual.host.core.machine import Machine


class FakeSSH:
    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.asked: list[tuple[list[str], float]] = []

    def run(self, argv: list[str], timeout: float) -> None:
        self.asked.append((argv, timeout))
        if not self.answers:
            raise Timeout("guest command true gave no exit status before its deadline")


class FakeMachine:
    def __init__(self, answers: bool, running: bool = True) -> None:
        self.ssh = FakeSSH(answers)
        self.running = running
        self.ssh_ready = True
        self.read = 0

    def is_running(self) -> bool:
        return self.running

    def stuck_evidence(self) -> str:
        self.read += 1
        return "vCPU 0 halted at native_safe_halt+0xb"


class FakeTest:
    """What GuestTest's watch uses of a test: its guests and its log."""

    def __init__(self, machines: list[FakeMachine]) -> None:
        self._machines = machines
        self.log = logging.getLogger("test")

    def _did_it_stop(self, machine: FakeMachine, failure: Exception) -> str:
        return GuestTest._did_it_stop(cast(GuestTest, self), cast(Machine, machine), failure)


def watched(machines: list[FakeMachine], failure: BaseException) -> Any:
    def method() -> None:
        raise failure

    return GuestTest._watched(cast(GuestTest, FakeTest(machines)), method)


def test_a_guest_that_does_not_answer_after_a_failure_is_read_and_said() -> None:
    """The failure becomes the guest's stop, with what its vCPUs did; a
    guest that answers or has gone adds nothing, and an answering guest
    leaves the failure as it was."""
    stopped, alive, gone = FakeMachine(answers=False), FakeMachine(answers=True), FakeMachine(False, running=False)
    failure = AssertionError("inflate did not reach its target")
    with pytest.raises(GuestStopped) as raised:
        watched([stopped, alive, gone], failure)()
    assert str(raised.value) == (
        "the guest stopped answering: vCPU 0 halted at native_safe_halt+0xb (then: inflate did not reach its target)"
    )
    assert raised.value.__cause__ is failure
    assert stopped.ssh.asked == [(["true"], ALIVE_PROBE_S)] and alive.ssh.asked == [(["true"], ALIVE_PROBE_S)]
    assert (stopped.read, alive.read, gone.read, gone.ssh.asked) == (1, 0, 0, [])
    with pytest.raises(AssertionError) as kept:
        watched([FakeMachine(answers=True)], failure)()
    assert kept.value is failure


@pytest.mark.parametrize("skip", [exceptions.TestCancel("no KVM"), exceptions.TestSkipError("no KVM")])
def test_a_skip_asks_nothing(skip: BaseException) -> None:
    machine = FakeMachine(answers=False)
    with pytest.raises(type(skip)):
        watched([machine], skip)()
    assert machine.ssh.asked == []


def test_the_test_s_own_attributes_stay_on_the_watched_method() -> None:
    """The tags and requirements memqual reads off a test method (REQUIRES,
    measures_nothing) are still there once it is watched."""

    def method() -> None:
        """A test."""

    setattr(method, "marker", "kept")  # noqa: B010 -- an attribute a function has not declared
    wrapped = GuestTest._watched(cast(GuestTest, FakeTest([])), method)
    assert getattr(wrapped, "marker", None) == "kept" and wrapped.__doc__ == "A test." and wrapped() is None

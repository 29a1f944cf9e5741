"""run_signals.signals_held: a signal that lands while the avocado job is being
started waits for the block's end, then reaches the handler it would have
reached (so the caller's finally, which ends the job, sees the job)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from memqual.host.run import signals as run_signals


@pytest.fixture()
def python_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler, whatever this process inherited: a
    suite started in the background of a script inherits SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_sigint")
@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGTERM, run_signals.Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_inside_the_block_is_raised_after_it(sig: int, raised: type[BaseException]) -> None:
    reached_the_end = False
    with run_signals.terminate_as_exception(), pytest.raises(raised):
        with run_signals.signals_held():
            os.kill(os.getpid(), sig)
            # delivered by now were it not held: the main thread runs
            # Python handlers between bytecodes
            for _ in range(1000):
                pass
            reached_the_end = True
    assert reached_the_end


def test_the_handlers_are_given_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in run_signals.HELD_SIGNALS}
    with run_signals.signals_held():
        pass
    assert {sig: signal.getsignal(sig) for sig in run_signals.HELD_SIGNALS} == before


def test_without_a_signal_the_block_ends_quietly() -> None:
    with run_signals.terminate_as_exception(), run_signals.signals_held():
        value = 1
    assert value == 1

"""The Avocado base class of the tests that drive this machine's KSM:
``host_ksm()`` holds host KSM for a scenario (capability checked, the
host-wide KSM lock held, the knobs saved before the first change and put
back after, checked equal to before); a scenario's ``ScenarioFailed``
fails the test and a host short of what it needs skips it.  The knobs go
back in tearDown too, where Avocado's timeout and ^C leave a test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from memqual.e2e.base import GuestTest
from memqual.host.core.environment import KSM_ROOT, THP_ROOT
from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.knobs import Sysfs
from memqual.host.ksm import scenarios as ks
from memqual.host.ksm.controller import KsmController
from memqual.host.ksm.sysfs import THP_KNOBS

LOCK_WAIT_S = 600.0  # another KSM test of this run may hold the lock


class HostKsmTest(GuestTest):
    """Base class; it has no tests of its own."""

    def setUp(self) -> None:
        super().setUp()
        self._controllers: list[KsmController] = []

    def tearDown(self) -> None:
        # Avocado runs the test body in a thread and, on a timeout or ^C,
        # interrupts only the main thread, runs tearDown and leaves the
        # process with os._exit (no atexit, no finally in the test body):
        # tearDown is where host knobs go back on that path.
        for ksm in getattr(self, "_controllers", []):
            ksm.close()
        super().tearDown()

    @contextlib.contextmanager
    def host_ksm(self) -> Iterator[KsmController]:
        """Host KSM for this test: capability checked (skip with the reason),
        the host-wide lock held, knobs checked equal to before at the end;
        what a scenario finds it must fail on (ks.ScenarioFailed) fails the
        test, a host short of what it needs skips it."""
        ksm = KsmController(lock_timeout_s=LOCK_WAIT_S)
        try:
            ksm.open()
        except CapabilityMissing as exc:
            self.require(False, str(exc))
        self._controllers.append(ksm)
        before = (ksm.fs.knobs(), ksm.thp.knobs(THP_KNOBS) if ksm.thp.exists() else {})
        try:
            with self.scenario():
                yield ksm
        finally:
            ksm.close()
        after = (Sysfs(KSM_ROOT).knobs(), Sysfs(THP_ROOT).knobs(THP_KNOBS) if ksm.thp.exists() else {})
        self.assertEqual(after, before, "host KSM/THP knobs not restored")

    @contextlib.contextmanager
    def scenario(self) -> Iterator[None]:
        """A scenario's ScenarioFailed fails the test; its CapabilityMissing
        skips it."""
        try:
            yield
        except ks.ScenarioFailed as exc:
            self.fail(str(exc))
        except CapabilityMissing as exc:
            self.require(False, str(exc))

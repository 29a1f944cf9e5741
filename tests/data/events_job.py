"""A tiny Avocado job for tests/run/test_avocado_events.py: one test that
passes and logs a repeat, one that cancels.  No guest, a second or two."""

from avocado import Test


class Tiny(Test):
    def test_pass(self) -> None:
        self.log.info("repeat 1/2: fine")
        self.log.debug("a debug line the events leave out")

    def test_cancel(self) -> None:
        self.cancel("nothing to measure here")

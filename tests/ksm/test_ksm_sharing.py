"""memqual.host.ksm.sharing: the many-guest model and the settle wait, against a
fake ksmd whose counters follow a script (no guest, no sysfs)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memqual.host.core.errors import Timeout
from memqual.host.ksm.sharing import SharingModel, SharingPoint, settle
from memqual.host.ksm.sysfs import KsmCounters


def point(guests: int, shared: int, sharing: int, merging: tuple[int, ...] = ()) -> SharingPoint:
    return SharingPoint(guests, shared, sharing, merging or (shared + sharing,), full_scans=3, seconds=0.1)


def test_model_from_one_and_two_guests_predicts_more():
    # Measured here: I = 4311, two guests save 23156, three 42015.
    model = SharingModel.fit(point(1, 88, 4311), point(2, 14577, 23156))
    assert model.intra_pages == 4311 and model.common_pages == 23156 - 2 * 4311
    assert model.saved_pages(1) == 4311
    assert model.saved_pages(3) == pytest.approx(42015, rel=0.001)


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 64))
def test_model_recovers_what_it_was_made_of(intra, common, guests):
    truth = SharingModel(float(intra), float(common))
    fitted = SharingModel.fit(point(1, 1, int(truth.saved_pages(1))), point(2, 1, int(truth.saved_pages(2))))
    assert fitted.saved_pages(guests) == pytest.approx(truth.saved_pages(guests))


def test_model_needs_the_one_and_two_guest_points():
    with pytest.raises(ValueError, match="1- and 2-guest"):
        SharingModel.fit(point(2, 1, 1), point(3, 1, 1))
    with pytest.raises(ValueError):
        SharingModel(1.0, 1.0).saved_pages(0)


def test_foreign_pages_are_the_merged_pages_not_ours():
    assert point(2, 100, 300, merging=(200, 200)).foreign_pages == 0
    assert point(2, 100, 300, merging=(150, 150)).foreign_pages == 100
    assert point(1, 0, 256).saved_mib == 1.0


class ScriptedKsm:
    """pages_sharing after each full scan, from a list; time moves 50 ms a scan."""

    def __init__(self, sharing: list[int]) -> None:
        self.sharing = list(sharing)
        self.now = 0.0
        self.scans = 0

    def clock(self) -> float:
        return self.now

    def set(self, **knobs: int | str) -> None:
        pass  # the script is what the knobs gave

    def counters(self) -> KsmCounters:
        value = self.sharing[min(self.scans, len(self.sharing)) - 1] if self.scans else 0
        return KsmCounters(self.now, self.scans, 10, value, 0, 0, None, None, None, None)

    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]:
        return [self.wait_full_scans(1, timeout_s) for _ in range(scans)]

    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = 0.005) -> KsmCounters:
        self.scans += n
        self.now += 0.05 * n
        return self.counters()


def test_settle_waits_for_quiet_scans_not_the_first_still_ones():
    # Still at 0 while the new guest's pages are checksummed, then growing,
    # then still: zero does not count as settled.
    ksm = ScriptedKsm([0, 0, 0, 500, 900, 1000, 1001, 1000, 1002, 1002])
    p = settle(ksm, lambda: [600, 600], 2, timeout_s=10, quiet_scans=3, clock=ksm.clock)
    assert p.pages_sharing == 1002 and p.full_scans == 9 and p.merging == (600, 600)
    assert p.seconds == pytest.approx(0.45)


def test_settle_times_out_with_the_last_readings():
    ksm = ScriptedKsm(list(range(100, 100000, 100)))  # never still
    with pytest.raises(Timeout, match="did not settle with 3 guests"):
        settle(ksm, lambda: [1], 3, timeout_s=1.0, quiet_scans=2, clock=ksm.clock)

"""./run-tests' e2e order (tests/support/e2e_order.py): the tests that hold
the measurement lock shared first, then the first that holds it alone, then
those that hold none for their run, then the others that hold it alone,
each group in Avocado's order; each reference selects its one test."""

from __future__ import annotations

import re

import avocado
import e2e_order
import pytest
from e2e_order import Group

from memqual.e2e.base import GuestTest, measures_nothing


def classes() -> dict[str, type]:
    """Test classes of each kind, made here: pytest would collect them (as
    unittest cases) if they were the module's."""

    class Measures(GuestTest):
        def test_x(self) -> None: ...

    class MeasuresNothing(GuestTest):
        @measures_nothing
        def test_x(self) -> None: ...

    class CountsItsGuests(GuestTest):
        counts_only_its_guests = True

        def test_x(self) -> None: ...

    class NoGuestTest(avocado.Test):
        def test_x(self) -> None: ...

    class NoGuestTestAlone(avocado.Test):
        holds_the_lock_alone = True

        def test_x(self) -> None: ...

    return {c.__name__: c for c in (Measures, MeasuresNothing, CountsItsGuests, NoGuestTest, NoGuestTestAlone)}


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        ("Measures", Group.ALONE),
        ("MeasuresNothing", Group.BESIDE_OTHERS),
        ("CountsItsGuests", Group.BESIDE_OTHERS),
        ("NoGuestTest", Group.NO_LOCK),
        ("NoGuestTestAlone", Group.ALONE),
    ],
)
def test_a_test_s_group_is_its_hold_on_the_lock(cls: str, expected: Group) -> None:
    assert e2e_order.group(classes()[cls], "test_x") == expected


def test_the_shared_ones_first_then_one_alone_then_their_own_lock_then_alone_each_in_avocado_s_order() -> None:
    listed = [
        "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g",
        "e2e/test_balloon.py:BalloonCorrectness.test_correctness",
        "e2e/test_boot.py:Boot.test_ssh_echo_memory_cpus_drivers",
        "e2e/test_boot.py:Boot.test_guest_clock_runs_at_the_hosts_rate",
        "e2e/test_host_under_test.py:HostUnderTestClock.test_l1s_kvm_runs_the_guest_with_the_parameters_asked",
        "e2e/test_hosts.py:LabHosts.test_check_run_and_a_host_lost",
        "e2e/test_ksm.py:KsmTest.test_merge",
        "e2e/test_memslots_kvm.py:MemslotsKvm.test_errnos_and_slot_operation_times",
    ]
    assert e2e_order.ordered(listed) == [
        "e2e/test_balloon.py:BalloonCorrectness.test_correctness",
        "e2e/test_boot.py:Boot.test_ssh_echo_memory_cpus_drivers",
        "e2e/test_host_under_test.py:HostUnderTestClock.test_l1s_kvm_runs_the_guest_with_the_parameters_asked",
        "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g",
        "e2e/test_hosts.py:LabHosts.test_check_run_and_a_host_lost",
        "e2e/test_boot.py:Boot.test_guest_clock_runs_at_the_hosts_rate",
        "e2e/test_ksm.py:KsmTest.test_merge",
        "e2e/test_memslots_kvm.py:MemslotsKvm.test_errnos_and_slot_operation_times",
    ]


NAMES = ["KsmTest.test_merge", "KsmTest.test_merge_off", "HostKsmTest.test_merge", "Boot.test_x", "Boot.test_x2"]


@pytest.mark.parametrize("name", NAMES)
def test_a_reference_selects_its_test_alone(name: str) -> None:
    # Avocado searches the part after the colon in "Class.method".
    path, _, pattern = e2e_order.reference(f"e2e/test_a.py:{name}").partition(":")
    assert path == "e2e/test_a.py"
    assert [n for n in NAMES if re.search(pattern, n)] == [name]


def test_a_listing_that_fails_leaves_avocado_s_own_order(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails() -> list[str]:
        raise OSError("no avocado here")

    monkeypatch.setattr(e2e_order, "listed", fails)
    assert e2e_order.main() == 0
    out, err = capsys.readouterr()
    assert out.split() == ["e2e/"]
    assert err.startswith("e2e_order: no avocado here")

"""Which scenario rows, and so which e2e tests, run under a host under test
(host/judge/host_under_test_plan.py), over the real rows and made-up ones."""

from __future__ import annotations

import pytest

from memqual.host.core import scenario
from memqual.host.core.knobs import KnobSet
from memqual.host.core.primary import GUEST_CLOCK, HOST_WALL, Primary
from memqual.host.judge import host_under_test_plan as plan


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        # every primary on its guests' own clock, no knob: it runs there
        ("fault.anon", ""),
        ("balloon.inflate", ""),
        ("balloon.request_size", ""),
        # its row says so: KSM on L1's ksmd, the guest's own ksmd
        ("ksm.merge", ""),
        ("ksm.integrity", ""),
        ("ksm.volatile_scan", ""),
        ("ksm.guest_merge", ""),
        # its row says so: the balloon on L1's huge page pool
        ("hugetlbfs.balloon", ""),
        # its row says so: free page reporting's RSS watched in L1, on L1's clock
        ("balloon.free_page_reporting", ""),
        # its row says so: L1's ksmd, over L1's pool / watched in one command in L1
        ("hugetlbfs.ksm", ""),
        ("ksm.advisor", ""),
        # its row says so: virtio-mem timed by the guest alone, on L1's clock
        ("virtio_mem.resize", ""),
        # its row says why not, in its own words
        ("ksm.many_guests", "it shares one host's ksmd among three guests, and a host under test runs one"),
        (
            "memslots.kvm",
            "it drives this machine's /dev/kvm from memqual's Python; in L1 memslots.kvm_l1 runs the same slot "
            "operations",
        ),
        # its row says so: the same slot operations in L1, on L1's clock
        ("memslots.kvm_l1", ""),
    ],
)
def test_a_row_runs_under_a_host_under_test_or_says_why_not(row: str, reason: str) -> None:
    found = scenario.find(row)
    assert found is not None
    assert plan.why_not(found) == reason
    assert (found.e2e in plan.tests()) == (not reason)


def test_the_tests_that_run_there_are_the_rows_that_do() -> None:
    assert sorted(plan.tests()) == [
        "test_balloon:BalloonFreePageReporting.test_reporting_on",
        "test_balloon:BalloonTiming.test_inflate_deflate_1g",
        "test_balloon_driver:BalloonDriver.test_request_size",
        "test_fault:FaultTest.test_anon",
        "test_hugetlbfs:HugetlbfsTest.test_balloon",
        "test_hugetlbfs:HugetlbfsTest.test_ksm_merges_nothing",
        "test_ksm:KsmTest.test_guest_ksm",
        "test_ksm:KsmTest.test_integrity",
        "test_ksm:KsmTest.test_merge",
        "test_ksm:KsmTest.test_volatile_scan_4k",
        "test_ksm_advisor:KsmAdvisorTest.test_advisor",
        "test_memslots_l1:MemslotsKvmInL1.test_errnos_and_slot_operation_times",
        "test_virtio_mem:VirtioMem.test_resize_timing",
    ]
    assert plan.tests() < plan.row_tests()


def _row(name: str, **fields: object) -> scenario.Scenario[object]:
    return scenario.Scenario(name, e2e="test_x:X.test_x", **fields)  # type: ignore[arg-type]  # the fields as given


GUEST_TIMED = (Primary("t_s", "timed by the guest", instrument=GUEST_CLOCK),)
HOST_TIMED = (Primary("t_s", "timed by the host", instrument=HOST_WALL),)


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ((_row("x.a", primaries=GUEST_TIMED),), ""),
        ((_row("x.a", primaries=GUEST_TIMED), _row("x.b", primaries=GUEST_TIMED)), ""),
        # a sibling of its test that reads the host holds it back
        (
            (_row("x.a", primaries=GUEST_TIMED), _row("x.b", primaries=HOST_TIMED)),
            "its test records x.b too, and its t_s is a host wall clock read on this machine",
        ),
        ((_row("x.a", primaries=GUEST_TIMED, knobs=(KnobSet("k", "k knobs", ()),)),), "it sets this machine's k knobs"),
        ((_row("x.a", primaries=HOST_TIMED, on_a_host_under_test=True),), ""),
        ((scenario.Scenario("x.a", primaries=GUEST_TIMED),), "no e2e test records it"),
    ],
)
def test_a_test_runs_there_only_when_every_row_it_records_does(
    rows: tuple[scenario.Scenario[object], ...], reason: str
) -> None:
    found = plan.why_not(rows[0], rows)
    assert found.startswith(reason) and bool(found) == bool(reason)


def test_a_row_s_own_reason_comes_first_and_a_test_is_skipped_in_its_words() -> None:
    """A row that says why not is off a host under test whatever its
    instruments are; a row is on it or off it with a reason, never both;
    a test's reason is its row's."""
    guest_timed = _row("x.a", primaries=GUEST_TIMED, off_a_host_under_test="it needs two hosts")
    assert plan.why_not(guest_timed, (guest_timed,)) == "it needs two hosts"
    with pytest.raises(ValueError, match="not both"):
        _row("x.b", on_a_host_under_test=True, off_a_host_under_test="no")
    floor = scenario.find("balloon.floor")
    assert floor is not None and plan.reason_for(floor.e2e) == floor.off_a_host_under_test
    assert "stall of this machine's wall clock" in floor.off_a_host_under_test
    assert plan.reason_for("test_fault:FaultTest.test_anon") == "" == plan.reason_for("test_x:X.test_nobody_names")

"""e2e and a host patch's scope agree on which tests run under a host under
test: GuestTest asks the rows (host/judge/host_under_test_plan.py), and no
test a row names says otherwise itself (``@drives_its_host``, a class
counting only its guests' instructions).  Over the tests ``avocado list
e2e/`` finds (tests/support/e2e_order.py)."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import e2e_order
import pytest

from memqual.e2e import base
from memqual.host.core import scenario
from memqual.host.judge import host_under_test_plan as plan


@functools.cache
def listed() -> dict[str, tuple[type, str]]:
    """Every test method avocado lists, by the rows' name for it."""
    found: dict[str, tuple[type, str]] = {}
    for name in e2e_order.listed():
        path, _, test = name.partition(":")
        class_name, _, method = test.partition(".")
        cls = getattr(importlib.import_module(f"memqual.e2e.{Path(path).stem}"), class_name)
        found[base.reference_in(cls, method)] = (cls, method)
    return found


needs_avocado = pytest.mark.skipif(not e2e_order.AVOCADO.exists(), reason="avocado is not installed in this virtualenv")


@needs_avocado
def test_every_row_names_a_test_avocado_lists() -> None:
    missing = sorted(row.name for row in scenario.table() if row.e2e and row.e2e not in listed())
    assert not missing


@needs_avocado
def test_e2e_runs_under_a_host_under_test_what_the_rows_say_and_nothing_else_of_theirs() -> None:
    """A row's test runs there exactly when the plan says so, and the marks
    that let a test no row names run there are on no row's test."""
    assert plan.tests(), "the plan names no test: nothing to agree on"
    for reference, (cls, method) in listed().items():
        if reference not in plan.row_tests():
            continue
        marked = getattr(getattr(cls, method), base.DRIVES_THE_HOST_UNDER_TEST, False)
        assert not marked, f"{reference}: a row's test is not @drives_its_host; its row says it (on_a_host_under_test)"
        counts = getattr(cls, "counts_only_its_guests", False)
        assert not counts, f"{reference}: a row's test's class does not count only its guests"
        assert base.runs_under_a_host_under_test(cls, method) == (reference in plan.tests()), reference


@needs_avocado
def test_the_tests_no_row_names_that_run_there_say_so_themselves() -> None:
    """What runs there beside the rows' tests: the host under test's own
    checks (a class counting its guests' instructions), and, ``@drives_its_host``,
    the THP variant of the volatile scan and free page reporting's control
    (its RSS read in L1)."""
    marked = ("test_ksm:KsmTest.test_volatile_scan_thp", "test_balloon:BalloonFreePageReporting.test_reporting_off")
    theirs = sorted(
        reference
        for reference, (cls, method) in listed().items()
        if reference not in plan.row_tests() and base.runs_under_a_host_under_test(cls, method)
    )
    assert set(marked) <= set(theirs)
    assert all(r in marked or r.startswith(("test_host_under_test:", "test_memslots_l1:")) for r in theirs), theirs


@needs_avocado
@pytest.mark.parametrize(
    ("reference", "host", "why"),
    [
        # no GuestTest: the /dev/kvm benchmarks skip by the rows' rule too,
        # in their row's words (what runs in L1 instead)
        (
            "test_memslots_kvm:MemslotsKvm.test_lookup_cost_by_slot_count",
            "6.1.0-57-amd64",
            "memqual memslots kvm --lookup --host-kernel",
        ),
        ("test_memslots_kvm:MemslotsKvm.test_lookup_cost_by_slot_count", "", ""),
        ("test_fault:FaultTest.test_anon", "6.1.0-57-amd64", ""),
        ("test_ksm:KsmTest.test_many_guests", "6.1.0-57-amd64", "a host under test runs one"),
        ("test_ksm:KsmTest.test_volatile_scan_thp", "6.1.0-57-amd64", ""),
    ],
)
def test_a_test_off_the_host_under_test_says_why(reference: str, host: str, why: str) -> None:
    reason = base.skipped_under(host, *listed()[reference])
    assert bool(reason) == bool(why)
    if why:
        assert reason.startswith(f"not on the host under test ({host}): ") and why in reason
        assert reason.endswith("run it without --host-kernel")

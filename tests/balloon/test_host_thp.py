"""The host's THP counters around a balloon move: parsed from /proc/vmstat,
differenced, read over L1's shell, carried by the guest-timed records."""

from __future__ import annotations

import dataclasses

import pytest

from memqual.host.balloon import host_thp
from memqual.host.core.errors import GuestError
from memqual.host.core.ssh import CommandResult

VMSTAT = """nr_free_pages 12345
thp_fault_alloc 10
thp_fault_fallback 1
thp_split_pmd 7
thp_split_page 2
thp_collapse_alloc 3
compact_stall 0
"""


def test_every_counter_is_read_and_one_a_kernel_lacks_is_zero() -> None:
    read = host_thp.parse_vmstat(VMSTAT, "here")
    assert list(read) == list(host_thp.THP_COUNTERS)
    assert read["thp_split_pmd"] == 7
    assert read["thp_deferred_split_page"] == 0  # not in this text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("nr_free_pages 1\n", "none of the THP counters"),
        ("thp_split_pmd seven\n", "thp_split_pmd is not a count"),
    ],
)
def test_a_vmstat_that_is_not_one_is_refused_naming_where(text: str, says: str) -> None:
    with pytest.raises(GuestError, match=says) as raised:
        host_thp.parse_vmstat(text, "L1's vmstat")
    assert "L1's vmstat" in str(raised.value)


def test_the_difference_is_each_counter_s_move() -> None:
    before = host_thp.parse_vmstat(VMSTAT, "x")
    after = {**before, "thp_split_pmd": 19, "thp_collapse_alloc": 4}
    moved = host_thp.difference(before, after)
    assert moved["thp_split_pmd"] == 12
    assert moved["thp_collapse_alloc"] == 1
    assert sum(moved.values()) == 13


@dataclasses.dataclass
class FakeShell:
    status: int = 0
    argv: list[list[str]] = dataclasses.field(default_factory=list)

    def run(self, argv: list[str], timeout: float, check: bool = True) -> CommandResult:
        self.argv.append(argv)
        return CommandResult(argv, self.status, VMSTAT if self.status == 0 else "", "no such file", 0.01)


def test_l1_s_counters_are_one_cat_of_its_vmstat_and_a_failure_says_so() -> None:
    shell = FakeShell()
    assert host_thp.l1_thp_reader(shell)()["thp_fault_alloc"] == 10  # type: ignore[arg-type]  # the fake shell runs only what the reader asks
    assert shell.argv == [["cat", "/proc/vmstat"]]
    with pytest.raises(GuestError, match="cannot read the host under test's /proc/vmstat"):
        host_thp.l1_thp_reader(FakeShell(status=1))()  # type: ignore[arg-type]  # the fake shell runs only what the reader asks

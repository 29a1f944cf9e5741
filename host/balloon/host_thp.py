"""The host's transparent huge page events around a balloon move: the
THP counters of /proc/vmstat, read before and after it in the host that
backs the guest's memory.  Under a host under test an inflate is mostly
L1's work, and how much of the guest's memory L1 backs with huge pages
(each the inflate's 4 KiB madvise splits; khugepaged collapses them at
points of L1's clock no boot repeats) changes that work: the counters say
what the host did with its huge pages in each timed move.
"""

from __future__ import annotations

from collections.abc import Callable

from memqual.host.core.errors import GuestError
from memqual.host.core.shell import Shell

# The counters that move with a guest's memory being split, refaulted or
# collapsed in the host (Documentation/admin-guide/mm/transhuge.rst).
THP_COUNTERS = (
    "thp_fault_alloc",
    "thp_fault_fallback",
    "thp_split_pmd",
    "thp_split_page",
    "thp_deferred_split_page",
    "thp_collapse_alloc",
    "compact_stall",
)
READ_TIMEOUT_S = 30.0

ThpReader = Callable[[], dict[str, int]]


def parse_vmstat(text: str, where: str) -> dict[str, int]:
    """THP_COUNTERS from /proc/vmstat's ``name value`` lines; a kernel
    without one of them has it as 0 (older kernels lack some)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in THP_COUNTERS:
            try:
                found[name] = int(value)
            except ValueError:
                raise GuestError(f"{where}: {name} is not a count: {value!r}") from None
    if not found:
        raise GuestError(f"{where} has none of the THP counters: {text[:200]!r}")
    return {name: found.get(name, 0) for name in THP_COUNTERS}


def difference(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What each counter moved by between two readings."""
    return {name: after[name] - before[name] for name in THP_COUNTERS}


def l1_thp_reader(shell: Shell) -> ThpReader:
    """The THP counters of a host under test (L1), one ``cat`` over its
    shell: a read around a move, never inside one (each command is L1's
    work at a moment this machine paces)."""
    where = "the host under test's /proc/vmstat"

    def read() -> dict[str, int]:
        out = shell.run(["cat", "/proc/vmstat"], timeout=READ_TIMEOUT_S, check=False)
        if out.status != 0:
            raise GuestError(f"cannot read {where}: {out.stderr[-200:]!r}")
        return parse_vmstat(out.stdout, where)

    return read

"""What a comparison decides a scenario on, as its row (host/core/scenario.py)
carries it: each primary metric, what reads it on each clock (its
instrument, and ``on_icount`` where the guest's own figure decides it
there), its block spreads as measured (``Spread``, ``Measured``: its
command and date), its equivalence margin (about 1 % where the spread
allows, else 5 %; 2 % on a host under test whose spread allows it) and
what would decide it where its spread is too wide; and the regime a
scenario's metrics compare under (``Regime``).  The judge reads them from
the table (host/judge/primaries.py, host/judge/regime.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

# What reads a primary.
GUEST_CLOCK = "guest clock"  # timed in the guest: time on wall, guest instructions on icount
HOST_WALL = "host wall clock"  # timed by the host (QMP polls, /proc reads): wall time on every clock
HOST_CPU = "host CPU time"  # a host thread's CPU time (ksmd): the host's work, on every clock
COUNT = "count"  # pages, MiB, tree nodes: no clock at all
INSTRUMENTS = (GUEST_CLOCK, HOST_WALL, HOST_CPU, COUNT)

# A margin of about 1 % where the spread allows it, 5 % otherwise.  The
# spread allows 1 % when equivalence there is shown in about 6 blocks
# (alpha 0.01 a side, power 0.8: n = (3.17 sd / margin)^2).
TIGHT_MARGIN = 0.01
WIDE_MARGIN = 0.05
TIGHT_SPREAD_MAX = 0.0075
# On a host under test (L1's clock) a boot of L1 spreads a block by 1-1.5 %
# (docs/host-under-test.md): 2 % there, the margin equivalence shows in
# about 6 blocks at spreads up to 1.5 % by the same rule ((3.17 x 1.5 /
# 2)^2 = 5.7), where 1 % would take 20 and 5 % would call a 4 % step of
# the host's work undecided.
MID_MARGIN = 0.02
MID_SPREAD_MAX = 0.015
# Half a percent, for a guest-timed figure that repeats within a few parts
# in 10,000 on icount: there a 1 % change must be called slower, and a
# change is called so only when its estimate is beyond the margin (at a 1 %
# margin a true 1 % change would be, half the time).
FINE_MARGIN = 0.005

DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclasses.dataclass(frozen=True)
class Measured:
    """The run that measured a spread: what it was, the command (then
    ``python -m memqual.lab.block_spread OUT --jobs`` on its output, unless
    it says otherwise), the day it ran (UTC) and where it is written up."""

    what: str
    command: str
    date: str  # YYYY-MM-DD
    doc: str

    def __post_init__(self) -> None:
        if not DATE.fullmatch(self.date):
            raise ValueError(f"measured run {self.what!r}: date {self.date!r} is not YYYY-MM-DD")
        if not self.command.startswith("memqual run "):
            raise ValueError(f"measured run {self.what!r}: give the memqual run command that measured it")


@dataclasses.dataclass(frozen=True)
class Spread:
    """A measured block spread: the sd of log(B/A) over ``blocks`` blocks,
    from ``run``; ``how`` says how the figure came from the run's blocks
    where it is not simply their sd (pooled over runs, a subset)."""

    sd: float
    blocks: int
    run: Measured
    how: str = ""

    @property
    def source(self) -> str:
        return f"{self.run.what}, {self.run.date}, {self.run.doc}"


@dataclasses.dataclass(frozen=True)
class Primary:
    """One primary: a metric of its scenario's records, in the variants
    whose items include ``variant`` (empty: every variant), and why it is
    watched; what reads it (``instrument``), the metric that decides it on
    the icount clock where another one does (``on_icount``, read by the
    guest clock) and on a host under test (``on_host_under_test``), the
    spreads measured on each clock, its equivalence margin, and what would
    decide it where its spread is too wide (``needs``).  ``scenario`` is
    its row's name, set by the row."""

    metric: str
    why: str
    variant: tuple[tuple[str, Any], ...] = ()
    instrument: str = HOST_WALL
    on_icount: str = ""
    # The metric that decides it where its guests ran on a host under test
    # (both arms, or the one run): the same figure read in L1 on L1's clock
    # where ``metric`` is read on this machine, which is not the host the
    # guest ran on.  Its spread there is ``spread_host_under_test``.
    on_host_under_test: str = ""
    spread_wall: Spread | None = None
    spread_icount: Spread | None = None
    # The block spread on a host under test's clock (L1's instructions,
    # its guest-timed figure: host/core/nested.py), where measured: there
    # the host's work for the guest is in the figure, and so is what no
    # boot of L1 repeats.
    spread_host_under_test: Spread | None = None
    margin: float = WIDE_MARGIN
    # The margin on the icount clock where its spread there allows a
    # tighter one than the wall clock's (None: ``margin`` on every clock).
    margin_icount: float | None = None
    # The margin where both arms ran on a host under test, from its
    # ``spread_host_under_test`` (None: its icount margin there too).
    margin_host_under_test: float | None = None
    needs: str = ""
    scenario: str = ""

    def __post_init__(self) -> None:
        if self.instrument not in INSTRUMENTS:
            raise ValueError(f"primary {self.metric}: instrument {self.instrument!r} is not one of {INSTRUMENTS}")

    def metric_on(self, clock: str = "", host_under_test: bool = False) -> str:
        """The metric that decides this primary on ``clock`` (a label:
        wall, icount:SHIFT; empty: wall), on a host under test where
        ``host_under_test``."""
        if host_under_test and self.on_host_under_test:
            return self.on_host_under_test
        return self.on_icount if self.on_icount and clock.startswith("icount") else self.metric

    def named(self, clock: str = "", host_under_test: bool = False) -> str:
        """Its metric on ``clock`` and, where it has one, its variant: one
        metric can be two primaries of two variants."""
        metric = self.metric_on(clock, host_under_test)
        items = ", ".join(f"{key}={value}" for key, value in self.variant)
        return f"{metric} [{items}]" if items else metric

    def instrument_on(self, clock: str = "") -> str:
        return GUEST_CLOCK if self.on_icount and clock.startswith("icount") else self.instrument

    def margin_on(self, clock: str = "", host_under_test: bool = False) -> float:
        """The equivalence margin it is judged against on ``clock``, on a
        host under test where ``host_under_test`` (both arms ran on one:
        its own spread there sets it, on icount, the clock it was measured on)."""
        on_icount = clock.startswith("icount")
        if host_under_test and on_icount and self.margin_host_under_test is not None:
            return self.margin_host_under_test
        if self.margin_icount is not None and on_icount:
            return self.margin_icount
        return self.margin

    def spread_on(self, clock: str = "") -> Spread | None:
        return self.spread_icount if clock.startswith("icount") else self.spread_wall

    def reads(self, clock: str = "") -> str:
        """What the deciding figure counts on ``clock``, in words."""
        instrument = self.instrument_on(clock)
        if instrument == GUEST_CLOCK:
            return "guest instructions (the guest's icount clock)" if clock.startswith("icount") else "guest time"
        if instrument == COUNT:
            return "a count: no clock"
        return f"{instrument}: the host's load is in it on every clock"

    def matches(
        self, metric: str, variant: Mapping[str, Any] | None, clock: str = "", host_under_test: bool = False
    ) -> bool:
        """Whether a record of its scenario with ``metric`` and ``variant``,
        read on ``clock`` (on a host under test where ``host_under_test``),
        is this primary's."""
        if metric != self.metric_on(clock, host_under_test):
            return False
        given = variant or {}
        return all(key in given and given[key] == value for key, value in self.variant)


@dataclasses.dataclass(frozen=True)
class Regime:
    """A condition a scenario's metrics hold under, and the metric that
    records it: two runs compare only where it matches (host/judge/regime.py;
    docs/verdicts.md, "Not comparable: regimes").  ``scenario`` is its
    row's name, set by the row."""

    metric: str  # one value a unit (a guest), in each run
    label: str  # what the reader calls it
    unit: str
    tolerance: float  # largest ratio of the two sides' geometric means that matches
    # Variant keys that do not change the regime (both of a guest's smart
    # scan windows ran at the same dirtying): the rate is recorded without them.
    free_keys: tuple[str, ...] = ()
    scenario: str = ""


# The runs that measured several subjects' spreads at once: each subject's
# rows name them beside their own (host/<subject>/table.py).
WALL_AA = Measured(
    "A/A 6.1.0-57, wall clock, one guest a block and arm, load 2-10",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.1.0-57-amd64 (its other options not recorded)",
    "2026-12-02",
    'docs/ab-calibration.md, "Block-to-block spread, and what it can decide"',
)
# The near-deterministic counts from two blocks of 6.1 against 6.12: no
# A/A; the spread of their log(B/A) stands for an A/A's.
WALL_612 = Measured(
    "6.1 against 6.12 (no A/A), wall clock, 2 blocks",
    "memqual run --debian-kernel 6.1.0-57-amd64 --debian-kernel 6.12.111+deb12-amd64 --until-decided --budget 25",
    "2026-12-02",
    "docs/results/2026-12-02-kernels-6.1-vs-6.12.md",
)
# The A/A on a host under test of the rows whose tests run there beside
# the balloon's timing and KSM's volatile scan (those have their own).
L1_AA_GUESTS = Measured(
    "A/A 6.12.111 as the host under test (L1 on icount:0), 6 blocks: the request size, the fault, KSM's merges",
    "memqual run --host-kernel 6.12.111+deb12-amd64 --host-kernel 6.12.111+deb12-amd64 --clock icount "
    "--only fault --only balloon-driver --only ksm-merge --rounds 6 --output OUT",
    "2026-12-07",
    'docs/host-under-test.md, "A/A on L1: the request size, the fault and KSM\'s merges"',
)
# The A/A on a host under test of the two rows whose figure read on this
# machine is not the guest's host's there: free page reporting's RSS
# return and the hugetlbfs balloon's inflate, each read in L1 instead.
L1_AA_READ_IN_L1 = Measured(
    "A/A 6.1.0-57 as the host under test (L1 on icount:0), 6 blocks: free page reporting and the hugetlbfs "
    "balloon, each timed in L1",
    "memqual run --host-kernel 6.1.0-57-amd64 --host-kernel 6.1.0-57-amd64 --clock icount "
    "--only free-page-reporting --only hugetlbfs --rounds 6 --output OUT",
    "2026-12-07",
    'docs/host-under-test.md, "Figures read in L1 decide there"',
)
# Free page reporting's A/A on a host under test, L1 booted with THP off
# (the test's boot knob there since): its RSS return and the passes' work.
L1_AA_REPORTING = Measured(
    "A/A 6.1.0-57 as the host under test (L1 on icount:0, THP off in L1), 6 blocks: free page reporting, "
    "timed and its passes' work read in L1",
    "memqual run --host-kernel 6.1.0-57-amd64 --host-kernel 6.1.0-57-amd64 --clock icount "
    "--only free-page-reporting --rounds 6 --output OUT",
    "2026-12-07",
    'docs/host-under-test.md, "Free page reporting on L1\'s clock"',
)
# What a host-timed primary's ``needs`` says on a shared TCG host.
QUIET_OR_KVM = (
    "timed by the host: on a shared TCG host the host's load spreads it on every clock; a quiet host or KVM "
    "would decide it"
)

"""What a ``--budget`` promises, and how a run keeps it: before it starts,
a run whose once-per-arm checks and first blocks cannot fit is refused
(bad input, naming the ``--budget`` or the ``--only`` that would fit, from
host/run/block_costs.py); once running, the checks that no longer fit in
what is left are not run, and say why.  The looks add no block they cannot
finish (host/run/ab_run.py).

Why it is built so: docs/architecture.md, "Module notes", host/run/budget.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from memqual.host.core import scenario
from memqual.host.core.errors import BadInput
from memqual.host.core.profiles import AB, AB_TAG
from memqual.host.judge import clock_plan
from memqual.host.run import block_costs, blocks
from memqual.host.run.config import RunConfig

if TYPE_CHECKING:
    from rich.console import Console

# The budget's greatest, as --budget takes it (host/cli/run.py).
MAX_BUDGET_MIN = 24 * 60


@dataclasses.dataclass(frozen=True)
class TestCost:
    """One test of a block as the estimate counts it."""

    name: str  # avocado's (e2e/test_x.py:Class.test_y)
    subject: str  # its scenario rows' subject ("" for none)
    run_s: float | None  # one run on its clock; None: not measured there
    together: bool  # A and B of a block side by side (icount, sharing the host)

    @property
    def block_s(self) -> float:
        """Its part of one block: A and B, one after the other or side by side."""
        return (self.run_s or 0.0) * (1 if self.together else 2)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What a run's first blocks and its once-per-arm checks take, about."""

    tests: tuple[TestCost, ...]
    checks: tuple[tuple[str, str], ...]  # (name, subject) of each check
    blocks: int  # the first blocks (--rounds), one job
    checks_icount: bool  # the checks run on icount (else the wall clock)
    factor: float = 1.0  # a host under test's (block_costs.HOST_UNDER_TEST_FACTOR)
    clock: str = ""  # the run's clock, as the line names it

    def of(self, subjects: set[str] | None = None) -> tuple[list[TestCost], int]:
        """The tests and the number of checks ``--only`` of ``subjects``
        would keep (None: the run as it is)."""
        if subjects is None:
            return list(self.tests), len(self.checks)
        return [t for t in self.tests if t.subject in subjects], sum(1 for _, s in self.checks if s in subjects)

    def blocks_s(self, subjects: set[str] | None = None) -> float:
        tests, _ = self.of(subjects)
        if not tests:
            return 0.0
        one = self.factor * sum(t.block_s for t in tests) + blocks.job_overhead_s(2 * len(tests))
        return self.blocks * one

    def checks_s(self, subjects: set[str] | None = None) -> float:
        return blocks.checks_reserve_s(self.of(subjects)[1], self.checks_icount)

    def total_s(self, subjects: set[str] | None = None) -> float:
        return self.blocks_s(subjects) + self.checks_s(subjects)

    def unmeasured(self) -> list[str]:
        return sorted(t.name for t in self.tests if t.run_s is None)


def subject_of_test(reference: str) -> str:
    """The subject whose scenario rows name the test ``reference``
    (``test_file_stem:Class.method``), else the subject of the rows whose
    tests live in its file (a check of theirs), else ""."""
    rows = scenario.table()
    for row in rows:
        if row.e2e == reference:
            return row.subject
    stem = reference.partition(":")[0]
    return next((row.subject for row in rows if row.e2e.partition(":")[0] == stem), "")


def estimate(config: RunConfig, block_tests: Iterable[str], checks: Iterable[str], slots: int) -> Estimate:
    """The measured cost of the run's first blocks of ``block_tests`` and
    of its ``checks`` (avocado's names), each test on the clock ``config``
    gives it, those that share the host on icount with A and B side by
    side when ``slots`` allows."""
    on_hosts_icount = bool(config.hosts) and config.clock.icount
    tests = []
    for name in block_tests:
        reference = blocks.row_reference(name)
        on = clock_plan.for_test(reference, config.clock)
        together = slots > 1 and (on_hosts_icount or clock_plan.runs_beside_others(reference, config.clock))
        tests.append(TestCost(name, subject_of_test(reference), block_costs.run_s(reference, on.icount), together))
    return Estimate(
        tuple(tests),
        tuple((name, subject_of_test(blocks.row_reference(name))) for name in checks),
        config.rounds,
        config.clock.icount,
        block_costs.HOST_UNDER_TEST_FACTOR if config.hosts else 1.0,
        config.clock.label,
    )


def whole_subjects(found: Estimate) -> list[str]:
    """The subjects ``--only SUBJECT`` would select exactly as this run
    has them: every one of their rows of the ab profile has its test
    here, and the subject is a tag of its rows."""
    listed = {blocks.row_reference(t.name) for t in found.tests}
    out = []
    for subject in sorted({t.subject for t in found.tests if t.subject}):
        rows = [r for r in scenario.table() if r.subject == subject and AB_TAG in r.tags and r.e2e]
        if rows and all(r.e2e in listed and subject in r.tags for r in rows):
            out.append(subject)
    return out


def fitting_subjects(found: Estimate, budget_s: float) -> list[str]:
    """The most subjects, cheapest first, whose first blocks and checks
    alone fit ``budget_s`` (empty: none does, or the run is not the ab
    profile's, whose rows say which tests a subject has)."""
    chosen: list[str] = []
    for subject in sorted(whole_subjects(found), key=lambda s: (found.total_s({s}), s)):
        if found.total_s({*chosen, subject}) <= budget_s:
            chosen.append(subject)
    return chosen


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def refusal(found: Estimate, budget_min: float, profile: str) -> str | None:
    """The one line that refuses a run whose checks and first blocks
    cannot fit ``budget_min``, with their measured cost and the budget
    (and, in the ab profile, the ``--only`` subjects) that would fit; None
    when they fit."""
    total = found.total_s()
    if total <= budget_min * 60:
        return None
    tests, checks = found.of()
    parts = [f"the {checks} once-per-arm checks (about {minutes(found.checks_s())})"] if checks else []
    parts.append(f"the first {found.blocks} blocks of {len(tests)} tests (about {minutes(found.blocks_s())})")
    unmeasured = found.unmeasured()
    what = (
        f"--budget {budget_min:g} min cannot hold this run: {' and '.join(parts)} take about {minutes(total)} on "
        f"{found.clock} (estimates measured {block_costs.MEASURED_ON}, host/run/block_costs.py"
        + (f"; {len(unmeasured)} test(s) not measured on their clock, not counted" if unmeasured else "")
        + (f"; {found.factor:g} times under a host under test" if found.factor != 1.0 else "")
        + ")"
    )
    fix = f"give --budget {min(MAX_BUDGET_MIN, math.ceil(total / 60))}"
    subjects = fitting_subjects(found, budget_min * 60) if profile == AB else []
    if subjects:
        only = " ".join(f"--only {s}" for s in subjects)
        fix += f", or {only} (about {minutes(found.total_s(set(subjects)))})"
    return f"{what}; {fix}"


def refuse_unfit(config: RunConfig, accel: str, listing: Callable[[RunConfig], list[str] | None]) -> Estimate | None:
    """Refuse (BadInput, one line) a run with --until-decided whose checks
    and first blocks cannot fit its budget, before anything is built or
    run.  ``listing`` lists a job's tests (avocado list).  Nothing is
    checked without --until-decided, under KVM (no cost there is measured:
    TCG's would refuse runs KVM holds), or when avocado cannot list the
    tests; the run's own rules then keep the budget alone."""
    if not config.until_decided or (accel == "kvm" and not config.hosts):
        return None
    listed = {}
    for selection in ("blocks", "once"):
        scoped = config.scope.references(selection) if config.scope is not None else ()
        listed[selection] = listing(dataclasses.replace(config, selection=selection, references=scoped))
        if listed[selection] is None:
            return None
    found = estimate(config, listed["blocks"] or [], listed["once"] or [], blocks.host_slots())
    line = refusal(found, config.budget_min, config.profile)
    if line is not None:
        raise BadInput(line)
    return found


def checks_not_run(checks: int, reserve_s: float, budget_min: float, elapsed_s: float) -> str | None:
    """Why the once-per-arm checks are not run after the looks: they would
    end the run past its budget (about ``reserve_s``, with ``elapsed_s``
    of ``budget_min`` spent); None when they fit."""
    left = budget_min * 60 - elapsed_s
    if checks == 0 or reserve_s <= left:
        return None
    return (
        f"the {checks} once-per-arm checks were not run: they take about {minutes(reserve_s)} and "
        f"{minutes(max(0.0, left))} of the {budget_min:g} min budget was left (the blocks took "
        f"{minutes(elapsed_s)}); a --budget of {math.ceil((elapsed_s + reserve_s) / 60)} would have held them"
    )


def run_checks(
    config: RunConfig, checks: int, reserve_s: float, elapsed_s: float, run: Callable[[], None], console: Console
) -> str | None:
    """The once-per-arm checks after the looks (``run``), when what is left
    of the budget holds them; otherwise not run, said, and why returned
    (for until-decided.json).  None when they ran."""
    why = checks_not_run(checks, reserve_s, config.budget_min, elapsed_s)
    if why is None:
        run()
        return None
    console.print(why, highlight=False, markup=False, soft_wrap=True)
    return why

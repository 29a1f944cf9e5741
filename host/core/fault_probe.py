"""guest/fault_probe.c's output as typed runs: the guest agent that times
the first touch of fresh anonymous pages, which the fault scenario
(host/fault/anon.py) and the host under test's page-fault workload
(host/memslots/l1_faults.py) both run."""

from __future__ import annotations

import dataclasses
import re

from memqual.host.core.errors import GuestError

AGENT = "fault_probe"
# A run's wall-clock bound at 64 MiB on the wall clock, before
# clock.deadline_s: a run takes about 1 s on multi-threaded TCG here and
# 2-3 guest s on icount at shift 4.
RUN_BOUND_S = 30.0

_RUN = re.compile(
    r"event=run index=(?P<index>\d+) pages=(?P<pages>\d+) faults=(?P<faults>-?\d+) "
    r"duration_s=(?P<seconds>[0-9.]+) ns_per_page=(?P<ns>[0-9.]+)"
)


@dataclasses.dataclass(frozen=True)
class FaultRun:
    """One timed run: ``faults`` is the probe's own minor faults across it
    (getrusage; -1 where it failed)."""

    index: int
    pages: int
    faults: int
    seconds: float
    ns_per_page: float

    @property
    def faults_per_page(self) -> float:
        return self.faults / self.pages


def parse_runs(text: str, expected: int) -> tuple[FaultRun, ...]:
    """The ``event=run`` lines of fault_probe's output; GuestError unless
    there are ``expected`` of them and the probe said it was done."""
    runs = tuple(
        FaultRun(int(m["index"]), int(m["pages"]), int(m["faults"]), float(m["seconds"]), float(m["ns"]))
        for m in _RUN.finditer(text)
    )
    if len(runs) != expected or "event=done" not in text:
        raise GuestError(f"{AGENT} printed {len(runs)} of {expected} runs: {text.strip()[-300:]!r}")
    if any(run.pages <= 0 or run.seconds <= 0 for run in runs):
        raise GuestError(f"{AGENT} printed an empty run: {text.strip()[-300:]!r}")
    return runs

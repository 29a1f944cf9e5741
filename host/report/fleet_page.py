"""The fleet page: every claim's verdict on every lab host side by side,
the hosts whose verdict differs from the majority marked, each host's own
report linked; which hosts share one running kernel (their host-wide KSM
and timings are not independent); and what went wrong (hosts left out or
lost, tasks interrupted or not run, records a host sent that could not be
read).  OUTPUT/fleet.html for people (templates/fleet.html.j2 over a
``FleetPage``), OUTPUT/fleet.json for tools.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from memqual.host.core.paths import write_private_atomic
from memqual.host.core.printable import one_line
from memqual.host.report import pages
from memqual.host.report.badges import Badge, badge

if TYPE_CHECKING:
    from memqual.host.judge.results import Results

SCHEMA = "memqual.fleet/1"


@dataclasses.dataclass(frozen=True)
class TaskLine:
    test: str
    host: str
    outcome: str  # ran | interrupted | failed | not run
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class BadRecord:
    """A record a lab host sent that could not be read: left out of the
    host's results, which are then incomplete."""

    task: str
    host: str
    file: str  # relative to the task's directory
    reason: str


@dataclasses.dataclass(frozen=True)
class HostColumn:
    name: str
    status: str  # completed | incomplete (a record could not be read) | lost | left out
    reason: str = ""
    boot_id: str = ""
    environment: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    results: Results | None = None  # of the tasks that ran there to their end
    report: str = ""  # the host's report.html, relative to the fleet page
    results_path: str = ""
    tasks: tuple[TaskLine, ...] = ()
    bad_records: tuple[BadRecord, ...] = ()

    def verdicts(self) -> dict[str, str]:
        if self.results is None:
            return {}
        return {c.id: c.verdict for c in self.results.claims}


@dataclasses.dataclass(frozen=True)
class Fleet:
    columns: tuple[HostColumn, ...]
    not_run: tuple[TaskLine, ...] = ()  # tasks no host took
    avocado: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class ClaimRow:
    claim: str
    verdicts: dict[str, str]  # host -> verdict (hosts with results only)
    majority: str | None  # the verdict more than half the completed hosts gave, if any
    odd: frozenset[str]  # completed hosts whose verdict differs from the majority


def majority(verdicts: Mapping[str, str]) -> tuple[str | None, frozenset[str]]:
    """The verdict more than half of the hosts gave, and the hosts that gave
    another; (None, nobody) when no verdict has more than half."""
    if not verdicts:
        return None, frozenset()
    (top, count), *_ = collections.Counter(verdicts.values()).most_common(1)
    if count * 2 <= len(verdicts):
        return None, frozenset()
    return top, frozenset(h for h, v in verdicts.items() if v != top)


def claim_rows(fleet: Fleet) -> list[ClaimRow]:
    per_host = {c.name: c.verdicts() for c in fleet.columns if c.results is not None}
    claims: list[str] = []
    for verdicts in per_host.values():
        claims += [k for k in verdicts if k not in claims]
    # A host that did not complete judged on part of its tasks: its verdicts
    # are shown, but the majority is that of the hosts that completed.
    completed = {c.name for c in fleet.columns if c.status == "completed"}
    rows = []
    for claim in claims:
        verdicts = {h: v[claim] for h, v in per_host.items() if claim in v}
        top, odd = majority({h: v for h, v in verdicts.items() if h in completed})
        rows.append(ClaimRow(claim, verdicts, top, odd))
    return rows


def shared_kernels(fleet: Fleet) -> list[tuple[str, tuple[str, ...]]]:
    """(boot id, hosts) for every running kernel that more than one host
    runs on: network namespaces or containers of one machine."""
    by_boot: dict[str, list[str]] = collections.defaultdict(list)
    for c in fleet.columns:
        if c.boot_id:
            by_boot[c.boot_id].append(c.name)
    return [(boot, tuple(names)) for boot, names in by_boot.items() if len(names) > 1]


def to_json(fleet: Fleet) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "hosts": [
            {
                "name": c.name,
                "status": c.status,
                "reason": c.reason,
                "boot_id": c.boot_id,
                "environment": dict(c.environment),
                "results": c.results_path or None,
                "report": c.report or None,
                "tasks": [dataclasses.asdict(t) for t in c.tasks],
                "bad_records": [dataclasses.asdict(b) for b in c.bad_records],
            }
            for c in fleet.columns
        ],
        "claims": [
            {"claim": r.claim, "verdicts": r.verdicts, "majority": r.majority, "differs": sorted(r.odd)}
            for r in claim_rows(fleet)
        ],
        "shared_kernels": [{"boot_id": b, "hosts": list(h)} for b, h in shared_kernels(fleet)],
        "not_run": [dataclasses.asdict(t) for t in fleet.not_run],
        "avocado": fleet.avocado,
    }


def summary_lines(fleet: Fleet) -> list[str]:
    """What the terminal says at the end of a fleet run."""
    out = []
    for c in fleet.columns:
        counts = collections.Counter(t.outcome for t in c.tasks)
        tally = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no tasks"
        out.append(f"lab host {c.name}: {c.status.upper()} ({tally})" + (f": {c.reason}" if c.reason else ""))
        for t in c.tasks:
            if t.outcome != "ran":
                out.append(f"  {t.outcome}: {t.test}" + (f" ({t.reason})" if t.reason else ""))
        for b in c.bad_records:
            out.append(f"  bad record: {b.file} of {b.task} ({b.reason}); left out")
    for t in fleet.not_run:
        out.append(f"not run: {t.test}" + (f" ({t.reason})" if t.reason else ""))
    for boot, names in shared_kernels(fleet):
        together = ", ".join(names)
        out.append(f"hosts {together} run one kernel (boot id {boot[:8]}): host-wide KSM and timings are shared")
    for row in claim_rows(fleet):
        if row.odd:
            out.append(f"claim {row.claim}: {', '.join(sorted(row.odd))} differ from the majority ({row.majority})")
    # Reasons come from the hosts and the tests: no escape sequence reaches the terminal.
    return [one_line(line) for line in out]


@dataclasses.dataclass(frozen=True)
class HostHead:
    """A host's column heading: its name, linked to its report if it has one."""

    name: str
    status: str
    report: str


@dataclasses.dataclass(frozen=True)
class VerdictCell:
    verdict: Badge | None  # None: the host has no verdict of this claim
    odd: bool  # differs from the majority


@dataclasses.dataclass(frozen=True)
class ClaimLine:
    claim: str
    majority: str | None
    cells: tuple[VerdictCell, ...]


@dataclasses.dataclass(frozen=True)
class EnvironmentLine:
    key: str
    values: tuple[str, ...]  # one per host


@dataclasses.dataclass(frozen=True)
class SharedKernel:
    boot_id: str
    hosts: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class HostFault:
    """A host that did not complete."""

    kind: ClassVar[str] = "host"
    host: str
    status: str
    reason: str


@dataclasses.dataclass(frozen=True)
class TaskFault:
    """A task that did not run to its end, on a host or on none."""

    kind: ClassVar[str] = "task"
    outcome: str
    host: str  # "" when no host took it
    test: str
    reason: str


@dataclasses.dataclass(frozen=True)
class RecordFault:
    kind: ClassVar[str] = "record"
    record: BadRecord


@dataclasses.dataclass(frozen=True)
class FleetPage:
    """Everything fleet.html shows, in its order."""

    hosts: tuple[HostHead, ...]
    shared: tuple[SharedKernel, ...]
    claims: tuple[ClaimLine, ...]
    environment: tuple[EnvironmentLine, ...]
    boot_ids: tuple[str, ...]  # one per host, shortened
    faults: tuple[HostFault | TaskFault | RecordFault, ...]


def fleet_page(fleet: Fleet) -> FleetPage:
    """fleet.html's view of a fleet run."""
    names = [c.name for c in fleet.columns]
    faults: list[HostFault | TaskFault | RecordFault] = []
    for c in fleet.columns:
        if c.status != "completed":
            faults.append(HostFault(c.name, c.status, c.reason))
        faults += [TaskFault(t.outcome, c.name, t.test, t.reason) for t in c.tasks if t.outcome != "ran"]
        faults += [RecordFault(b) for b in c.bad_records]
    faults += [TaskFault("not run", "", t.test, t.reason) for t in fleet.not_run]
    return FleetPage(
        hosts=tuple(HostHead(c.name, c.status, c.report) for c in fleet.columns),
        shared=tuple(SharedKernel(boot, hosts) for boot, hosts in shared_kernels(fleet)),
        claims=tuple(
            ClaimLine(
                row.claim,
                row.majority,
                tuple(
                    VerdictCell(None if name not in row.verdicts else badge(row.verdicts[name]), name in row.odd)
                    for name in names
                ),
            )
            for row in claim_rows(fleet)
        ),
        environment=tuple(
            EnvironmentLine(key, tuple(str(c.environment.get(key, "")) for c in fleet.columns))
            for key in ("host_kernel", "cpu", "qemu", "qemu_origin", "accel", "thp", "kvm_nr_memslots")
        ),
        boot_ids=tuple(c.boot_id[:8] for c in fleet.columns),
        faults=tuple(faults),
    )


def render(fleet: Fleet) -> str:
    return pages.render("fleet.html.j2", page=fleet_page(fleet))


def write(fleet: Fleet, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_private_atomic(out_dir / "fleet.json", (json.dumps(to_json(fleet), indent=2) + "\n").encode(), 0o644)
    write_private_atomic(out_dir / "fleet.html", render(fleet).encode(), 0o644)

"""What a run leaves in its output directory: the job's records collected,
claims judged, results.json and report.html written per arm, and the
run's exit status.  Starts no job.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from memqual.host.core import record
from memqual.host.core.errors import BadInput
from memqual.host.judge.results import Results, build_results, write_results
from memqual.host.run.config import Arm, GuestKernel, JobOutcome, RunConfig, TestOutcome, qemu_json

if TYPE_CHECKING:  # imported where used: a run loads the reporting only at its end
    from rich.console import Console

    from memqual.host.core.qemu_binary import QemuChoice

# Test statuses that mean "no records from this test, and here is why".
_NOT_PASSED = ("SKIP", "CANCEL", "ERROR", "FAIL", "INTERRUPTED", "INTERRUPT", "WARN")


# ------------------------------------------------------------ results


def collect_records(job_dir: Path | None) -> tuple[list[record.Measurement], list[str]]:
    """Every record of the job; a broken record is reported, not fatal."""
    if job_dir is None:
        return [], []
    records, problems = [], []
    for path in sorted(job_dir.rglob(record.RECORD_GLOB)):
        try:
            records.append(record.load(path))
        except BadInput as exc:
            problems.append(str(exc))
    return records, problems


class RunSoFar(Protocol):
    """What an arm's results read of a run in blocks (host/run/ab_run.py's
    BlockedRun), at a look or at its end."""

    jobs: list[JobOutcome]
    problems: list[str]

    def of_arm(self, arm: str) -> list[Any]: ...
    def tests_of_arm(self, arm: str) -> list[tuple[int, TestOutcome]]: ...


@dataclasses.dataclass(frozen=True)
class ArmRecords:
    """What one arm's results are built from: its records (rounds merged),
    the records that could not be read, its tests (each with the number of
    the job that ran it), the jobs and its kernel; ``qemu`` and ``label``:
    an A/B arm's QEMU and name where its kernel does not say."""

    records: list[record.Measurement]
    problems: list[str]
    tests: list[tuple[int, TestOutcome]]
    jobs: list[JobOutcome]
    kernel: GuestKernel | None
    qemu: QemuChoice | None = None
    label: str = ""

    @classmethod
    def so_far(cls, run: RunSoFar, arm: Arm) -> ArmRecords:
        """An A/B arm's, from what its blocks have written so far."""
        merged = record.merge_rounds(run.of_arm(arm.label))
        return cls(merged, run.problems, run.tests_of_arm(arm.label), run.jobs, arm.kernel, arm.qemu, arm.label)


def write_outputs(
    out_dir: Path,
    jobs: list[JobOutcome],
    config: RunConfig,
    kernel: GuestKernel | None,
    console: Console,
) -> Results:
    """Verdicts, results.json, report.html and the tables for one kernel's
    jobs (one per round; their records pooled by ``record.merge_rounds``)."""
    records, problems = [], []
    for job in jobs:
        job_records, job_problems = collect_records(job.job_dir)
        records += job_records
        problems += job_problems
    tests = [(index + 1, t) for index, job in enumerate(jobs) for t in job.tests]
    arm = ArmRecords(record.merge_rounds(records), problems, tests, jobs, kernel)
    return write_arm_outputs(out_dir, arm, config, console)


def write_arm_outputs(out_dir: Path, arm: ArmRecords, config: RunConfig, console: Console) -> Results:
    """write_outputs from an arm's records already merged."""
    # lazy: the pages bring jinja2, numpy and scipy (~300 ms); only this path writes one
    from memqual.host.report import report, terminal

    for problem in arm.problems:
        console.print(f"[yellow]skipped a record:[/] {problem}", highlight=False)
    results = arm_results(arm, config)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(results, out_dir / "results.json")
    report.write_html(results, out_dir / "report.html")
    terminal.print_tables(results, console)
    console.print(f"wrote {out_dir / 'results.json'} and {out_dir / 'report.html'}", highlight=False)
    return results


def arm_results(arm: ArmRecords, config: RunConfig) -> Results:
    """One arm's Results (claims judged, the run's facts): what
    write_arm_outputs writes, and what an A/B writes at each look without
    its pages."""
    # lazy: the claims bring numpy and scipy (~300 ms); only a run's looks and its end judge them
    from memqual.host.judge.claims.evaluate import evaluate
    from memqual.host.judge.claims.load import load
    from memqual.host.judge.claims.model import Skip

    kernel = arm.kernel
    skips = [Skip(test=t.id, status=t.status, reason=t.reason) for _, t in arm.tests if t.status in _NOT_PASSED]
    verdicts = evaluate(load(), arm.records, skips=skips, only=config.only)
    run_info: dict[str, Any] = {
        "profile": config.profile,
        "only": list(config.only),
        "label": arm.label or (kernel.label if kernel else ""),
        "guest_kernel": (
            {
                "bzimage": str(kernel.bzimage),
                "modules": str(kernel.modules) if kernel.modules else None,
                "sha256": kernel.sha256,
            }
            if kernel
            else None
        ),
        "qemu": qemu_json(arm.qemu),
        "clock": config.clock.label,  # what the guests ran on; each record's environment says its own
        "rounds": len(arm.jobs),
        # The first job's summary heads the report; every round's is listed.
        "avocado": arm.jobs[0].to_json(),
        "avocado_rounds": [job.to_json() for job in arm.jobs],
        "tests": [dataclasses.asdict(t) | {"round": number} for number, t in arm.tests],
        "record_problems": arm.problems,
    }
    results = build_results(verdicts, arm.records, run=run_info)
    env = results.environment
    if config.clock.auto:
        # A plan's records were read on two clocks: the file's clock is the
        # plan (what compare checks both sides share), each metric its own.
        env["clock"] = config.clock.label
        env.setdefault("environment_sources", {})["clock"] = "the run's plan (--clock auto): each metric names its own"
    if kernel is not None and env.get("guest_kernel_sha256") is None:
        env["guest_kernel_sha256"] = kernel.sha256
        env.setdefault("environment_sources", {})["guest_kernel_sha256"] = "the --guest-kernel file (no record said)"
    return results


def exit_status(outcomes: list[JobOutcome], console: Console) -> int:
    failed = [j for j in outcomes if not j.completed]
    if failed:
        console.print(
            "[bold red]avocado reported failed or errored tests (or the job failed):[/] "
            + "; ".join(j.summary or f"exit {j.exit_status}" for j in failed),
            highlight=False,
        )
        return 1
    return 0

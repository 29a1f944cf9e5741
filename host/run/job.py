"""The main job: run the scenarios (one Avocado job per round, or A and B
in blocks), then judge and write the outputs (OUTPUT/results.json,
OUTPUT/report.html; per arm and a comparison for an A/B).  docs/claims-and-report.md,
"The main job", is the manual.  Parses no options (host/cli/run.py)
and draws no page (host/report/).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from memqual.host.core import printable
from memqual.host.run.ab_run import run_blocked
from memqual.host.run.avocado import run_avocado
from memqual.host.run.config import GuestKernel, JobOutcome, RunConfig, run_arms, schedule
from memqual.host.run.outputs import exit_status, write_outputs
from memqual.host.run.signals import terminate_as_exception

if TYPE_CHECKING:
    from rich.console import Console


def _out_dir(config: RunConfig, kernel: GuestKernel | None) -> Path:
    return config.output / kernel.label if kernel and kernel.label else config.output


def run(config: RunConfig, console: Console | None = None) -> int:
    # Logs and CI get 120 columns; a terminal its own width.
    console = console or printable.console(width=None if sys.stdout.isatty() else 120)
    config.output.mkdir(parents=True, exist_ok=True)
    arms = run_arms(config)
    if len(arms) == 2:
        return run_blocked(config, (arms[0], arms[1]), console)
    kernels: tuple[GuestKernel | None, ...] = config.kernels or (None,)
    jobs: dict[str, list[JobOutcome]] = {}

    def one_job(round_no: int, kernel: GuestKernel | None, total: int) -> None:
        label = kernel.label if kernel else ""
        with terminate_as_exception():
            job = run_avocado(
                dataclasses.replace(config, rounds=total),
                _out_dir(config, kernel) / "avocado",
                kernel,
                console,
                round_no,
            )
        console.print(
            (f"round {round_no}/{total} " if total > 1 else "")
            + (f"[{label}] " if label else "")
            + f"avocado: {job.summary or 'no summary'} (exit {job.exit_status}); job directory {job.job_dir}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        jobs.setdefault(label, []).append(job)

    for round_no, kernel in schedule(kernels, config.rounds):
        one_job(round_no, kernel, config.rounds)
    outcomes = [job for label_jobs in jobs.values() for job in label_jobs]
    for kernel in kernels:
        write_outputs(_out_dir(config, kernel), jobs[kernel.label if kernel else ""], config, kernel, console)
    return exit_status(outcomes, console)

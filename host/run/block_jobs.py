"""The avocado jobs of an A/B's blocks: one job of (block, arm) variants,
or on icount two, the tests that share the host first (A and B of a
block side by side, host/judge/clock_plan.py ``shares_host``), then the
rest one run at a time.  host/run/ab_run.py runs them and reads them."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from memqual.host.core.paths import write_private_atomic
from memqual.host.judge import clock_plan
from memqual.host.run import blocks
from memqual.host.run.avocado import list_tests, run_avocado
from memqual.host.run.config import JobOutcome, RunConfig
from memqual.host.run.signals import terminate_as_exception

if TYPE_CHECKING:
    from rich.console import Console


def run_block_job(
    config: RunConfig,
    arms: dict[str, blocks.VariantParams],
    order: list[tuple[int, str]],
    number: int,
    console: Console,
    selection: str = "blocks",
    references: tuple[str, ...] = (),
) -> JobOutcome:
    """One avocado job of the (block, arm) variants in ``order`` (arms:
    blocks.VariantParams by arm), its variants file OUTPUT/variants/job-N.json
    and its jobs under OUTPUT/avocado; feed it to BlockedRun.take."""
    variants_file = config.output / "variants" / f"job-{number}.json"
    variants_file.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(variants_file, (json.dumps(blocks.variants(order, arms), indent=1) + "\n").encode(), 0o644)
    if not references and config.scope is not None:
        references = config.scope.references(selection)
    job_config = dataclasses.replace(
        config,
        variants_file=variants_file,
        selection=selection,
        references=references,
        rounds=max((block for block, _ in order), default=1),
    )
    with terminate_as_exception():
        return run_avocado(job_config, config.output / "avocado", None, console, number)


@dataclasses.dataclass(frozen=True)
class BlockJob:
    """One avocado job of a block's tests, and how many of its test runs
    went at a time."""

    outcome: JobOutcome
    slots: int = 1
    tests: int = 0  # how many tests it was given by name (0: its selection's)


def listed_tests(config: RunConfig, selection: str, references: tuple[str, ...] = ()) -> list[str] | None:
    """The tests (by name, as avocado lists them) a block job of
    ``selection`` would run: those ``references`` name, else the
    selection's within the run's scope.  Empty when --only selects none of
    them; None when avocado cannot list them (the job then says why)."""
    if not references and config.scope is not None:
        references = config.scope.references(selection)
    return list_tests(dataclasses.replace(config, selection=selection, references=references))


def split_beside_others(config: RunConfig, listed: list[str] | None) -> tuple[list[str], list[str]]:
    """The tests of a block job (``listed``: by name, as avocado lists
    them) that share the host on the run's clock (host/judge/clock_plan.py
    ``runs_beside_others``: icount, every primary a count of their guests'
    instructions), and the rest.  Both empty when avocado could not list
    them (None): the job then runs as one, every test alone."""
    if not (config.clock.icount or config.clock.auto) or not listed:
        return [], []
    if config.hosts and config.clock.icount:
        # Every guest runs on a host under test of its own test (an L1 per
        # guest): on icount each figure is a count of that L1's instructions,
        # KSM's included, and a test that would read this machine skips.
        return listed, []
    shared = [n for n in listed if clock_plan.runs_beside_others(blocks.row_reference(n), config.clock)]
    return shared, [n for n in listed if n not in shared]


@dataclasses.dataclass(frozen=True)
class BlockRequest:
    """What a block's jobs run: the (block, arm) variants in ``order`` of
    the arms' params (blocks.VariantParams by arm), of the tests ``references``
    name (empty: the selection's)."""

    arms: dict[str, blocks.VariantParams]
    order: list[tuple[int, str]]
    selection: str = "blocks"
    references: tuple[str, ...] = ()
    # The tests avocado listed for it, where the caller has listed them
    # (``listed_tests``); None: listed here when the clock needs them.
    listed: list[str] | None = None


def run_block_jobs(
    config: RunConfig, request: BlockRequest, number: int, console: Console, slots: int | None = None
) -> list[BlockJob]:
    """The block's tests as avocado jobs: on icount the tests that share the
    host (``split_beside_others``) first, in a job of ``slots`` runs at a
    time (default: this host's, blocks.host_slots), A and B of a block
    side by side; then the rest, one run at a time, in a job of their own,
    so that no test measured on the host's time has another guest beside
    it or a runner starting next to it.  Numbered from ``number``."""
    arms, order, selection, references = request.arms, request.order, request.selection, request.references
    if not references and config.scope is not None:
        references = config.scope.references(selection)
    slots = blocks.host_slots() if slots is None else slots
    together = selection == "blocks" and slots > 1
    listed = request.listed
    if together and listed is None and (config.clock.icount or config.clock.auto):
        listed = listed_tests(config, selection, references)  # only a clock whose tests share the host asks
    shared, rest = split_beside_others(config, listed) if together else ([], [])
    if not shared:
        return [BlockJob(run_block_job(config, arms, order, number, console, selection, references))]
    at_once = max(config.parallel, slots)
    jobs = [
        BlockJob(
            run_block_job(
                dataclasses.replace(config, parallel=at_once),
                arms,
                order,
                number,
                console,
                selection,
                tuple(blocks.test_reference(n) for n in shared),
            ),
            slots=at_once,
            tests=len(shared),
        )
    ]
    if rest:
        refs = tuple(blocks.test_reference(n) for n in rest)
        jobs.append(BlockJob(run_block_job(config, arms, order, number + 1, console, selection, refs), tests=len(rest)))
    return jobs

"""What an A/B with ``--until-decided`` leaves on disk at each look, so that
a run ended after it (SIGTERM, SIGKILL, an outer ``timeout``) keeps what
its looks decided: until-decided.json (the looks so far), each arm's
results.json (its records so far) and comparison.json (the looks'
decisions, marked unfinished), each written whole or not at all.  The
run's end writes them again, with the pages; ``python -m
memqual.lab.comparison_page OUTPUT`` draws the page of an ended run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memqual.host.core.paths import write_private_atomic
from memqual.host.judge import ab_outcome
from memqual.host.judge.control_power import ControlPower
from memqual.host.judge.results import write_results
from memqual.host.judge.sequential_run import SequentialRun
from memqual.host.judge.until_decided import LookResult
from memqual.host.run.config import Arm, RunConfig
from memqual.host.run.outputs import ArmRecords, RunSoFar, arm_results

SUMMARY = "until-decided.json"
COMPARISON = "comparison.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_private_atomic(path, (json.dumps(data, indent=2) + "\n").encode(), 0o644)


def write_summary(output: Path, looks: SequentialRun) -> None:
    """until-decided.json: ``looks`` as they are now."""
    write_json(output / SUMMARY, looks.to_json())


def write_look(
    config: RunConfig,
    arms: tuple[Arm, Arm],
    run: RunSoFar,
    looks: SequentialRun,
    now: LookResult,
    power: tuple[int | None, ControlPower],
) -> None:
    """The decisions of the look just taken (``now``), on disk: the looks
    so far (``looks``, unfinished) as until-decided.json first, the
    cheapest and what decides; then each arm's results.json of its
    records so far, and comparison.json of the outcome so far, built from
    that look's comparison and the controls' ``power`` the run found at
    it (host/judge/ab_outcome.py, ``at_look``).  No page is drawn, nothing
    printed and nothing compared or simulated again: a look costs the run
    its time."""
    write_summary(config.output, looks)
    if not run.jobs:
        return
    for arm in arms:
        found = arm_results(ArmRecords.so_far(run, arm), config)
        (config.output / arm.label).mkdir(parents=True, exist_ok=True)
        write_results(found, config.output / arm.label / "results.json")
    outcome = ab_outcome.at_look(now, looks, power)
    write_json(
        config.output / COMPARISON,
        {
            **outcome.to_json(),
            "note": f"written at look {now.look.look} of a run still going: the decisions of its looks so "
            "far; the run's end writes this file again, whole",
            "a": str(config.output / "A" / "results.json"),
            "b": str(config.output / "B" / "results.json"),
        },
    )

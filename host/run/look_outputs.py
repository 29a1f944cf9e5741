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
from typing import Any, Protocol

from memqual.host.core import record
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import write_private_atomic
from memqual.host.judge.results import write_results
from memqual.host.run.config import Arm, JobOutcome, RunConfig, TestOutcome
from memqual.host.run.outputs import arm_results

SUMMARY = "until-decided.json"
COMPARISON = "comparison.json"


class RunSoFar(Protocol):
    """What a look reads of the run (host/run/rounds.py's BlockedRun)."""

    jobs: list[JobOutcome]
    problems: list[str]

    def of_arm(self, arm: str) -> list[Any]: ...
    def tests_of_arm(self, arm: str) -> list[tuple[int, TestOutcome]]: ...


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_private_atomic(path, (json.dumps(data, indent=2) + "\n").encode(), 0o644)


def write_look(
    config: RunConfig,
    arms: tuple[Arm, Arm],
    run: RunSoFar,
    summary: dict[str, Any],
    status: int,
    levels: tuple[float, float],
) -> None:
    """The decisions of the look just taken, on disk: ``summary`` (the
    looks so far, as until-decided.json has them) first, the cheapest and
    what decides; then each arm's results.json of its records so far, and
    comparison.json of the looks' decisions (``status``: their exit
    status) at ``levels`` (threshold, alpha).  No page is drawn and
    nothing printed: a look costs the run its time."""
    # lazy: the comparison brings numpy and scipy (~300 ms); only a run's looks and its end compare
    from memqual.host.judge import decisions
    from memqual.host.judge.comparison import compare_results

    write_json(config.output / SUMMARY, summary)
    if not run.jobs:
        return
    results = []
    for arm in arms:
        found = arm_results(
            record.merge_rounds(run.of_arm(arm.label)),
            run.problems,
            run.tests_of_arm(arm.label),
            run.jobs,
            config,
            arm.kernel,
            arm.qemu,
            arm.label,
        )
        (config.output / arm.label).mkdir(parents=True, exist_ok=True)
        write_results(found, config.output / arm.label / "results.json")
        results.append(found)
    threshold, alpha = levels
    try:
        result = compare_results(
            results[0], results[1], threshold=threshold, alpha=alpha, across_hosts=arms[0].host != arms[1].host
        )
    except BadInput:
        return  # the arms cannot be compared: until-decided.json holds what the looks said
    table = decisions.sequential(result, summary, status)
    write_json(
        config.output / COMPARISON,
        {
            "finished": False,
            "note": f"written at look {summary.get('looks')} of a run still going: the decisions of its looks so "
            "far; the run's end writes this file again, whole",
            "decided_by": table.decided_by,
            "exit_status": table.exit_status,
            "host_drifted": table.host_drifted,
            "threshold": result.threshold,
            "alpha": result.alpha,
            "decisions": table.to_json(),
            "a": str(config.output / "A" / "results.json"),
            "b": str(config.output / "B" / "results.json"),
        },
    )


def note_checks_not_run(output: Path, why: str) -> None:
    """Add to until-decided.json why the once-per-arm checks were not run."""
    path = output / SUMMARY
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(summary, dict):
        summary["checks"] = {"run": False, "why": why}
        write_json(path, summary)

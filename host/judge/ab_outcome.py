"""The outcome of an A/B, built once: the whole run compared, the
deciding table, the negative controls' power and the exit status, and
with --until-decided the looks that decided.  ``memqual compare``, a
two-arm ``memqual run`` and the lab's page again all build it here, from
the runs' results (and a run's looks); comparison.json is its
serialization, and the terminal table and comparison.html render it and
decide nothing.  While a run is still looking, each look's outcome so far
is built from that look's own comparison (``at_look``), never a second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from memqual.host.judge import control_power, decisions
from memqual.host.judge.comparison import RunComparison, compare_runs
from memqual.host.judge.exit_status import ExitStatus
from memqual.host.judge.results import Results
from memqual.host.judge.sequential_run import SequentialRun
from memqual.host.judge.until_decided import LookResult
from memqual.host.judge.verdicts import DEFAULT_ALPHA, DEFAULT_THRESHOLD

DESCRIPTIVE_NOTE = (
    "the whole run compared again at full alpha after the looks: after optional stopping "
    "its levels do not hold; descriptive only, it sets no exit status"
)


@dataclasses.dataclass(frozen=True)
class ABOutcome:
    """What an A/B decided and on what."""

    # The whole of both runs compared at alpha: after the looks of
    # --until-decided only a description, which sets no exit status.  Of
    # a run still looking (``looks`` unfinished), its last look's.
    comparison: RunComparison
    table: decisions.DecidingTable
    power: control_power.ControlPower
    power_look: int | None  # the look the controls' power is of (None: one comparison)
    looks: SequentialRun | None = None

    @property
    def exit_status(self) -> ExitStatus:
        return self.table.exit_status

    @property
    def sequential(self) -> bool:
        return self.looks is not None

    def to_json(self) -> dict[str, Any]:
        """comparison.json (without the run's own record: its arms, its files, its patch)."""
        power = {**self.power.to_json(), "look": self.power_look}
        if self.looks is None:
            return {
                **self.comparison.to_json(),
                "decided_by": self.table.decided_by,
                "decisions": self.table.to_json(),
                "control_power": power,
            }
        decided = {
            "decided_by": self.table.decided_by,
            "exit_status": int(self.exit_status),
            "host_drifted": self.table.host_drifted,
            "threshold": self.comparison.threshold,
            "alpha": self.comparison.alpha,
            "decisions": self.table.to_json(),
            "control_power": power,
        }
        if not self.looks.finished:
            # No whole run compared yet: the look's figures are its rows.
            return {"finished": False, **decided}
        full = self.comparison.to_json()
        status = full.pop("exit_status")
        return {**decided, "descriptive": {"note": DESCRIPTIVE_NOTE, "would_have_exited": status, **full}}


def decide(
    result: RunComparison, looks: SequentialRun | None = None, *, trials: int = control_power.TRIALS
) -> ABOutcome:
    """The outcome of ``result``: one comparison at alpha, or, with
    ``looks``, the looks' decisions with ``result`` as their description.
    The controls' power is simulated here, once (``trials`` runs; with
    looks, at the best look's blocks and level)."""
    designs = control_power.designs_of(result.metrics)
    if looks is None:
        table = decisions.one_look(result)
        look = None
        power = control_power.of_comparison(result, trials=trials)
    else:
        table = decisions.sequential(result, looks)
        at = [(c.look, c.blocks, c.alpha) for c in looks.control_looks]
        look, power = control_power.over_looks(designs, at, threshold=result.threshold, trials=trials)
    power = control_power.with_blocks_needed(power, designs, threshold=result.threshold)
    return ABOutcome(result, table, power, look, looks)


def at_look(now: LookResult, looks: SequentialRun, power: tuple[int | None, control_power.ControlPower]) -> ABOutcome:
    """The outcome so far of a run still looking (``looks``, unfinished),
    from the comparison of the look just taken (``now``): its decisions,
    and the controls' ``power`` at that look alone, as the run simulated it
    (``control_power.of_look``; the best look's, and the blocks that would
    reach the target, are the run's end's).  Compares and simulates
    nothing again."""
    result = RunComparison(
        metrics=list(now.compared),
        claims=[],
        environment={},
        threshold=looks.tracker.threshold,
        alpha=looks.tracker.alpha,
        clock=next((m.clock for m in now.compared if m.clock), ""),
    )
    look, found = power
    return ABOutcome(result, decisions.sequential(result, looks), found, look, looks)


def of_results(
    a_runs: Sequence[Results | Mapping[str, Any]],
    b_runs: Sequence[Results | Mapping[str, Any]],
    looks: SequentialRun | None = None,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    all_metrics: bool = False,
    across_hosts: bool = False,
    trials: int = control_power.TRIALS,
) -> ABOutcome:
    """The outcome of the runs' results files (``compare_runs`` says how
    they are compared), decided by ``looks`` when a run of --until-decided
    made them.  BadInput when they cannot be compared."""
    result = compare_runs(
        a_runs, b_runs, threshold=threshold, alpha=alpha, all_metrics=all_metrics, across_hosts=across_hosts
    )
    return decide(result, looks, trials=trials)

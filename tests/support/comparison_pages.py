"""A synthetic two-arm run in blocks, decided by the real Tracker over its
looks, for the tests of the deciding table and comparison.html (and, run
as ``python tests/support/comparison_pages.py OUT.html``, a page to look at).

Primaries are real ones (the scenario rows') so the files mark them;
the controls are memslots.kvm_lookup metrics; the exploratory ones carry
names of their own.  Each (metric, block) is one A and one B value:
A = base * exp(noise), B = A's base * effect * exp(noise), noise
N(0, sd / sqrt 2) a side, so a block's log(B / A) has sd ``sd``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

from memqual.host.core.record import Measurement, merge_rounds
from memqual.host.judge import ab_outcome, comparison, control_power, decisions, verdicts
from memqual.host.judge import until_decided as until
from memqual.host.judge.results import build_results
from memqual.host.judge.sequential_run import AddedBlock, ControlLook, SequentialRun


@dataclasses.dataclass(frozen=True)
class Spec:
    scenario: str
    metric: str
    unit: str
    better: str
    effect: float  # B / A in truth
    sd: float  # of a block's log(B / A)
    variant: tuple[tuple[str, Any], ...] = ()
    blocks: int | None = None  # fewer blocks than the run's (a scenario left out early)


PRIMARIES = (
    Spec("balloon.inflate", "inflate_s", "s", "lower", 1.0, 0.12, blocks=3),
    Spec("balloon.deflate", "deflate_s", "s", "lower", 5.8, 0.08),
    Spec("balloon.request_size", "per_page_ns", "ns", "lower", 1.1, 1.4, blocks=2),
    Spec("balloon.floor", "floor_mib", "MiB", "lower", 0.95, 0.07, blocks=2),
    Spec("ksm.merge", "merged_fraction", "", "higher", 1.0, 0.001, (("mem_merge", True),)),
    Spec("ksm.many_guests", "saved_mib", "MiB", "higher", 1.076, 0.012, (("guests", 3),)),
    Spec("memslots.trace_mmio", "nodes_per_lookup", "", "lower", 1.0, 0.0005, (("structure", "rbtree"),)),
)


def controls(n: int, sd: float, drift: float = 1.0) -> tuple[Spec, ...]:
    return tuple(
        Spec("memslots.kvm_lookup", "access_ns", "ns", "lower", drift, sd, (("kind", "miss"), ("slots", 2**i)))
        for i in range(n)
    )


def exploratory(n: int) -> tuple[Spec, ...]:
    effects = [1.0] * n
    effects[:3] = [1.3, 0.85, 1.12][: min(3, n)]
    return tuple(
        Spec("balloon.request_size", "request_s", "s", "lower", effects[i], 0.03 + 0.01 * (i % 5), (("mib", 2**i),))
        for i in range(n)
    )


def records(specs: tuple[Spec, ...], blocks: int, seed: int) -> tuple[list[Measurement], list[Measurement]]:
    rng = np.random.default_rng(seed)
    out: tuple[list[Measurement], list[Measurement]] = ([], [])
    for i, s in enumerate(specs):
        base = 1.0 + i
        for block in range(1, (s.blocks or blocks) + 1):
            noise = rng.normal(0.0, s.sd / np.sqrt(2.0), 2)
            for side, factor in ((0, 1.0), (1, s.effect)):
                out[side].append(
                    Measurement(
                        scenario=s.scenario,
                        metric=s.metric,
                        unit=s.unit,
                        better=s.better,
                        samples=[float(base * factor * np.exp(noise[side]))],
                        variant=dict(s.variant),
                        blocks=[block],
                        arm="AB"[side],
                    )
                )
    return out


@dataclasses.dataclass
class Run:
    outcome: ab_outcome.ABOutcome
    a: Any
    b: Any
    looks: SequentialRun

    @property
    def result(self) -> comparison.RunComparison:
        return self.outcome.comparison

    @property
    def table(self) -> decisions.DecidingTable:
        return self.outcome.table

    @property
    def power(self) -> control_power.ControlPower:
        return self.outcome.power

    @property
    def summary(self) -> dict[str, Any]:
        """until-decided.json."""
        return self.looks.to_json()


def run(
    specs: tuple[Spec, ...], blocks: int = 6, first: int = 2, seed: int = 1, budget_s: float = 600.0, trials: int = 100
) -> Run:
    """Blocks 1..``first``, then one look after each block to ``blocks``,
    through the real Tracker (each look at its share of the budget's
    clock, the last spending what is left), then the run's outcome: the
    whole run compared at full alpha, the deciding table and the controls'
    power over the looks."""
    a, b = records(specs, blocks, seed)
    tracker = until.Tracker(threshold=verdicts.DEFAULT_THRESHOLD, alpha=verdicts.DEFAULT_ALPHA)
    wall: list[float] = []
    added: list[AddedBlock] = []
    control_looks: list[ControlLook] = []
    for look, n in enumerate(range(first, blocks + 1), start=1):
        fraction = 1.0 if n == blocks else n / (blocks + 1)
        wall.append(budget_s * fraction)
        now_a = [m for m in a if m.blocks[0] <= n]
        now_b = [m for m in b if m.blocks[0] <= n]
        now = tracker.update(look, now_a, now_b, fraction)
        control_looks.append(ControlLook(look, n, now.level))
        if now.all_decided or n == blocks:
            break
        added.append(AddedBlock(n + 1, tuple(sorted(tracker.undecided_scenarios())), (), True, ()))
    looks = SequentialRun(
        tracker,
        "every primary decided" if now.all_decided else "budget spent",
        budget_s / 60.0,
        blocks=n,
        added=tuple(added),
        look_wall_s=tuple(wall),
        control_blocks=n,
        min_control_blocks=6,
        control_looks=tuple(control_looks),
    )
    res_a = build_results([], merge_rounds([m for m in a if m.blocks[0] <= n]), host_fallback=False)
    res_b = build_results([], merge_rounds([m for m in b if m.blocks[0] <= n]), host_fallback=False)
    outcome = ab_outcome.of_results([res_a], [res_b], looks, trials=trials)
    return Run(outcome, res_a, res_b, looks)


def realistic(seed: int = 1, trials: int = 400) -> Run:
    """Seven primaries, 26 controls at 2 % and 30 exploratory, 7 blocks."""
    return run(PRIMARIES + controls(26, 0.02) + exploratory(30), blocks=7, seed=seed, trials=trials)


if __name__ == "__main__":
    from memqual.host.report.compare_report import comparison_page, write_comparison_html
    from memqual.host.report.compare_text import print_comparison

    r = realistic()
    print_comparison(r.outcome)
    path = write_comparison_html(comparison_page(r.outcome, r.a, r.b), sys.argv[1])
    print(f"wrote {path}")
    Path(sys.argv[1] + ".json").write_text(__import__("json").dumps(r.table.to_json(), indent=1))

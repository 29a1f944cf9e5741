"""The lookup benchmark in L1 as measurement records (scenario
``memslots.l1_lookup``): per slot count, a miss's own walk as the kernel
counted it (``miss_nodes``, memslot_miss_nodes over the misses) and L1's
nanoseconds per miss over the null loop (``miss_ns``, on icount L1's
instructions), one replicate a boot of L1: the unit is a fresh host.
Records of two kernels pair by their settings (the layout and the passes,
not the kernel), so a claim or `memqual compare` can put the 2011 array
beside the tree; each names its kernel's structure in its variant and its
host in its environment.  docs/memslots-kvm.md, "The lookup benchmark in
L1"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memqual.host.core.environment import Environment
from memqual.host.core.record import Measurement
from memqual.host.memslots.l1_layout import LayoutLookup, LayoutLookupResult
from memqual.host.memslots.l1_lookup import L1LookupResult

SCENARIO = "memslots.l1_lookup"
KIND = "miss"
# kvm_lookup.py's layout: a RAM slot and N one-page slots, a gap after each.
UNIFORM_LAYOUT = "kvm_lookup"


class BootsDisagree(ValueError):
    """Boots of one host whose runs are not the same measurement (another
    structure, other slot counts): they are not replicates of one unit."""


def settings(result: L1LookupResult | LayoutLookupResult, layout: str) -> dict[str, Any]:
    c = result.config
    if isinstance(c, LayoutLookup):
        # A given layout: where the loop, the miss and the hit were, and
        # whose private slots it held (l1_layout.py).
        return {
            "layout": layout,
            "iterations": c.iterations,
            "unroll": c.unroll,
            "rounds": c.rounds,
            "miss": c.miss,
            "miss_gfn": c.miss_gfn,
            "code_gfn": c.code,
            "hit_gfn": c.hit_gfn,
            "host_2011": c.host_2011,
        }
    return {
        "layout": layout,
        "iterations": c.iterations,
        "unroll": c.unroll,
        "rounds": c.rounds,
        "ram_mib": c.ram_mib,
        "miss": c.miss,
    }


def records(
    boots: Sequence[L1LookupResult | LayoutLookupResult], environment: Environment, layout: str = UNIFORM_LAYOUT
) -> list[Measurement]:
    """``miss_nodes`` (where the kernel counts a miss's walk) and
    ``miss_ns`` per slot count over ``boots``, one replicate a boot."""
    if not boots:
        return []
    first = boots[0]
    shape = [(run.slots, run.search) for run in first.runs]
    for boot in boots[1:]:
        if [(run.slots, run.search) for run in boot.runs] != shape:
            raise BootsDisagree("the boots ran other slot counts or another memslot search: not one host's replicates")
    out = []
    for index, (slots, search) in enumerate(shape):
        runs = [boot.runs[index] for boot in boots]
        figures = [run.figures.get(KIND) for run in runs]
        if any(f is None for f in figures):
            continue
        variant = {"kind": KIND, "slots": slots, "layout": layout, "structure": search or "not counted"}
        setting, env = settings(first, layout), environment.to_json()
        out.append(
            Measurement(
                scenario=SCENARIO,
                metric="miss_ns",
                unit="ns",
                better="lower",
                samples=[],
                replicates=[[f.ns_per_access] for f in figures if f is not None],
                extra={"unit_of_replication": "a boot of the host under test", "clock_reads": "L1's CLOCK_MONOTONIC"},
                variant=variant,
                settings=setting,
                environment=env,
            )
        )
        walks = [f.counted.nodes_per_miss for f in figures if f is not None and f.counted is not None]
        if len(walks) == len(runs) and all(w is not None for w in walks):
            checks = [next((c for c in run.checks if c.kind == KIND), None) for run in runs]
            out.append(
                Measurement(
                    scenario=SCENARIO,
                    metric="miss_nodes",
                    unit="nodes",
                    better="lower",
                    samples=[],
                    replicates=[[float(w)] for w in walks if w is not None],
                    extra={
                        "unit_of_replication": "a boot of the host under test",
                        "counted_by": "the kernel's memslot_miss_nodes over memslot_misses",
                        "model_nodes": [c.expected_miss_nodes if c is not None else None for c in checks],
                        "model_check": [c.verdict if c is not None else None for c in checks],
                    },
                    variant=variant,
                    settings=setting,
                    environment=env,
                )
            )
    return out

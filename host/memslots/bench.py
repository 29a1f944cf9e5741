"""How fast the model answers: time per lookup for each structure.

Each repeat times one batch of lookups per structure; the structures take
turns in an order that rotates and flips every repeat (so drift in the
machine's speed, e.g. another process waking up on our 2 cores, spreads
over all of them instead of favouring one).  Reported: the median time per
lookup and the spread (quartiles and min-max) over the repeats, in
microseconds, including the Python call; ``call`` is an empty function
called the same way, the floor under every figure.  The garbage collector
is off while a batch runs.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from memqual.host.memslots.layout import load_layout
from memqual.host.memslots.structures import STRUCTURES, build
from memqual.host.memslots.workloads import generate


@dataclasses.dataclass(frozen=True)
class BenchResult:
    structure: str
    workload: str
    samples_us: list[float]  # time per lookup, one sample per repeat

    def summary(self) -> dict[str, Any]:
        s = sorted(self.samples_us)
        q1, median, q3 = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else (s[0], s[0], s[0])
        return {
            "structure": self.structure,
            "workload": self.workload,
            "median_us": median,
            "q1_us": q1,
            "q3_us": q3,
            "min_us": s[0],
            "max_us": s[-1],
            "repeats": len(s),
        }


def _empty(gfn: int) -> tuple[None, int]:
    return None, 0


def _time_batch(lookup: Callable[[int], Any], gfns: list[int]) -> float:
    """Microseconds per lookup over one pass of ``gfns``."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for gfn in gfns:
            lookup(gfn)
        elapsed = time.perf_counter_ns() - start
    finally:
        if gc_was_on:
            gc.enable()
    return elapsed / len(gfns) / 1000.0


def run_bench(layout_name: str, workloads: list[str], repeats: int, batch: int, seed: int = 0) -> list[BenchResult]:
    layout = load_layout(layout_name)
    names = ["call", *STRUCTURES]
    results: list[BenchResult] = []
    for workload in workloads:
        gfns = generate(layout, workload, batch, seed)
        lookups: dict[str, Callable[[int], Any]] = {"call": _empty}
        for name in STRUCTURES:
            lookups[name] = build(name, layout).lookup
        samples: dict[str, list[float]] = {name: [] for name in names}
        for name in names:  # warm-up pass, not recorded
            _time_batch(lookups[name], gfns)
        for r in range(repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            if r % 2:
                order.reverse()
            for name in order:
                samples[name].append(_time_batch(lookups[name], gfns))
        results.extend(BenchResult(name, workload, samples[name]) for name in names)
    return results

"""The lookup benchmark in L1 as records (host/memslots/l1_lookup_records.py):
one replicate a boot, a miss's walk only where the kernel counted it."""

from __future__ import annotations

import json

import pytest

from memqual.host.core.environment import Environment
from memqual.host.memslots import l1_lookup as L
from memqual.host.memslots import l1_lookup_records as R

CONFIG = L.L1LookupConfig(slots=(8,), iterations=100, rounds=1, unroll=8, ram_mib=4)
ENV = Environment(accel="tcg").with_host("K in TCG+SVM, L2 accel kvm", "6.1.192-memqual").with_clock("icount:0", 1)


def boot(miss_ns: int, miss_nodes: int | None, search: str = "linear") -> L.L1LookupResult:
    """One boot at 8 slots: each miss one search of ``miss_nodes`` nodes
    (counted apart when given) and one instruction fetch of one node."""
    geo = CONFIG.reference().geometry(8)
    lines = []
    for kind in ("null", "miss", "ram_hit", "small_hit"):
        accesses = 0 if kind == "null" else 800
        misses = 800 if kind == "miss" else 0
        nodes = misses * (miss_nodes or 8) + (accesses if kind == "miss" else 0)
        counters: dict[str, int] = {"lookups": misses * 2, "nodes": nodes, "misses": misses}
        if miss_nodes is not None:
            counters["miss_nodes"] = misses * miss_nodes
        obj = {
            "kind": kind,
            "round": 0,
            "slots": 8,
            "iterations": 100,
            "unroll": 8,
            "accesses": accesses,
            "target_gpa": geo.targets()["ram_hit" if kind == "null" else kind],
            "ns": 80_000 + (800 * miss_ns if kind == "miss" else 0),
            "cpu_ns": 0,
            "exits": 0,
            "mmio_exits": 0,
            "eventfd": misses,
            "counters": counters,
            "search": search,
        }
        lines.append(json.dumps(obj))
    passes = L.parse_passes("\n".join(lines))
    figures = L.kind_figures(passes)
    checks = tuple(L.model_checks(CONFIG, figures, search))
    return L.L1LookupResult(CONFIG, (L.SlotRun(8, tuple(passes), figures, checks, search, counted=True),))


def test_each_boot_is_a_replicate_and_the_walk_is_the_kernels() -> None:
    recs = {r.metric: r for r in R.records([boot(3500, 8), boot(3501, 8)], ENV)}
    assert set(recs) == {"miss_ns", "miss_nodes"}
    assert recs["miss_ns"].replicates == [[3500.0], [3501.0]]
    assert recs["miss_nodes"].replicates == [[8.0], [8.0]]
    assert recs["miss_nodes"].variant == {"kind": "miss", "slots": 8, "layout": R.UNIFORM_LAYOUT, "structure": "linear"}
    assert recs["miss_nodes"].extra["model_check"] == [L.AGREES, L.AGREES]
    assert recs["miss_nodes"].environment["host_under_test"] == "K in TCG+SVM, L2 accel kvm"
    assert recs["miss_nodes"].environment["clock"] == "icount:0"
    # the kernel is not in the settings: two kernels' records pair
    assert R.records([boot(1, 8, "tree2011")], ENV)[0].settings == recs["miss_ns"].settings


def test_a_kernel_without_the_miss_counter_gives_no_walk_and_other_boots_are_refused() -> None:
    assert [r.metric for r in R.records([boot(3500, None)], ENV)] == ["miss_ns"]
    with pytest.raises(R.BootsDisagree):
        R.records([boot(3500, 8), boot(3500, 8, "tree2011")], ENV)
    assert R.records([], ENV) == []

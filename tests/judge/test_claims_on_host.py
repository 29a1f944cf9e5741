"""A claim measured where it lives (``on_host`` in claims/claims.json):
memslot-miss judged from the host under test's kernels' counts when a run
holds both sides, from the model otherwise; the counts decide the verdict
both ways."""

from __future__ import annotations

import dataclasses

import pytest

from memqual.host.core.environment import Environment
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import MEASURED, MODEL, NOT_REPRODUCED, REPRODUCED, Verdict
from memqual.host.memslots import l1_lookup_records as R

HOST = "6.1.192-memqual-x kvm.mmio_caching=0 in TCG+SVM, L2 accel kvm"
ENV = Environment(accel="tcg").with_host(HOST, "6.1.192-memqual").with_clock("icount:0", 1)


def miss_nodes(structure: str, nodes: float, boots: int = 3, layout: str = "seed-000") -> Measurement:
    """What ``memqual memslots kvm --lookup --host-kernel --records``
    writes for one kernel: a miss's walk, one replicate a boot."""
    return Measurement(
        scenario=R.SCENARIO,
        metric="miss_nodes",
        unit="nodes",
        better="lower",
        samples=[],
        replicates=[[nodes] for _ in range(boots)],
        variant={"kind": "miss", "slots": 9, "layout": layout, "structure": structure},
        settings={"layout": layout, "iterations": 200},
        environment=ENV.to_json(),
    )


def verdict(records: list[Measurement]) -> Verdict:
    claim = next(c for c in load() if c.id == "memslot-miss")
    return evaluate([claim], records)[0]


@pytest.mark.parametrize(
    ("tree", "array", "expected"),
    [
        (6.0, 35.0, REPRODUCED),  # the seed's 6-7 against 32-35: 5.8x
        (35.0, 35.0, NOT_REPRODUCED),  # a tree that walks what the array walks: no saving
        (20.0, 35.0, NOT_REPRODUCED),  # a saving, but under half the walk (below the minimum effect)
    ],
)
def test_the_kernels_counts_decide_memslot_miss_as_measured(tree: float, array: float, expected: str) -> None:
    v = verdict([miss_nodes("tree2011", tree), miss_nodes("linear", array)])
    assert v.evidence == MEASURED
    assert v.verdict == expected, v.reason
    assert v.ratio == pytest.approx(array / tree)
    assert v.ran_on is not None and v.ran_on.hosts == (HOST,) and v.ran_on.clocks == ("icount:0",)
    assert "memslots.l1_lookup miss_nodes" in v.reason


@pytest.mark.parametrize(
    "records",
    [
        [],  # nothing from a host under test
        [miss_nodes("linear", 35.0)],  # one side alone
        [miss_nodes("tree2011", 6.0, layout="kvm_lookup"), miss_nodes("linear", 35.0, layout="kvm_lookup")],
    ],
    ids=["none", "one side", "another layout"],
)
def test_without_both_kernels_on_the_seed_guest_the_model_stands(records: list[Measurement]) -> None:
    v = verdict(records)
    assert v.evidence != MEASURED
    assert v.claim.evidence.kind == MODEL and v.claim.on_host is not None


def test_fewer_than_three_boots_a_side_is_underpowered_not_a_verdict() -> None:
    v = verdict([miss_nodes("tree2011", 6.0, boots=2), miss_nodes("linear", 35.0, boots=2)])
    assert v.evidence == MEASURED and v.verdict == "underpowered"


def judged(claim_id: str, records: list[Measurement]) -> Verdict:
    claim = next(c for c in load() if c.id == claim_id)
    return evaluate([claim], records)[0]


def fault_ns(structure: str, values: list[float], conditions: str = "2011-shadow") -> Measurement:
    """What ``memqual memslots kvm --faults --host-kernel --records`` writes
    for one kernel: the guest's ns a page, one replicate a boot."""
    return Measurement(
        scenario="memslots.l1_faults",
        metric="fault_ns",
        unit="ns",
        better="lower",
        samples=[],
        replicates=[[v] for v in values],
        variant={"structure": structure, "conditions": conditions},
        settings={"guest": "pc-seed000-guest", "touch_mib": 64, "runs": 3},
        environment=ENV.to_json(),
    )


@pytest.mark.parametrize(
    ("reorder", "tree", "expected"),
    [
        ([9000.0, 9001.0, 8999.0], [9030.0, 9031.0, 9029.0], REPRODUCED),  # the tree 0.3 % slower: as seed 002
        ([9000.0, 9001.0, 8999.0], [9000.5, 9000.0, 9001.0], REPRODUCED),  # the same: "as good as"
        ([9000.0, 9001.0, 8999.0], [8700.0, 8701.0, 8699.0], NOT_REPRODUCED),  # the tree 3 % faster
    ],
)
def test_the_guests_fault_time_decides_memslot_hit_as_measured(
    reorder: list[float], tree: list[float], expected: str
) -> None:
    v = judged("memslot-hit", [fault_ns("reorder", reorder), fault_ns("tree2011", tree)])
    assert v.evidence == MEASURED
    assert v.verdict == expected, v.reason


def test_memslot_hit_without_both_kernels_stays_not_measurable() -> None:
    v = judged("memslot-hit", [fault_ns("reorder", [9000.0] * 3), fault_ns("tree2011", [9000.0] * 3, "today")])
    assert v.evidence != MEASURED


def kind_counts(
    counts: dict[str, list[int]], conditions: str = "2011-npt", workload: str = "tcp_rr"
) -> list[Measurement]:
    """memslots.l1_lookup_kinds as the --netperf and --faults runs write
    them: a record a kind, one count a boot over the window's seconds."""
    return [
        Measurement(
            scenario="memslots.l1_lookup_kinds",
            metric="events_per_s",
            unit="1/s",
            better="lower",
            samples=[],
            replicates=[[c / 2.0] for c in values],
            variant={"kind": kind, "structure": "rbtree", "conditions": conditions, "workload": workload},
            settings={"guest": "pc-seed000-guest", "accel": "kvm"},
            extra={"counts": values, "seconds": [2.0] * len(values)},
            environment=ENV.with_accel("kvm", "under the host under test's KVM").to_json(),
        )
        for kind, values in counts.items()
    ]


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"miss": [900, 950, 920], "ram_hit": [300, 310, 305], "other_hit": [2, 3, 1]}, REPRODUCED),
        ({"miss": [90, 95, 92], "ram_hit": [3000, 3100, 3050], "other_hit": [2, 3, 1]}, NOT_REPRODUCED),
    ],
    ids=["Avi's order", "RAM hits first"],
)
def test_the_kernels_counts_decide_memslot_priorities_on_the_host(counts: dict[str, list[int]], expected: str) -> None:
    v = judged("memslot-priorities", kind_counts(counts))
    assert v.evidence == MEASURED and v.claim.on_host is None
    assert "counted by the searching kernel" in v.claim.evidence.instead
    assert v.verdict == expected, v.reason


@pytest.mark.parametrize(
    ("conditions", "workload"), [("2011-shadow", "tcp_rr"), ("2011-npt", "fault_probe")], ids=["shadow", "fault window"]
)
def test_priorities_counted_under_other_conditions_or_windows_do_not_decide_on_the_host(
    conditions: str, workload: str
) -> None:
    counts = {"miss": [900, 950, 920], "ram_hit": [300, 310, 305], "other_hit": [2, 3, 1]}
    v = judged("memslot-priorities", kind_counts(counts, conditions, workload))
    assert "counted by the searching kernel" not in v.claim.evidence.instead


def transactions(structure: str, per_s: float, scenario: str = "memslots.l1_netperf") -> Measurement:
    """TCP_RR transactions a second as ``--netperf`` writes them (or,
    under memslots.l1_faults, the register round trips ``--faults`` does)."""
    return Measurement(
        scenario=scenario,
        metric="tcp_rr_per_s" if scenario == "memslots.l1_netperf" else "mmio_round_trips_per_s",
        unit="1/s",
        better="higher",
        samples=[],
        replicates=[[per_s * f] for f in (1.0, 1.0005, 0.9995)],
        variant={"structure": structure, "conditions": "2011-npt", "workload": "tcp_rr"},
        settings={"guest": "pc-seed000-guest", "workload": "tcp_rr 10.9.0.100:7 1000 x 3"},
        environment=ENV.to_json(),
    )


@pytest.mark.parametrize(
    ("array", "tree", "expected"),
    [
        (6000.0, 6180.0, REPRODUCED),  # the seed's +3 %
        (6000.0, 6012.0, NOT_REPRODUCED),  # +0.2 %: below the 1 % minimum effect
        (6000.0, 5820.0, NOT_REPRODUCED),  # the tree slower
    ],
)
def test_tcp_rr_transactions_decide_memslot_netperf_as_measured(array: float, tree: float, expected: str) -> None:
    v = judged("memslot-netperf", [transactions("linear", array), transactions("tree2011", tree)])
    assert v.evidence == MEASURED
    assert v.verdict == expected, v.reason


def test_register_round_trips_alone_no_longer_decide_memslot_netperf() -> None:
    records = [transactions(s, r, "memslots.l1_faults") for s, r in (("linear", 20000.0), ("tree2011", 20600.0))]
    assert judged("memslot-netperf", records).evidence != MEASURED


def test_memslot_netperf_with_one_kernel_stays_not_measurable() -> None:
    assert judged("memslot-netperf", [transactions("linear", 6000.0)]).evidence != MEASURED


def test_records_of_this_machine_never_switch_a_claim_to_its_host_under_test() -> None:
    """The same scenario and variants, but no host under test in the
    records' environment: the claim keeps its registered evidence."""
    here = Environment(accel="kvm").with_clock("icount:0", 1).to_json()
    records = [
        dataclasses.replace(transactions(s, r), environment=here) for s, r in (("linear", 6e3), ("tree2011", 6.18e3))
    ]
    v = judged("memslot-netperf", records)
    assert v.evidence != MEASURED and v.claim.on_host is not None


def ksm_windows(cost: dict[int, float], host: bool) -> list[Measurement]:
    env = ENV if host else Environment(accel="tcg").with_clock("wall")
    return [
        Measurement(
            scenario="ksm.volatile_scan",
            metric="ksmd_cpu_ns_per_page",
            unit="ns",
            better="lower",
            samples=[],
            replicates=[[ns * f] for f in (1.0, 1.01, 0.99)],
            variant={"smart_scan": smart, "pages": "4k"},
            settings={"guest_mib": 256},
            environment=env.to_json(),
        )
        for smart, ns in cost.items()
    ]


@pytest.mark.parametrize("host", [True, False], ids=["host under test", "this machine"])
def test_ksm_windows_name_the_host_their_ksmd_ran_in(host: bool) -> None:
    v = judged("ksm-volatile-4k", ksm_windows({0: 6434.0, 1: 1377.0}, host))
    assert ("host under test" in v.claim.evidence.instead) is host
    assert v.claim.on_host is (None if host else v.claim.on_host)

"""``memqual memslots kvm --lookup --host-kernel``: its table from a
result (host/cli/memslots_l1.py), its options refused before any boot."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from memqual.host.cli import memslots_l1
from memqual.host.memslots import kvm_lookup
from memqual.host.memslots import l1_layout as LL
from memqual.host.memslots import l1_lookup as L
from memqual.host.memslots.layout import Layout, Slot

CONFIG = L.L1LookupConfig(slots=(8,), iterations=100, rounds=1, unroll=8, ram_mib=4)


def result(miss_nodes: int) -> L.L1LookupResult:
    """One slot count, one round; the kernel counts one lookup an access,
    ``miss_nodes`` nodes for a miss and one for a hit (6.1's cached slot)."""
    geo = CONFIG.reference().geometry(8)
    counts = {"null": (0, 0, 0), "miss": (800, 800 * miss_nodes, 800), "ram_hit": (800, 800, 0)}
    lines = []
    for kind, (lookups, nodes, misses) in counts.items():
        ns = 80_000 + (0 if kind == "null" else 800 * 300)
        target = geo.targets()["ram_hit" if kind == "null" else kind]
        lines.append(
            L.Pass(
                kind=kind,
                round=0,
                slots=8,
                iterations=100,
                unroll=8,
                accesses=0 if kind == "null" else 800,
                target_gpa=target,
                ns=ns,
                cpu_ns=ns,
                exits=0,
                mmio_exits=0,
                eventfd=0,
                counters=L.Counters(lookups, nodes, misses),
                search="rbtree",
            )
        )
    figures = L.kind_figures(lines)
    checks = tuple(L.model_checks(CONFIG, figures, "rbtree"))
    return L.L1LookupResult(CONFIG, (L.SlotRun(8, tuple(lines), figures, checks, "rbtree", counted=True),))


def test_the_table_names_host_clock_structure_and_each_check() -> None:
    walk = kvm_lookup.model_nodes(CONFIG.reference().geometry(8), "rbtree")["miss"]
    agreeing = memslots_l1.render(result(walk + 1), "K in TCG+SVM", "icount:0")
    assert agreeing[0] == "host: K in TCG+SVM, clock icount:0; memslot search: rbtree"
    miss = next(line for line in agreeing if line.startswith("miss"))
    assert miss.split()[1:3] == ["8", "300.0"] and miss.endswith("agrees")
    assert not any(line.startswith("differs") for line in agreeing)
    differing = memslots_l1.render(result(walk + 3), "K in TCG+SVM", "icount:0")
    assert next(line for line in differing if line.startswith("miss")).endswith("differs")
    assert any(line.startswith("differs: miss at 8 slots") for line in differing)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--host-kernel-param", "kvm.mmio_caching=0"], "give --host-kernel KERNEL with it"),
        (["--host-kernel", "6.1.0-57-amd64", "--miss", "neither"], "invalid choice"),
        (["--host-kernel", "6.1.0-57-amd64", "--host-kernel", "6.1.0-57-amd64"], "given twice"),
        (["--host-kernel", "6.1.0-57-amd64", "--layout", "/nonexistent.json"], "layout file /nonexistent.json"),
        (["--host-kernel", "6.1.0-57-amd64", "--layout", "seed-000", "--miss-gfn", "0x100"], "miss gfn 0x100"),
        (["--host-kernel", "6.1.0-57-amd64", "--layout", "seed-000", "--hit-gfn", "0xc5"], "hit gfn 0xc5"),
        (["--host-kernel", "6.1.0-57-amd64", "--miss-gfn", "5"], "give --layout FILE|seed-000"),
        (["--layout", "seed-000"], "give --host-kernel KERNEL"),
        (["--host-kernel", "6.1.0-57-amd64", "--host-2011", "svm"], "give --layout FILE|seed-000"),
        (["--faults"], "--faults counts the host under test's memslot searches: give --host-kernel KERNEL"),
        (["--faults", "--host-kernel", "6.1.0-57-amd64", "--layout", "seed-000"], "give no --layout"),
        (["--netperf"], "--netperf counts the host under test's memslot searches: give --host-kernel KERNEL"),
        (["--netperf", "--faults", "--host-kernel", "6.1.0-57-amd64"], "two workloads of seed 000's guest: give one"),
        (["--netperf", "--host-kernel", "6.1.0-57-amd64", "--hit-gfn", "5"], "--netperf runs seed 000's guest"),
    ],
)
def test_bad_options_are_one_line_and_status_2_before_any_boot(argv: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memqual.host.cli.main", "memslots", "kvm", "--lookup", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_layout_table_names_each_gfn_and_check() -> None:
    layout = Layout((Slot(0, 0, 0x100), Slot(1, 0x200, 0x80)), name="t")
    config = LL.LayoutLookup(layout, miss_gfn=0x300, hit_gfn=0x210, iterations=100, rounds=1)
    walk = LL.model_walks(config, "linear")
    counts = {"null": (0, 0, 0), "miss": (1600, 800 * (walk["miss"] + walk["null"]), 800), "hit": (0, 0, 0)}
    passes = []
    for kind, gpa in config.targets().items():
        accesses = 0 if kind == "null" else 800
        ns = 80_000 + 400 * accesses
        passes.append(L.Pass(kind, 0, 2, 100, 8, accesses, gpa, ns, ns, 0, 0, 0, L.Counters(*counts[kind]), "linear"))
    figures = L.kind_figures(passes, config.kinds())
    checks = tuple(LL.model_checks(config, figures, "linear"))
    result = LL.LayoutLookupResult(config, L.SlotRun(2, tuple(passes), figures, checks, "linear", counted=True))
    lines = memslots_l1.render_layout(result, "K in TCG+SVM", "icount:0")
    assert lines[0].startswith("host: K in TCG+SVM, clock icount:0; layout t (2 slots, 2011 host's private slots: none")
    miss = next(line for line in lines if line.startswith("miss"))
    assert miss.split()[1:3] == ["0x300", "400.0"] and miss.endswith("agrees")
    assert next(line for line in lines if line.startswith("hit")).endswith("no lookups")


def test_the_folder_s_records_judge_memslot_miss_once_both_kernels_wrote(tmp_path: Path) -> None:
    from memqual.host.core.environment import Environment
    from memqual.host.core.record import Measurement
    from memqual.host.core.record import write as write_record

    env = Environment(accel="tcg").with_host("K in TCG+SVM, L2 accel kvm", "6.1.192").with_clock("icount:0", 1)

    def kernel(structure: str, nodes: float) -> None:
        write_record(
            Measurement(
                scenario="memslots.l1_lookup",
                metric="miss_nodes",
                unit="nodes",
                better="lower",
                samples=[],
                replicates=[[nodes]] * 3,
                variant={"kind": "miss", "slots": 9, "layout": "seed-000", "structure": structure},
                settings={"layout": "seed-000"},
                environment=env.to_json(),
            ),
            tmp_path,
        )

    kernel("linear", 35.0)
    (before,) = memslots_l1.judged(tmp_path)
    assert before.startswith("claim memslot-miss (") and "(measured)" not in before
    kernel("tree2011", 6.0)
    (after,) = memslots_l1.judged(tmp_path)
    assert after.startswith("claim memslot-miss (measured)") and ": reproduced: " in after


@pytest.mark.parametrize(
    ("layout", "host_2011", "label", "ids"),
    [
        ("seed-000", None, "seed-000", [*range(10), 32, 33, 34]),  # seed 000's guest on its VMX host
        ("seed-000", "none", "seed-000+none", list(range(10))),
        ("seed-000", "svm", "seed-000+svm", list(range(10))),  # SVM registered no private slot
        ("seed-3", None, "seed-3", [0, 1, 2]),
        ("seed-3", "vmx-ept", "seed-3+vmx-ept", [0, 1, 2, 32, 33, 34]),
    ],
)
def test_a_layout_run_holds_the_2011_hosts_private_slots_as_asked(layout, host_2011, label, ids) -> None:
    args = argparse.Namespace(
        layout=layout,
        miss_gfn=None if layout == "seed-000" else "0xfebf2",
        hit_gfn=None,
        host_2011=host_2011,
        iterations=10,
        rounds=1,
        miss="ioeventfd",
    )
    made = memslots_l1.layout_config(args)
    assert made.label == label and [s.id for s in made.layout.slots] == ids
    assert made.host_2011 == (host_2011 or ("vmx-ept" if layout == "seed-000" else "none"))

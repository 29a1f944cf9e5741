"""The lookup benchmark on a given layout (guest/kvm_lookup.c's `layout`
mode, host/memslots/l1_layout.py, seed_layout.py): its argv, what it
refuses, the model check on fixed outputs both ways, seed 000's guest's
layout file, and small real runs on this machine's /dev/kvm (skipped with
the reason where it cannot run the guest)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from local_shell import LocalShell
from lookup_kvm import runnable  # noqa: F401  (the fixture the real runs use)

from memqual.host.core.errors import BadInput, GuestError
from memqual.host.memslots import kvm2011, model, seed_layout
from memqual.host.memslots import l1_layout as LL
from memqual.host.memslots import l1_lookup as L
from memqual.host.memslots.layout import Layout, Slot
from memqual.images import agents

SOURCE = agents.GUEST_DIR / "kvm_lookup.c"

# A small layout of the seed's shape: RAM, a read-only ROM, a RAM slot
# above, ids not in address order; gfn 0x300 is in none.
SMALL = Layout((Slot(0, 0, 0x100), Slot(2, 0x100, 0x10, 2), Slot(1, 0x200, 0x80, 1), Slot(3, 0x400, 4)), name="small")
CONFIG = LL.LayoutLookup(SMALL, miss_gfn=0x300, hit_gfn=0x210, iterations=100, rounds=2, deadline_s=30)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build guest/kvm_lookup.c")
    binary = tmp_path_factory.mktemp("kvm_lookup") / "kvm_lookup"
    subprocess.run(["gcc", *agents.CFLAGS, "-o", str(binary), str(SOURCE)], check=True, timeout=120)
    return str(binary)


def call(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


# --- the command line and what is refused -----------------------------------------
FIXED_WORDS = {"layout", "rounds", "unroll", "miss", "deadline", "slot", "code", "target", "hit", "ioeventfd", "exit"}


@pytest.mark.parametrize("config", [CONFIG, LL.LayoutLookup(SMALL, miss_gfn=0x300, miss="exit")])
def test_the_argv_is_numbers_and_fixed_words(config: LL.LayoutLookup) -> None:
    argv = config.argv("/tmp/kvm_lookup")
    assert argv[0] == "/tmp/kvm_lookup" and argv[1] == "layout"
    assert all(re.fullmatch(r"[0-9]+", word) or word in FIXED_WORDS for word in argv[1:]), argv
    slots = [argv[i + 1 : i + 5] for i, word in enumerate(argv) if word == "slot"]
    assert slots == [[str(s.id), str(s.base_gfn), str(s.npages), str(s.flags)] for s in SMALL.slots]  # its order
    assert argv[argv.index("code") + 1] == "0" and argv[argv.index("miss", 8) + 1] == str(0x300)
    assert ("hit" in argv) == (config.hit_gfn is not None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"miss_gfn": 0x205}, "miss gfn 0x205"),  # in a slot
        ({"miss_gfn": 1 << 20}, "miss gfn 0x100000"),  # above 4 GiB
        ({"hit_gfn": 0x105}, "hit gfn 0x105"),  # read-only
        ({"hit_gfn": 0x350}, "hit gfn 0x350"),  # in no slot
        ({"hit_gfn": 0}, "the loop's own page"),
        ({"code_gfn": 0x108}, "code gfn 0x108"),
        ({"miss": "userspace"}, "miss 'userspace'"),
        ({"unroll": 51}, "unroll 51"),
        ({"rounds": 0}, "rounds 0"),
        ({"layout": Layout((Slot(0, 0, 16), Slot(0, 32, 1)))}, "duplicate slot id 0"),
        ({"layout": Layout((Slot(0, 0, 16, 4),))}, "flags 4"),
        ({"layout": Layout((Slot(0, 0, 16, 2),))}, "no writable slot"),
    ],
)
def test_config_refuses_what_the_program_would(change: dict[str, object], message: str) -> None:
    with pytest.raises(BadInput, match=re.escape(message)):
        LL.LayoutLookup(**{**CONFIG.__dict__, **change}).check()


def test_the_code_runs_from_the_largest_writable_slot_below_4_gib() -> None:
    above = Layout((Slot(0, 0, 0xA0), Slot(1, 0xC0, 0x40, 2), Slot(2, 0x100, 0x1000), Slot(3, 0x100000, 1 << 20)))
    assert LL.code_slot(above).id == 2 and LL.default_hit(above) == 0x100 + 0x800
    assert LL.default_hit(Layout((Slot(0, 0, 1),))) is None


BASE = ["layout", "10", "slot", "0", "0", "256", "0", "code", "16"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["layout"], "usage"),
        (BASE, "target miss"),
        ([*BASE[:7], "target", "miss", "300"], "code GFN"),
        ([*BASE, "target", "miss", "5"], "miss gfn 0x5"),
        ([*BASE, "target", "miss", "1048576"], "below 4 GiB"),
        ([*BASE, "target", "miss", "300", "target", "hit", "16"], "the code's page"),
        ([*BASE, "target", "miss", "300", "target", "hit", "400"], "hit gfn 0x190 is in no writable slot"),
        ([*BASE, "slot", "0", "300", "1", "0", "target", "miss", "400"], "slot id 0 given twice"),
        ([*BASE, "slot", "1", "255", "2", "0", "target", "miss", "400"], "slots 0 and 1 overlap"),
        ([*BASE, "slot", "1", "300", "1", "4", "target", "miss", "400"], "slot FLAGS 4"),
        ([*BASE, "slot", "1", "300", "0", "0", "target", "miss", "400"], "slot PAGES 0"),
        ([*BASE, "slot", "1", "300", "1", "target", "miss", "400"], "slot FLAGS"),
        ([*BASE, "target", "miss", "300", "ram-mib", "4"], "usage"),
        ([*BASE, "target", "miss", "0x300"], "miss GFN 0x300"),
    ],
)
def test_bad_arguments_are_one_line_and_status_2(program: str, argv: list[str], says: str) -> None:
    out = call(program, *argv)
    assert out.returncode == L.EXIT_USAGE, out.stderr
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1 and says in out.stderr


# --- fixed outputs -----------------------------------------------------------------
def line(kind: str, rnd: int, counts: tuple[int, int, int] | None, search: str | None, **over: object) -> str:
    accesses = 0 if kind == "null" else 800
    ns = 80_000 + {"null": 0, "miss": 800 * 500, "hit": 800 * 20}[kind]
    obj: dict[str, object] = {
        "kind": kind,
        "round": rnd,
        "slots": 4,
        "iterations": 100,
        "unroll": 8,
        "accesses": accesses,
        "target_gpa": CONFIG.targets()[kind],
        "ns": ns,
        "cpu_ns": ns,
        "exits": 0,
        "mmio_exits": 0,
        "eventfd": accesses if kind == "miss" else 0,
        "counters": None if counts is None else dict(zip(("lookups", "nodes", "misses"), counts, strict=True)),
        "search": search,
    }
    return json.dumps({**obj, **over})


def output(miss_nodes: int | None, code_nodes: int, search: str | None) -> str:
    """Two rounds; with counts, each miss one search of its gfn of
    ``miss_nodes`` and one of the code's page (the fetch) of ``code_nodes``,
    the hits none (nested paging maps them), 4 lookups of other work a pass."""
    counts: dict[str, tuple[int, int, int] | None] = {"null": None, "miss": None, "hit": None}
    if miss_nodes is not None:
        counts = {
            "null": (4, 4, 0),
            "miss": (4 + 1600, 4 + 800 * (miss_nodes + code_nodes), 800),
            "hit": (4, 4, 0),
        }
    return "\n".join(line(k, r, counts[k], search) for r in range(2) for k in ("null", "miss", "hit")) + "\n"


def checks_of(text: str, search: str | None) -> dict[str, L.ModelCheck]:
    passes = L.parse_passes(text)
    LL.check_passes(passes, CONFIG)
    figures = L.kind_figures(passes, CONFIG.kinds())
    return {c.kind: c for c in LL.model_checks(CONFIG, figures, search)}


def test_the_model_walks_this_layout_in_its_order() -> None:
    # linear, the 2011 array indexed by slot id: every entry on a miss, the
    # code's slot (id 0) first, the hit's (id 1, registered third) second
    assert LL.model_walks(CONFIG, "linear") == {"null": 1, "miss": 4, "hit": 2}
    assert LL.model_walks(CONFIG, "skiplist") == {}


@pytest.mark.parametrize(
    ("search", "extra", "verdict"),
    [
        ("linear", 0, L.AGREES),
        ("linear", 1, L.DIFFERS),
        ("tree2011", 0, L.AGREES),
        ("tree2011", -1, L.DIFFERS),
        ("rbtree", 1, L.AGREES),  # the last-used slot's probe beside the walk
        (None, 1, L.AGREES),  # counters without a name: 6.1's tree
        ("rbtree", 0, L.DIFFERS),
    ],
)
def test_the_miss_against_the_model_both_ways(search: str | None, extra: int, verdict: str) -> None:
    structure = search or "rbtree"
    walks = LL.model_walks(CONFIG, structure)
    code = 1 if structure == "rbtree" else walks["null"]  # the fetch: a hit of the code's slot
    checks = checks_of(output(walks["miss"] + extra, code, search), search)
    miss = checks["miss"]
    assert (miss.structure, miss.gfn, miss.model_nodes, miss.lookups_per_access) == (structure, 0x300, walks["miss"], 2)
    own = walks["miss"] + (1 if structure == "rbtree" else 0)
    assert miss.expected_nodes == pytest.approx((own + code) / 2) and miss.verdict == verdict
    assert checks["hit"].verdict == L.NO_LOOKUPS  # nested paging maps the hit: no search of it


def test_no_counters_no_checks_and_ns_per_access() -> None:
    passes = L.parse_passes(output(None, 0, None))
    figures = L.kind_figures(passes, CONFIG.kinds())
    assert figures["miss"].ns_per_access == 500.0 and figures["hit"].ns_per_access == 20.0
    assert LL.model_checks(CONFIG, figures, None) == []


def test_passes_not_asked_for_are_refused() -> None:
    lines = output(None, 0, None).splitlines()
    with pytest.raises(GuestError, match="printed 5 passes, not the 6"):
        LL.check_passes(L.parse_passes("\n".join(lines[:-1])), CONFIG)
    moved = [line("miss", 0, None, None, target_gpa=0x1000), *lines[:1], *lines[2:]]
    with pytest.raises(GuestError, match="asked: 100 x 8 at 0x300000 over 4"):
        LL.check_passes(L.parse_passes("\n".join(moved)), CONFIG)


def test_a_run_through_a_shell_parses_what_the_program_printed(tmp_path: Path) -> None:
    walks = LL.model_walks(CONFIG, "tree2011")
    (tmp_path / "out.txt").write_text(output(walks["miss"], walks["null"], "tree2011"))
    fake = tmp_path / "fake"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat {tmp_path}/out.txt\n')
    fake.chmod(0o755)
    result = LL.run(LocalShell(), CONFIG, program=str(fake))
    assert (tmp_path / "argv").read_text().split() == CONFIG.argv("")[1:]
    assert result.run.counted and result.run.search == "tree2011" and result.findings() == []
    assert json.loads(json.dumps(result.to_json()))["run"]["figures"]["miss"]["ns_per_access"] == 500.0


# --- seed 000's guest's layout -----------------------------------------------------
def test_the_seed_layout_file_is_the_seed_guests() -> None:
    seed = seed_layout.load()
    assert len(seed.layout) == 10 and [s.id for s in seed.layout.slots] == list(range(10))
    assert seed.nic.model == "rtl8139" and seed.layout.find(seed.miss_gfn) is None
    big = [s for s in seed.layout.slots if s.npages >= (1 << 30) // 4096]
    assert [s.base_gfn >= 1 << 20 for s in big] == [False, True]  # RAM both sides of the PCI hole
    # the claim's figures, from this file on the 2011 host the judge models
    on_2011 = kvm2011.on_host(seed.layout)
    assert [model.nodes_at(on_2011, s, seed.miss_gfn) for s in ("tree2011", "linear")] == [6, 35]
    config = LL.LayoutLookup(seed.layout, seed.miss_gfn, hit_gfn=LL.default_hit(seed.layout))
    config.check()
    assert LL.code_slot(seed.layout).id == 6 and config.code == 0x100


@pytest.mark.parametrize(
    ("nic", "message"),
    [(None, 'no "nic"'), ({"model": "rtl8139", "start": 0x1000}, 'no "nic"'), ({"start": 0, "end": 9}, "lies in")],
)
def test_a_seed_layout_without_its_bar_is_refused(nic: object, message: str) -> None:
    data: dict[str, object] = {"slots": [{"id": 0, "base_gfn": 0, "npages": 16}]}
    if nic is not None:
        data["nic"] = nic
    with pytest.raises(BadInput, match=message):
        seed_layout.parse(data, "t")


def test_the_seed_layout_round_trips(tmp_path: Path) -> None:
    seed = seed_layout.load()
    seed_layout.write(seed, tmp_path / "s.json")
    assert seed_layout.load(tmp_path / "s.json") == seed
    assert (tmp_path / "s.json").read_text() == seed_layout.PATH.read_text()


# --- real runs on this machine's /dev/kvm ----------------------------------------------


@pytest.mark.parametrize("miss", L.MISS_MODES)
@pytest.mark.usefixtures("runnable")
def test_a_real_run_misses_leave_the_guest_and_hits_do_not(program: str, miss: str) -> None:
    result = LL.run(LocalShell(), LL.LayoutLookup(**{**CONFIG.__dict__, "miss": miss}), program=program)
    assert not result.run.counted and result.run.checks == () and result.run.slots == 4
    assert sorted((p.round, p.kind) for p in result.run.passes) == [
        (r, k) for r in range(2) for k in ("hit", "miss", "null")
    ]
    for p in result.run.passes:
        misses = p.accesses if p.kind == "miss" else 0
        assert (p.mmio_exits, p.eventfd) == ((misses, 0) if miss == "exit" else (0, misses)), p
        assert p.exits == (misses if miss == "exit" else 0)
    assert set(result.run.figures) == {"miss", "hit"}


@pytest.mark.usefixtures("runnable")
def test_a_real_run_registers_the_seed_guests_10_gib(program: str) -> None:
    """10 GiB of slots over one MAP_NORESERVE mapping: only the code page
    and the hit page are touched."""
    seed = seed_layout.load()
    config = LL.LayoutLookup(seed.layout, seed.miss_gfn, hit_gfn=LL.default_hit(seed.layout), iterations=20)
    result = LL.run(LocalShell(), config, program=program)
    assert result.run.slots == 10 and {p.eventfd for p in result.run.passes if p.kind == "miss"} == {160}


def test_a_layout_run_becomes_records_named_by_its_label() -> None:
    from memqual.host.core.environment import Environment
    from memqual.host.memslots import l1_lookup_records

    walks = LL.model_walks(CONFIG, "tree2011")
    lookups = {
        "null": (4, 4, 0, 0),
        "miss": (1604, 4 + 800 * (walks["miss"] + walks["null"]), 800, 800 * walks["miss"]),
    }
    lookups["hit"] = lookups["null"]
    config = LL.LayoutLookup(**{**CONFIG.__dict__, "label": "small+vmx-ept", "host_2011": "vmx-ept"})
    boots = []
    for _ in range(2):
        passes = [
            L.Pass(**{**L.parse_pass(line(k, r, None, "tree2011")).__dict__, "counters": L.Counters(*lookups[k])})
            for r in range(2)
            for k in ("null", "miss", "hit")
        ]
        figures = L.kind_figures(passes, config.kinds())
        run = L.SlotRun(
            4, tuple(passes), figures, tuple(LL.model_checks(config, figures, "tree2011")), "tree2011", True
        )
        boots.append(LL.LayoutLookupResult(config, run))
    env = Environment(accel="tcg").with_host("K in TCG+SVM", "6.1.192").with_clock("icount:0", 1)
    made = {r.metric: r for r in l1_lookup_records.records(boots, env, config.label)}
    assert made["miss_nodes"].replicates == [[float(walks["miss"])]] * 2
    assert made["miss_nodes"].variant == {
        "kind": "miss",
        "slots": 4,
        "layout": "small+vmx-ept",
        "structure": "tree2011",
    }
    assert made["miss_ns"].settings["miss_gfn"] == 0x300 and made["miss_ns"].settings["host_2011"] == "vmx-ept"
    assert made["miss_nodes"].extra["model_check"] == [L.AGREES, L.AGREES]

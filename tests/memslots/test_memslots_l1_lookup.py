"""The lookup benchmark in L1 (guest/kvm_lookup.c and
host/memslots/l1_lookup.py): the C program's loop and layout against
kvm_lookup.py's, its arguments, the parsing and the arithmetic on fixed
outputs, the model checks both ways, and small real runs on this machine's
/dev/kvm (skipped with the reason where it cannot run the guest), including
builds that aim the miss into a slot (the run must fail) and read counters
from files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import guest_program
import pytest
from local_shell import LocalShell
from lookup_kvm import runnable  # noqa: F401  (the fixture the real runs use)

from memqual.host.core.errors import BadInput, CapabilityMissing, GuestError, Timeout
from memqual.host.memslots import kvm_lookup
from memqual.host.memslots import l1_lookup as L
from memqual.images import agents


def build(directory: Path, name: str, *defines: str) -> str:
    return guest_program.build("kvm_lookup", directory, name, *defines)


program = guest_program.program_fixture("kvm_lookup")
call = guest_program.call


# --- the program against kvm_lookup.py, no /dev/kvm -----------------------------------
@pytest.mark.parametrize("unroll", [1, 3, 8, 50])
@pytest.mark.parametrize("write", [True, False])
def test_the_guest_loop_is_lookup_programs_byte_for_byte(program, write: bool, unroll: int) -> None:
    out = call(program, "program", "write" if write else "null", str(unroll))
    assert out.returncode == 0, out.stderr
    assert bytes.fromhex(out.stdout.strip()) == kvm_lookup.lookup_program(write, unroll)


@pytest.mark.parametrize(("slots", "ram_mib"), [(1, 1024), (2, 1024), (3, 4), (32, 1024), (509, 4), (32764, 1024)])
def test_the_layout_is_kvm_lookups(program, slots: int, ram_mib: int) -> None:
    out = call(program, "geometry", str(slots), "ram-mib", str(ram_mib))
    assert out.returncode == 0, out.stderr
    geo = kvm_lookup.LookupConfig(ram_mib=ram_mib).geometry(slots)
    assert json.loads(out.stdout) == {
        "slots": slots,
        "ram_bytes": geo.ram_bytes,
        "host_size": geo.host_size,
        "top_gpa": geo.top_gpa,
        **geo.targets(),
    }


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["run"],
        ["run", "8"],
        ["run", "0", "10"],
        ["run", "8", "10", "rounds"],
        ["run", "8", "10", "rounds", "0"],
        ["run", "8", "10", "rounds", "-1"],
        ["run", "8", "10", "unroll", "51"],
        ["run", "8", "10", "miss", "elsewhere"],
        ["run", "8", "10", "device", "/dev/kvm"],
        ["run", "8", "1x"],
        ["run", "32764", "10", "ram-mib", "4000"],
        ["program", "write", "0"],
        ["geometry", "8", "ram-mib"],
    ],
)
def test_bad_arguments_are_one_line_and_status_2(program, argv: list[str]) -> None:
    out = call(program, *argv)
    assert out.returncode == L.EXIT_USAGE
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1 and out.stderr.startswith("kvm_lookup: ")


def test_the_command_line_is_numbers_and_fixed_words() -> None:
    argv = L.L1LookupConfig(iterations=50, rounds=2, unroll=4, ram_mib=4, miss="exit").argv("/tmp/kvm_lookup", 8)
    assert argv == ["/tmp/kvm_lookup", "run", "8", "50", "rounds", "2", "unroll", "4", "ram-mib", "4"] + [
        "miss",
        "exit",
        "deadline",
        "600",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"miss": "userspace"}, "miss 'userspace'"),
        ({"rounds": 1001}, "rounds 1001"),
        ({"deadline_s": 0}, "deadline s 0"),
        ({"ram_mib": 4000, "slots": (32764,)}, "above 4 GiB"),
        ({"unroll": 0}, "unroll 0"),
        ({"slots": ()}, "--slots"),
    ],
)
def test_config_refuses_what_the_program_would(change, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        L.L1LookupConfig(**change).check()


# --- fixed outputs -----------------------------------------------------------------
CONFIG = L.L1LookupConfig(slots=(8,), iterations=100, rounds=2, unroll=8, ram_mib=4)


def line(kind: str, rnd: int, ns: int, counts: tuple[int, int, int] | None = None, **over: object) -> str:
    geo = CONFIG.reference().geometry(8)
    target = geo.targets()["ram_hit" if kind == "null" else kind]
    obj: dict[str, object] = {
        "kind": kind,
        "round": rnd,
        "slots": 8,
        "iterations": 100,
        "unroll": 8,
        "accesses": 0 if kind == "null" else 800,
        "target_gpa": target,
        "ns": ns,
        "cpu_ns": ns // 2,
        "exits": 0,
        "mmio_exits": 0,
        "eventfd": 800 if kind == "miss" else 0,
        "counters": None if counts is None else dict(zip(("lookups", "nodes", "misses"), counts, strict=True)),
        "search": None,
    }
    obj.update(over)
    return json.dumps(obj)


def output(counted: dict[str, tuple[int, int, int]] | None = None, **over: object) -> str:
    """Two rounds: null 80 us, miss 80 + 800 * 250 ns (round 0) and 80 +
    800 * 230 ns (round 1), ram hit 800 * 100 ns over the null, small hit
    800 * 150 ns."""
    per_access = {"miss": (250, 230), "ram_hit": (100, 100), "small_hit": (150, 150)}
    lines = []
    for rnd in range(2):
        c = counted or {}
        lines.append(line("null", rnd, 80_000, c.get("null"), **over))
        for kind, ns in per_access.items():
            lines.append(line(kind, rnd, 80_000 + 800 * ns[rnd], c.get(kind), **over))
    return "\n".join(lines) + "\n"


def test_ns_per_access_is_the_pass_minus_the_null_over_the_accesses() -> None:
    passes = L.parse_passes(output())
    L.check_passes(passes, CONFIG, 8)
    figures = L.kind_figures(passes)
    assert figures["miss"].ns_per_access == pytest.approx(240.0)  # median of 250 and 230
    assert figures["ram_hit"].ns_per_access == pytest.approx(100.0)
    assert figures["small_hit"].cpu_ns_per_access == pytest.approx(75.0)
    assert figures["ram_hit"].raw_ns_per_access == pytest.approx(200.0)
    assert figures["miss"].rounds == 2 and figures["miss"].accesses == 800
    assert all(f.counted is None for f in figures.values())
    assert L.model_checks(CONFIG, figures, None) == []


def model_walks(structure: str = "rbtree") -> dict[str, int]:
    return kvm_lookup.model_nodes(CONFIG.reference().geometry(8), structure)


def counted_output(miss_nodes: int, search: str | None, background: int = 5, fetches: int = 0) -> str:
    """A kernel counting: each miss a lookup of ``miss_nodes`` nodes, each
    hit a lookup of one node (its cached slot), ``fetches`` lookups of one
    node an access besides (an emulated instruction's fetch from the
    cached RAM slot), ``background`` lookups of one node in every pass
    (the null loop's too)."""
    b, f = background, fetches * 800
    counts = {
        "null": (b, b, 0),
        "miss": (b + 800 + f, b + 800 * miss_nodes + f, 800),
        "ram_hit": (b + 800 + f, b + 800 + f, 0),
        "small_hit": (b + 800 + f, b + 800 + f, 0),
    }
    return output(counts, search=search)


def test_counted_figures_subtract_the_null_pass() -> None:
    figures = L.kind_figures(L.parse_passes(counted_output(6, "rbtree")))
    c = figures["miss"].counted
    assert c is not None
    assert (c.lookups_per_access, c.misses_per_access, c.nodes_per_lookup) == (1.0, 1.0, 6.0)
    assert c.null_lookups == 10 and c.nodes_per_access == 6.0


@pytest.mark.parametrize(
    ("search", "extra", "fetches", "verdict"),
    [
        ("rbtree", 1, 0, L.AGREES),  # the tree's walk and the last-used slot's probe
        (None, 1, 0, L.AGREES),  # counters without a name: 6.1's tree
        ("rbtree", 1, 1, L.AGREES),  # and an instruction fetch's hit of the cached RAM slot
        ("rbtree", 0, 0, L.DIFFERS),  # one node short: the probe not counted
        ("rbtree", 0, 1, L.DIFFERS),
        ("rbtree", 2, 0, L.DIFFERS),
    ],
)
def test_the_miss_against_the_model_both_ways(search: str | None, extra: int, fetches: int, verdict: str) -> None:
    walk = model_walks()["miss"]
    figures = L.kind_figures(L.parse_passes(counted_output(walk + extra, search, fetches=fetches)))
    checks = {c.kind: c for c in L.model_checks(CONFIG, figures, search)}
    miss = checks["miss"]
    assert (miss.structure, miss.model_nodes, miss.lookups_per_access) == ("rbtree", walk, 1.0 + fetches)
    assert miss.expected_nodes == pytest.approx((walk + 1.0 + fetches) / (1 + fetches))
    assert miss.verdict == verdict and miss.gfn == CONFIG.reference().geometry(8).targets()["miss"] // 4096
    assert checks["ram_hit"].verdict == checks["small_hit"].verdict == L.AGREES  # one probe of the cached slot
    assert f"{(walk + extra + fetches) / (1 + fetches):.2f} nodes per lookup" in miss.note


def test_an_uncached_structure_expects_its_own_walk() -> None:
    walks = model_walks("linear")
    assert walks["miss"] == 8  # every one of the 8 entries compared
    figures = L.kind_figures(L.parse_passes(counted_output(walks["miss"], "linear")))
    checks = {c.kind: c for c in L.model_checks(CONFIG, figures, "linear")}
    assert checks["miss"].verdict == L.AGREES and checks["miss"].expected_nodes == 8.0
    # the hits above counted one node each; the array walks to the hit's slot
    assert checks["small_hit"].verdict == L.DIFFERS and checks["small_hit"].expected_nodes == walks["small_hit"]
    run = L.SlotRun(8, (), figures, tuple(checks.values()), "linear", counted=True)
    assert L.L1LookupResult(CONFIG, (run,)).findings() == [checks["small_hit"]]


def test_accesses_that_search_nothing_and_an_unknown_structure() -> None:
    quiet = {k: (3, 3, 0) for k in ("null", "miss", "ram_hit", "small_hit")}
    figures = L.kind_figures(L.parse_passes(output(quiet)))
    assert {c.verdict for c in L.model_checks(CONFIG, figures, None)} == {L.NO_LOOKUPS}
    # a few searches of other work in L1 during the hits' passes: still none of theirs
    stray = {**quiet, "ram_hit": (3 + 300, 3 + 900, 0)}
    checks = {c.kind: c for c in L.model_checks(CONFIG, L.kind_figures(L.parse_passes(output(stray))), None)}
    assert checks["ram_hit"].verdict == L.NO_LOOKUPS and checks["ram_hit"].measured_nodes == 3.0
    # misses whose MMIO KVM has cached: the fetch searched, the miss's gfn not
    cached = {**quiet, "miss": (3 + 800, 3 + 800, 0)}
    checks = {c.kind: c for c in L.model_checks(CONFIG, L.kind_figures(L.parse_passes(output(cached))), None)}
    assert checks["miss"].verdict == L.NO_LOOKUPS and "1.00 lookups, 0.00 misses per access" in checks["miss"].note
    figures = L.kind_figures(L.parse_passes(counted_output(5, "skiplist")))
    unknown = L.model_checks(CONFIG, figures, "skiplist")
    assert {c.verdict for c in unknown} == {L.NO_MODEL} and "no structure 'skiplist'" in unknown[0].note


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not a pass"),
        ('{"kind": "other"}', "not a pass"),
        (line("miss", 0, -5), "ns=-5"),
        (line("miss", 0, 10, exits=True), "exits=True"),
        (line("miss", 0, 10, counters={"lookups": 1, "nodes": 2}), "misses"),
        (line("miss", 0, 10, search="rb tree"), "memslot_search"),
        (line("miss", 0, 10, search="\x1b]0;x"), "memslot_search"),
    ],
)
def test_what_is_not_a_pass_is_refused(text: str, match: str) -> None:
    with pytest.raises(GuestError, match=match):
        L.parse_pass(text)


def test_passes_that_are_not_the_ones_asked_for_are_refused() -> None:
    lines = output().splitlines()
    with pytest.raises(GuestError, match="printed 7 passes, not the 8"):
        L.check_passes(L.parse_passes("\n".join(lines[:-1])), CONFIG, 8)
    moved = lines[:1] + [line("miss", 0, 9, target_gpa=0x1000)] + lines[2:]
    with pytest.raises(GuestError, match="layout has"):
        L.check_passes(L.parse_passes("\n".join(moved)), CONFIG, 8)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (L.EXIT_USAGE, BadInput),
        (L.EXIT_CANNOT, CapabilityMissing),
        (L.EXIT_DEADLINE, Timeout),
        (L.EXIT_FAILED, L.L1LookupFailed),
        (137, GuestError),
    ],
)
def test_each_exit_status_is_its_error_with_the_programs_line(status: int, error: type[Exception]) -> None:
    failure = L.failure(status, "noise\nkvm_lookup: what went wrong \x1b[2J\n", 8)
    assert type(failure) is error
    assert "what went wrong \\x1b[2J" in str(failure) and "8 slots" in str(failure)


def test_a_run_through_a_shell_parses_what_the_program_printed(tmp_path: Path) -> None:
    """A stand-in program that prints fixed output: the argv reaches it,
    its lines come back as passes, figures and checks."""
    (tmp_path / "out.txt").write_text(counted_output(model_walks()["miss"] + 1, "rbtree"))
    fake = tmp_path / "fake"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat {tmp_path}/out.txt\n')
    fake.chmod(0o755)
    result = L.run(LocalShell(), CONFIG, program=str(fake))
    assert (tmp_path / "argv").read_text().split() == CONFIG.argv("", 8)[1:]
    (run,) = result.runs
    assert run.counted and run.search == "rbtree" and len(run.passes) == 8
    assert {c.verdict for c in run.checks} == {L.AGREES} and result.findings() == []
    assert json.loads(json.dumps(result.to_json()))["runs"][0]["figures"]["miss"]["ns_per_access"] == 240.0


def test_deploy_streams_the_built_program(tmp_path: Path, memqual_cache: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build guest/kvm_lookup.c")
    shell = LocalShell()
    path = L.deploy(shell, str(tmp_path / "kvm_lookup"))
    assert Path(path).read_bytes() == agents.build_agent(L.AGENT).read_bytes()
    assert call(path, "program", "write", "8").stdout.strip() == kvm_lookup.lookup_program(True, 8).hex()


# --- real runs on this machine's /dev/kvm ----------------------------------------------


SMALL = L.L1LookupConfig(slots=(1, 8), iterations=50, rounds=2, ram_mib=4, deadline_s=30)


@pytest.mark.parametrize("miss", L.MISS_MODES)
@pytest.mark.usefixtures("runnable")
def test_a_real_run_misses_leave_the_guest_and_hits_do_not(program, miss: str) -> None:
    result = L.run(LocalShell(), L.L1LookupConfig(**{**SMALL.__dict__, "miss": miss}), program=program)
    assert [r.slots for r in result.runs] == [1, 8]
    for run in result.runs:
        assert not run.counted and run.checks == ()  # this kernel does not count its search
        for p in run.passes:
            misses = p.accesses if p.kind == "miss" else 0
            assert (p.mmio_exits, p.eventfd) == ((misses, 0) if miss == "exit" else (0, misses)), p
            assert p.ns > 0 and p.cpu_ns > 0
        assert set(run.figures) == ({"miss", "ram_hit"} if run.slots == 1 else set(kvm_lookup.KINDS))


@pytest.mark.usefixtures("runnable")
def test_a_miss_aimed_into_a_slot_fails(tmp_path: Path) -> None:
    """Built to put the miss target inside the small slot: its writes hit
    memory, the ioeventfd counts none, and the run fails instead of timing
    a hit as a miss."""
    aimed = build(tmp_path, "aimed", "-DMISS_GAP_PAGES=0")
    with pytest.raises(L.L1LookupFailed, match="0 writes came out as misses"):
        L.run(LocalShell(), L.L1LookupConfig(slots=(8,), iterations=10, ram_mib=4), program=aimed)


@pytest.mark.usefixtures("runnable")
def test_counters_are_read_where_the_kernel_has_them(tmp_path: Path) -> None:
    """Built to read its counters from files here: the run carries them
    (they do not move: no deltas, so no lookups to compare) and the
    structure's name; two of the three files are a failure."""
    params = tmp_path / "parameters"
    params.mkdir()
    for name, text in {"memslot_lookups": "7\n", "memslot_nodes": "70\n", "memslot_misses": "0\n"}.items():
        (params / name).write_text(text)
    (params / "memslot_search").write_text("linear\n")
    counting = build(tmp_path, "counting", f'-DCOUNTERS_DIR="{params}"')
    config = L.L1LookupConfig(slots=(8,), iterations=10, ram_mib=4)
    (run,) = L.run(LocalShell(), config, program=counting).runs
    assert run.counted and run.search == "linear"
    assert all(p.counters == L.Counters(0, 0, 0) for p in run.passes)
    assert {(c.structure, c.verdict) for c in run.checks} == {("linear", L.NO_LOOKUPS)}
    (params / "memslot_misses").unlink()
    with pytest.raises(L.L1LookupFailed, match="has 2 of the counters"):
        L.run(LocalShell(), config, program=counting)


@pytest.mark.usefixtures("runnable")
def test_the_deadline_ends_a_pass(program) -> None:
    config = L.L1LookupConfig(slots=(1,), iterations=L.MAX_ITERATIONS, ram_mib=4, deadline_s=1)
    with pytest.raises(Timeout, match="deadline of 1 s passed"):
        L.run(LocalShell(), config, program=program)


def with_miss_nodes(text: str, per_miss: int) -> str:
    """The same output from a kernel that also counts a miss's own nodes:
    ``per_miss`` a miss (none in the null pass)."""
    lines = []
    for raw in text.splitlines():
        obj = json.loads(raw)
        obj["counters"]["miss_nodes"] = obj["counters"]["misses"] * per_miss
        lines.append(json.dumps(obj))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("search", "extra"), [("rbtree", 1), ("linear", 0)])
def test_a_miss_s_own_walk_is_checked_apart_when_the_kernel_counts_it(search: str, extra: int) -> None:
    walk = model_walks(search)["miss"]
    right = counted_output(walk + extra, search, fetches=1)
    for per_miss, verdict in ((walk + extra, L.AGREES), (walk + extra + 1, L.DIFFERS)):
        figures = L.kind_figures(L.parse_passes(with_miss_nodes(right, per_miss)))
        c = figures["miss"].counted
        assert c is not None and c.nodes_per_miss == per_miss
        miss = {k.kind: k for k in L.model_checks(CONFIG, figures, search)}["miss"]
        assert (miss.measured_miss_nodes, miss.expected_miss_nodes) == (per_miss, walk + extra)
        assert miss.verdict == verdict, miss.note
    # A kernel without the counter: the per-lookup check alone, as before.
    figures = L.kind_figures(L.parse_passes(right))
    assert figures["miss"].counted is not None and figures["miss"].counted.nodes_per_miss is None

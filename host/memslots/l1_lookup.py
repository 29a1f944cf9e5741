"""The per-access memslot lookup benchmark in the host under test (L1):
guest/kvm_lookup.c, kvm_lookup.py's twin in C (L1 has no Python), pushed
into L1 over its SSH and run there once per slot count, with a deadline.
Its JSON lines become typed passes; per kind, L1's nanoseconds per access
(the pass minus the null pass of the same round, over the accesses) and, on
a kernel that counts its memslot search, the nodes per lookup beside the
model's for the same layout and the same gfns.  A difference is a finding,
returned with the rest.  docs/memslots-kvm.md, "The lookup benchmark in L1".
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from dataclasses import dataclass
from typing import Any

from memqual.host.core.errors import BadInput, GuestError, MemqualError
from memqual.host.core.printable import one_line
from memqual.host.core.shell import Shell
from memqual.host.memslots import kvm_lookup, l1_program, structures

AGENT = "kvm_lookup"
L1_PATH = "/tmp/kvm_lookup"
NULL = "null"
# A layout's passes (kvm_lookup layout): a miss and a hit at given gfns.
LAYOUT_KINDS = ("miss", "hit")
PASS_KINDS = (NULL, *kvm_lookup.KINDS, "hit")
MISS_MODES = ("ioeventfd", "exit")  # a miss taken in the kernel, or exiting to the program
# This machine's wait for a run beyond the program's own deadline (its
# SIGALRM in L1): time for its line on stderr to come back over SSH.
DEADLINE_SLACK_S = 30.0
# guest/kvm_lookup.c's exit statuses.
EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT, EXIT_DEADLINE = (
    l1_program.EXIT_FAILED,
    l1_program.EXIT_USAGE,
    l1_program.EXIT_CANNOT,
    l1_program.EXIT_DEADLINE,
)
# guest/kvm_lookup.c's bounds on its numbers (beyond kvm_lookup.py's).
MAX_ITERATIONS = 100_000_000
MAX_ROUNDS = 1000
MAX_RAM_MIB = 4095
MAX_DEADLINE_S = 86400

# A kernel that has the counters but no memslot_search counts 6.1's own
# search: its red-black tree.
COUNTED_WITHOUT_NAME = "rbtree"
# The searches that probe a last-used slot before their structure (6.1's
# per-vCPU cache in front of the tree; the patched arrays and the 2011 tree
# have none).  By the counting rule the probe is one node: a hit of the
# slot it holds costs 1, a miss 1 + the structure's walk.
CACHED = frozenset({"rbtree"})
# Nodes per lookup are exact counts averaged over thousands of lookups; the
# first access of a pass (it may walk where the rest hit the cache) and
# lookups of other VMs in L1 move the mean by less than this.
AGREEMENT_NODES = 0.05
# Fewer searches of their own gfn than this an access: the accesses mostly
# did not search it (a hit nested paging maps never leaves the guest; an
# MMIO access KVM has cached is not searched), and nodes per lookup are
# other searches': no comparison.
MIN_LOOKUPS_PER_ACCESS = 0.5
AGREES, DIFFERS, NO_LOOKUPS, NO_MODEL = "agrees", "differs", "no lookups", "no model"

_SEARCH_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")


class L1LookupFailed(GuestError):
    """kvm_lookup failed a check in L1 (a miss that hit a slot, a miscount,
    an exit where none belongs) or an ioctl failed: a failure, never a skip."""


@dataclass(frozen=True)
class L1LookupConfig:
    """What the program runs: per slot count one process, one VM, ``rounds``
    rounds of the null pass and each kind, ``iterations`` x ``unroll``
    writes a pass; ``miss`` says where a miss goes; ``deadline_s`` bounds
    each process in L1."""

    slots: tuple[int, ...] = (1, 32, 509)
    iterations: int = 2000
    rounds: int = 1
    unroll: int = 8
    ram_mib: int = 1024
    miss: str = "ioeventfd"
    deadline_s: int = 600

    def reference(self) -> kvm_lookup.LookupConfig:
        """The same measurement as kvm_lookup.py takes it: its layout and
        checks are the reference."""
        return kvm_lookup.LookupConfig(
            slots=self.slots,
            replicates=1,
            rounds=self.rounds,
            iterations=self.iterations,
            unroll=self.unroll,
            ram_mib=self.ram_mib,
        )

    def check(self) -> None:
        self.reference().check()
        bounds = (
            ("iterations", self.iterations, MAX_ITERATIONS),
            ("rounds", self.rounds, MAX_ROUNDS),
            ("RAM slot MiB", self.ram_mib, MAX_RAM_MIB),
            ("deadline s", self.deadline_s, MAX_DEADLINE_S),
        )
        check_bounds(self.miss, bounds)

    def argv(self, program: str, slots: int) -> list[str]:
        """The program's command line: numbers and fixed words only."""
        return [
            program,
            "run",
            str(slots),
            str(self.iterations),
            "rounds",
            str(self.rounds),
            "unroll",
            str(self.unroll),
            "ram-mib",
            str(self.ram_mib),
            "miss",
            self.miss,
            "deadline",
            str(self.deadline_s),
        ]


def check_bounds(miss: str, bounds: tuple[tuple[str, int, int], ...]) -> None:
    """The program's miss mode and each (what, value, top) with 1 <=
    value <= top, checked before anything is deployed: one line each."""
    if miss not in MISS_MODES:
        raise BadInput(f"miss {miss!r}: give one of {', '.join(MISS_MODES)}")
    for what, value, top in bounds:
        if not 1 <= value <= top:
            raise BadInput(f"{what} {value}: give 1 to {top}")


# --- one pass, as the program printed it --------------------------------------------
@dataclass(frozen=True)
class Counters:
    """The kernel's memslot counters over one pass (their deltas)."""

    lookups: int
    nodes: int
    misses: int
    # The nodes the misses compared (memslot_miss_nodes): a miss's own
    # walk apart from the hits around it; None on a kernel without it.
    miss_nodes: int | None = None

    def minus(self, other: Counters) -> Counters:
        both = self.miss_nodes is not None and other.miss_nodes is not None
        return Counters(
            self.lookups - other.lookups,
            self.nodes - other.nodes,
            self.misses - other.misses,
            (self.miss_nodes or 0) - (other.miss_nodes or 0) if both else None,
        )


@dataclass(frozen=True)
class Pass:
    kind: str
    round: int
    slots: int
    iterations: int
    unroll: int
    accesses: int  # guest writes (0 for the null pass)
    target_gpa: int
    ns: int  # CLOCK_MONOTONIC in the program's host: on icount, L1's instructions
    cpu_ns: int  # the program's thread's CPU time
    exits: int  # KVM_RUN returns before the report
    mmio_exits: int
    eventfd: int  # misses the ioeventfd took in the kernel
    counters: Counters | None  # None: the kernel does not count its search
    search: str | None  # memslot_search: the kernel's structure


def _count(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise GuestError(f"kvm_lookup printed {key}={one_line(value)!s:.40}, not a count")
    return value


def _counters(value: object) -> Counters | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise GuestError(f"kvm_lookup printed counters {one_line(value):.80}, not an object")
    miss_nodes = _count(value, "miss_nodes") if "miss_nodes" in value else None
    return Counters(_count(value, "lookups"), _count(value, "nodes"), _count(value, "misses"), miss_nodes)


def _search(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SEARCH_NAME.fullmatch(value):
        raise GuestError(f"kvm_lookup printed memslot_search {one_line(value):.80}, not a structure's name")
    return value


# The annotations are strings here (from __future__ import annotations).
_PASS_COUNTS = tuple(f.name for f in dataclasses.fields(Pass) if f.type == "int")


def parse_pass(line: str) -> Pass:
    """One line of the program's output; GuestError when it is not one."""
    try:
        obj = json.loads(line)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or obj.get("kind") not in PASS_KINDS:
        raise GuestError(f"not a pass of kvm_lookup: {one_line(line):.120}")
    return Pass(
        kind=obj["kind"],
        **{key: _count(obj, key) for key in _PASS_COUNTS},
        counters=_counters(obj.get("counters")),
        search=_search(obj.get("search")),
    )


def parse_passes(text: str) -> list[Pass]:
    return [parse_pass(line) for line in text.splitlines() if line.strip()]


def check_passes(passes: list[Pass], config: L1LookupConfig, slots: int) -> None:
    """The passes are the ones asked for, on kvm_lookup.py's layout:
    GuestError otherwise (the program and the reference disagree)."""
    targets = config.reference().geometry(slots).targets()
    targets[NULL] = targets["ram_hit"]  # the null loop runs on the RAM target
    want = sorted((r, k) for r in range(config.rounds) for k in targets)
    if sorted((p.round, p.kind) for p in passes) != want:
        raise GuestError(f"kvm_lookup at {slots} slots printed {len(passes)} passes, not the {len(want)} asked for")
    for p in passes:
        asked = (slots, config.iterations, config.unroll, 0 if p.kind == NULL else config.iterations * config.unroll)
        if (p.slots, p.iterations, p.unroll, p.accesses) != asked or p.target_gpa != targets[p.kind]:
            raise GuestError(
                f"kvm_lookup's {p.kind} pass at {slots} slots ran {p.iterations} x {p.unroll} at "
                f"{p.target_gpa:#x}; kvm_lookup.py's layout has {targets[p.kind]:#x}"
            )


# --- per kind ----------------------------------------------------------------------
@dataclass(frozen=True)
class CountedFigures:
    """What the kernel's counters say of a kind, its passes minus the null
    passes of the same rounds (the loop's own lookups cancel), summed over
    the rounds."""

    lookups_per_access: float
    misses_per_access: float
    nodes_per_access: float
    nodes_per_lookup: float | None  # None: the accesses searched no more than the null loop
    null_lookups: int  # what the null passes counted (the subtraction)
    # A miss's own walk (memslot_miss_nodes over the misses), apart from
    # the hits around it; None without that counter or without misses.
    nodes_per_miss: float | None = None


@dataclass(frozen=True)
class KindFigures:
    kind: str
    slots: int
    accesses: int  # per pass
    rounds: int
    ns_per_access: float  # median over rounds of (pass - null) / accesses, CLOCK_MONOTONIC
    cpu_ns_per_access: float  # the same on the thread's CPU clock
    raw_ns_per_access: float  # median of pass / accesses, the null pass not subtracted
    exits_per_access: float
    counted: CountedFigures | None


def _counted(kind: list[Pass], null: list[Pass]) -> CountedFigures | None:
    if any(p.counters is None for p in kind + null):
        return None
    total = Counters(0, 0, 0, 0)
    for p, z in zip(kind, null, strict=True):
        assert p.counters is not None and z.counters is not None
        diff = p.counters.minus(z.counters)
        miss_nodes = None if total.miss_nodes is None or diff.miss_nodes is None else total.miss_nodes + diff.miss_nodes
        total = Counters(total.lookups + diff.lookups, total.nodes + diff.nodes, total.misses + diff.misses, miss_nodes)
    accesses = sum(p.accesses for p in kind)
    return CountedFigures(
        lookups_per_access=total.lookups / accesses,
        misses_per_access=total.misses / accesses,
        nodes_per_access=total.nodes / accesses,
        nodes_per_lookup=total.nodes / total.lookups if total.lookups > 0 else None,
        null_lookups=sum(z.counters.lookups for z in null if z.counters is not None),
        nodes_per_miss=total.miss_nodes / total.misses if total.miss_nodes is not None and total.misses > 0 else None,
    )


def kind_figures(passes: list[Pass], kinds: tuple[str, ...] = kvm_lookup.KINDS) -> dict[str, KindFigures]:
    """Per kind (not the null loop), from passes that ``check_passes`` took."""
    null = {p.round: p for p in passes if p.kind == NULL}
    out: dict[str, KindFigures] = {}
    for kind in kinds:
        mine = sorted((p for p in passes if p.kind == kind), key=lambda p: p.round)
        if not mine:
            continue
        nulls = [null[p.round] for p in mine]
        accesses = mine[0].accesses
        out[kind] = KindFigures(
            kind=kind,
            slots=mine[0].slots,
            accesses=accesses,
            rounds=len(mine),
            ns_per_access=statistics.median((p.ns - z.ns) / accesses for p, z in zip(mine, nulls, strict=True)),
            cpu_ns_per_access=statistics.median(
                (p.cpu_ns - z.cpu_ns) / accesses for p, z in zip(mine, nulls, strict=True)
            ),
            raw_ns_per_access=statistics.median(p.ns / accesses for p in mine),
            exits_per_access=sum(p.exits for p in mine) / (accesses * len(mine)),
            counted=_counted(mine, nulls),
        )
    return out


# --- against the model -------------------------------------------------------------
@dataclass(frozen=True)
class ModelCheck:
    """A kind's nodes per lookup as the kernel counted them, beside the
    model's structure of the same name on the same layout: the kind's gfn,
    and for each search beyond one an access, the code's."""

    kind: str
    slots: int
    structure: str
    gfn: int
    model_nodes: int | None  # the structure's own walk for the gfn (None: no such structure in the model)
    expected_nodes: float | None  # per lookup, by the counting rule (``expected_per_lookup``)
    measured_nodes: float | None
    lookups_per_access: float
    verdict: str  # AGREES, DIFFERS, NO_LOOKUPS, NO_MODEL
    note: str
    # A miss's own walk as the kernel counted it (memslot_miss_nodes) and
    # the model's for the gfn: compared directly where the kernel has it.
    measured_miss_nodes: float | None = None
    expected_miss_nodes: float | None = None


def expected_nodes(structure: str, kind: str, walk: int) -> float:
    """Nodes one search of the kind's gfn compares by the counting rule:
    the structure's walk; behind a last-used slot, one probe more for a
    miss and the probe alone for a hit (the pass's accesses all go to one
    slot, so it stays cached)."""
    if structure not in CACHED:
        return float(walk)
    return walk + 1.0 if kind == "miss" else 1.0


def own_searches(kind: str, c: CountedFigures) -> float:
    """Searches of the kind's own gfn per access: for a miss, the misses
    counted (an MMIO access whose SPTE KVM caches is not searched at all);
    for a hit, one, if the access searched at all."""
    return c.misses_per_access if kind == "miss" else min(1.0, c.lookups_per_access)


def expected_per_lookup(own: float, code: float, own_per_access: float, lookups_per_access: float) -> float:
    """Nodes per lookup when each access searches its own gfn
    ``own_per_access`` times (``own`` nodes each) and every further search
    is a hit of the code's RAM slot (``code`` nodes): the instruction fetch
    of an access KVM emulates (images/kvm-memslots/README.md, "Which
    searches a guest's MMIO miss and page-fault hit make"; the loop runs
    with paging off, so no guest page table is walked)."""
    others = max(0.0, lookups_per_access - own_per_access)
    return (own_per_access * own + others * code) / (own_per_access + others)


def _verdict(measured: float | None, expected: float, own_per_access: float) -> str:
    if measured is None or own_per_access < MIN_LOOKUPS_PER_ACCESS:
        return NO_LOOKUPS
    return AGREES if abs(measured - expected) <= AGREEMENT_NODES else DIFFERS


def model_checks(config: L1LookupConfig, figures: dict[str, KindFigures], search: str | None) -> list[ModelCheck]:
    """One check per kind the kernel counted (none without the counters)."""
    counted = {k: f for k, f in figures.items() if f.counted is not None}
    if not counted:
        return []
    slots = next(iter(counted.values())).slots
    structure = search or COUNTED_WITHOUT_NAME
    geo = config.reference().geometry(slots)
    gfns = {k: gpa // kvm_lookup.PAGE for k, gpa in geo.targets().items()}
    walks = kvm_lookup.model_nodes(geo, structure) if structure in structures.STRUCTURES else {}
    out = []
    for kind, f in counted.items():
        assert f.counted is not None
        # The code shares the RAM slot with the RAM target: the same walk.
        out.append(model_check(kind, slots, structure, gfns[kind], walks.get(kind), walks.get("ram_hit"), f.counted))
    return out


def model_check(
    kind: str, slots: int, structure: str, gfn: int, walk: int | None, code_walk: int | None, c: CountedFigures
) -> ModelCheck:
    """One kind's count against the model: ``walk`` the structure's nodes
    for the kind's gfn, ``code_walk`` for the code's (the instruction fetch
    of an emulated access searches it); None: no such structure."""
    how = f"{c.lookups_per_access:.2f} lookups, {c.misses_per_access:.2f} misses per access"
    measured = "no" if c.nodes_per_lookup is None else f"{c.nodes_per_lookup:.2f}"
    own: float | None = None
    if walk is None or code_walk is None:
        verdict, expected = NO_MODEL, None
        note = f"the model has no structure {structure!r} (it has {', '.join(structures.STRUCTURES)}); {how}"
    else:
        own, searched = expected_nodes(structure, kind, walk), own_searches(kind, c)
        code = expected_nodes(structure, "ram_hit", code_walk)
        expected = expected_per_lookup(own, code, searched, c.lookups_per_access) if searched > 0 else own
        verdict = _verdict(c.nodes_per_lookup, expected, searched)
        cache = " behind its last-used slot" if structure in CACHED else ""
        note = (
            f"{measured} nodes per lookup, the model's {structure}{cache} {expected:.2f} ({own:g} for the gfn); {how}"
        )
        if kind == "miss" and c.nodes_per_miss is not None:
            # The miss's own walk, counted apart: no hit around it to account for.
            miss_verdict = _verdict(c.nodes_per_miss, own, searched)
            verdict = miss_verdict if verdict in (AGREES, miss_verdict) else DIFFERS
            note += f"; {c.nodes_per_miss:.2f} nodes a miss's own walk, the model's {own:g}"
    return ModelCheck(
        kind=kind,
        slots=slots,
        structure=structure,
        gfn=gfn,
        model_nodes=walk,
        expected_nodes=expected,
        measured_nodes=c.nodes_per_lookup,
        lookups_per_access=c.lookups_per_access,
        verdict=verdict,
        note=note,
        measured_miss_nodes=c.nodes_per_miss if kind == "miss" else None,
        expected_miss_nodes=own if kind == "miss" else None,
    )


# --- running it --------------------------------------------------------------------
@dataclass(frozen=True)
class SlotRun:
    """One process of the program: one slot count."""

    slots: int
    passes: tuple[Pass, ...]
    figures: dict[str, KindFigures]
    checks: tuple[ModelCheck, ...]
    search: str | None
    counted: bool  # the kernel counted its search


@dataclass(frozen=True)
class L1LookupResult:
    config: L1LookupConfig
    runs: tuple[SlotRun, ...]

    def findings(self) -> list[ModelCheck]:
        """Where the kernel's count and the model's differ."""
        return [c for run in self.runs for c in run.checks if c.verdict == DIFFERS]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def deploy(shell: Shell, path: str = L1_PATH) -> str:
    """Build guest/kvm_lookup.c (cached, static) and stream it to ``path``
    through ``shell``; returns the path."""
    return l1_program.deploy(shell, AGENT, path)


def failure(status: int, stderr: str, slots: int) -> MemqualError:
    """The error for a run that ended with ``status``: the program's one
    line on stderr, kept."""
    return l1_program.failure(status, stderr, f"kvm_lookup at {slots} slots", L1LookupFailed)


def run_slots(shell: Shell, program: str, config: L1LookupConfig, slots: int) -> SlotRun:
    out = shell.run(config.argv(program, slots), timeout=config.deadline_s + DEADLINE_SLACK_S, check=False)
    if out.status != 0:
        raise failure(out.status, out.stderr, slots)
    passes = parse_passes(out.stdout)
    check_passes(passes, config, slots)
    figures = kind_figures(passes)
    search = passes[0].search
    return SlotRun(
        slots=slots,
        passes=tuple(passes),
        figures=figures,
        checks=tuple(model_checks(config, figures, search)),
        search=search,
        counted=passes[0].counters is not None,
    )


def run(shell: Shell, config: L1LookupConfig, program: str | None = None) -> L1LookupResult:
    """The program at every slot count of ``config``, one process each, in
    the host ``shell`` reaches (L1's SSH; this machine in tests); deployed
    first unless ``program`` names it there already."""
    config.check()
    path = program or deploy(shell)
    return L1LookupResult(config, tuple(run_slots(shell, path, config, n) for n in config.slots))

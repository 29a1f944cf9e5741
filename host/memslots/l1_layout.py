"""The lookup benchmark in L1 on a given memslot layout (a layout file;
seed 000's guest's: seed_layout.py), its slots registered in L1's KVM in
the layout's order, a miss at a given gfn and optionally a hit:
guest/kvm_lookup.c's `layout` mode, l1_lookup.py's passes, figures and
model check, the model built from the same layout in the same order.  The
loop runs from the layout's RAM slot, not a slot of its own, so the slots
registered are the guest's; the fetch each emulated miss makes is a hit of
that slot, which the check counts.  docs/memslots-kvm.md, "On a given
layout"."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from memqual.host.core.errors import BadInput, GuestError
from memqual.host.core.shell import Shell
from memqual.host.memslots import l1_lookup, structures
from memqual.host.memslots.l1_lookup import (
    COUNTED_WITHOUT_NAME,
    DEADLINE_SLACK_S,
    DIFFERS,
    LAYOUT_KINDS,
    MAX_DEADLINE_S,
    MAX_ITERATIONS,
    MAX_ROUNDS,
    NULL,
    ModelCheck,
    Pass,
    SlotRun,
    check_bounds,
)
from memqual.host.memslots.layout import KVM_MEM_LOG_DIRTY_PAGES, KVM_MEM_READONLY, PAGE_SIZE, Layout, Slot, validate

# The guest runs flat 32-bit with paging off: what it touches is below 4 GiB.
LOW_GFNS = (1 << 32) // PAGE_SIZE
# guest/kvm_lookup.c's bounds: KVM's slot ids (32764 user slots on x86
# today; the kernel refuses what it has not), the flags it knows.
MAX_SLOT_ID = 32767
KNOWN_FLAGS = KVM_MEM_LOG_DIRTY_PAGES | KVM_MEM_READONLY
MAX_UNROLL = 50


def code_slot(layout: Layout) -> Slot:
    """The slot the loop runs from: the layout's RAM slot, the writable one
    with the most pages below 4 GiB (the first of them on a tie)."""
    best: Slot | None = None
    for slot in layout.slots:
        low = min(slot.end_gfn, LOW_GFNS) - slot.base_gfn
        if slot.flags & KVM_MEM_READONLY or low < 1:
            continue
        if best is None or low > min(best.end_gfn, LOW_GFNS) - best.base_gfn:
            best = slot
    if best is None:
        raise BadInput(f"layout {layout.name!r}: no writable slot below 4 GiB for the guest loop to run from")
    return best


@dataclass(frozen=True)
class LayoutLookup:
    """One process of kvm_lookup's `layout` mode: ``layout``'s slots in
    their order, the loop at ``code_gfn`` (default: the RAM slot's first
    page), a miss at ``miss_gfn``, a hit at ``hit_gfn`` when given."""

    layout: Layout
    miss_gfn: int
    hit_gfn: int | None = None
    code_gfn: int | None = None
    iterations: int = 2000
    rounds: int = 1
    unroll: int = 8
    miss: str = "ioeventfd"
    deadline_s: int = 600
    # The 2011 host whose private slots the layout holds beside the guest's
    # (kvm2011.on_host: "vmx-ept", "svm"), or "none"; only for reports.
    host_2011: str = "none"
    # The layout as records name it (memslots.l1_lookup's variant "layout").
    label: str = ""

    @property
    def code(self) -> int:
        return self.code_gfn if self.code_gfn is not None else code_slot(self.layout).base_gfn

    def kinds(self) -> tuple[str, ...]:
        return LAYOUT_KINDS if self.hit_gfn is not None else LAYOUT_KINDS[:1]

    def targets(self) -> dict[str, int]:
        """Each pass's gpa, as the program prints it (the null loop: the code's)."""
        out = {NULL: self.code * PAGE_SIZE, "miss": self.miss_gfn * PAGE_SIZE}
        if self.hit_gfn is not None:
            out["hit"] = self.hit_gfn * PAGE_SIZE
        return out

    def check(self) -> None:
        """BadInput, one line, for what the program would refuse."""
        validate(self.layout)
        for slot in self.layout.slots:
            if slot.id > MAX_SLOT_ID or slot.flags & ~KNOWN_FLAGS:
                raise BadInput(f"{slot.describe()}: id above {MAX_SLOT_ID} or flags {slot.flags} beyond {KNOWN_FLAGS}")
        if self.layout.find(self.miss_gfn) is not None or not 0 <= self.miss_gfn < LOW_GFNS:
            raise BadInput(f"miss gfn {self.miss_gfn:#x}: give one below 4 GiB in no slot of the layout")
        for what, gfn in (("code", self.code), ("hit", self.hit_gfn)):
            holder = None if gfn is None else self.layout.find(gfn)
            if gfn is not None and (holder is None or holder.flags & KVM_MEM_READONLY or gfn >= LOW_GFNS):
                raise BadInput(f"{what} gfn {gfn:#x}: give one below 4 GiB in a writable slot of the layout")
        if self.hit_gfn == self.code:
            raise BadInput(f"hit gfn {self.code:#x} is the loop's own page: give another")
        bounds = (
            ("iterations", self.iterations, MAX_ITERATIONS),
            ("rounds", self.rounds, MAX_ROUNDS),
            ("unroll", self.unroll, MAX_UNROLL),
            ("deadline s", self.deadline_s, MAX_DEADLINE_S),
        )
        check_bounds(self.miss, bounds)

    def argv(self, program: str) -> list[str]:
        """The program's command line: numbers and fixed words only."""
        argv = [program, "layout", str(self.iterations), "rounds", str(self.rounds), "unroll", str(self.unroll)]
        argv += ["miss", self.miss, "deadline", str(self.deadline_s)]
        for s in self.layout.slots:
            argv += ["slot", str(s.id), str(s.base_gfn), str(s.npages), str(s.flags)]
        argv += ["code", str(self.code), "target", "miss", str(self.miss_gfn)]
        if self.hit_gfn is not None:
            argv += ["target", "hit", str(self.hit_gfn)]
        return argv


def check_passes(passes: list[Pass], config: LayoutLookup) -> None:
    """The passes are the ones asked for, at the gfns asked for: GuestError
    otherwise."""
    targets = config.targets()
    want = sorted((r, k) for r in range(config.rounds) for k in targets)
    if sorted((p.round, p.kind) for p in passes) != want:
        raise GuestError(f"kvm_lookup layout printed {len(passes)} passes, not the {len(want)} asked for")
    n = len(config.layout)
    for p in passes:
        asked = (n, config.iterations, config.unroll, 0 if p.kind == NULL else config.iterations * config.unroll)
        if (p.slots, p.iterations, p.unroll, p.accesses) != asked or p.target_gpa != targets[p.kind]:
            raise GuestError(
                f"kvm_lookup layout's {p.kind} pass ran {p.iterations} x {p.unroll} at {p.target_gpa:#x} over "
                f"{p.slots} slots; asked: {config.iterations} x {config.unroll} at {targets[p.kind]:#x} over {n}"
            )


def model_walks(config: LayoutLookup, structure: str) -> dict[str, int]:
    """Nodes the model's ``structure`` compares for each gfn of the run
    (and the code's), the layout's slots inserted in the layout's order;
    {} when the model has no such structure."""
    if structure not in structures.STRUCTURES:
        return {}
    index = structures.build(structure, config.layout)
    gfns = {kind: gpa // PAGE_SIZE for kind, gpa in config.targets().items()}
    return {kind: index.lookup(gfn)[1] for kind, gfn in gfns.items()}


def model_checks(
    config: LayoutLookup, figures: dict[str, l1_lookup.KindFigures], search: str | None
) -> list[ModelCheck]:
    """One check per kind the kernel counted (none without the counters)."""
    structure = search or COUNTED_WITHOUT_NAME
    walks = model_walks(config, structure)
    gfns = {kind: gpa // PAGE_SIZE for kind, gpa in config.targets().items()}
    out = []
    for kind, f in figures.items():
        if f.counted is None:
            continue
        # The null loop's target is the code's page: its walk is the fetch's.
        code_walk = walks.get(NULL)
        out.append(l1_lookup.model_check(kind, f.slots, structure, gfns[kind], walks.get(kind), code_walk, f.counted))
    return out


@dataclass(frozen=True)
class LayoutLookupResult:
    config: LayoutLookup
    run: SlotRun

    @property
    def runs(self) -> tuple[SlotRun, ...]:
        """As l1_lookup's result holds them (one "slot count": the layout's)."""
        return (self.run,)

    def findings(self) -> list[ModelCheck]:
        """Where the kernel's count and the model's differ."""
        return [c for c in self.run.checks if c.verdict == DIFFERS]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run(shell: Shell, config: LayoutLookup, program: str | None = None) -> LayoutLookupResult:
    """The program's `layout` mode once, in the host ``shell`` reaches (L1's
    SSH; this machine in tests); deployed first unless ``program`` names it
    there already."""
    config.check()
    path = program or l1_lookup.deploy(shell)
    n = len(config.layout)
    out = shell.run(config.argv(path), timeout=config.deadline_s + DEADLINE_SLACK_S, check=False)
    if out.status != 0:
        raise l1_lookup.failure(out.status, out.stderr, n)
    passes = l1_lookup.parse_passes(out.stdout)
    check_passes(passes, config)
    figures = l1_lookup.kind_figures(passes, config.kinds())
    search = passes[0].search
    checks = tuple(model_checks(config, figures, search))
    counted = passes[0].counters is not None
    return LayoutLookupResult(config, SlotRun(n, tuple(passes), figures, checks, search, counted))


def default_hit(layout: Layout) -> int | None:
    """A hit in the loop's slot, half way up its pages below 4 GiB (None
    when that is the loop's own page)."""
    slot = code_slot(layout)
    gfn = slot.base_gfn + (min(slot.end_gfn, LOW_GFNS) - slot.base_gfn) // 2
    return gfn if gfn != slot.base_gfn else None

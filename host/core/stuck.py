"""What a guest that stopped answering was doing, read from outside it:
its vCPUs' registers through its QEMU's monitor (in L1 under a host under
test), the place and the return addresses on its stack named from its
kernel's kallsyms, its local APIC, and its QEMU's threads in L1.  Several
samples tell a vCPU that spins from one halted for good.  Why and what it
found: docs/host-under-test.md, "A guest that stops answering"."""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable

from memqual.host.core.errors import MemqualError
from memqual.images.symbols import SymbolMap

# The symbol IDT vector 0 (divide error) enters at since 5.8: its address
# in the running kernel against the kernel file's is the KASLR shift, and
# a shift of no whole page says the file is not the kernel running.
IDT_ANCHOR = "asm_exc_divide_error"
# KASLR moves the kernel by whole 2 MiB pages (CONFIG_PHYSICAL_ALIGN's floor).
KASLR_ALIGN = 2 << 20
SAMPLES = 5
# The sampling period: the samples are spread so a loop of the guest
# shows as several addresses; it waits on nothing.
SAMPLE_GAP_S = 0.2
STACK_WORDS = 64
_REGISTER = re.compile(r"\b(RIP|RSP|RFL|CPL|HLT|CR3)=\s*([0-9a-fA-F]+)")
_TABLE = re.compile(r"^IDT=\s*([0-9a-fA-F]+)\s+([0-9a-fA-F]+)", re.M)
_WORDS = re.compile(r"^([0-9a-fA-F]+):((?:\s+0x[0-9a-fA-F]+)+)\s*$", re.M)
# Where L1's threads of the guest's QEMU are: each thread's state (stat's
# third field, after the command name's closing parenthesis), its wait
# channel and its kernel stack (root reads it); the vCPU's is the one in
# KVM's ioctl (QEMU names its threads only when asked).  A constant
# script: nothing from input reaches a shell.
L1_QEMU_THREADS = (
    'for p in /proc/[0-9]*; do IFS= read -r c <"$p/comm" 2>/dev/null || continue; '
    'case "$c" in qemu-system*) ;; *) continue;; esac; '
    'for t in "$p"/task/[0-9]*; do s=$(cat "$t/stat" 2>/dev/null); s=${s##*) }; '
    'echo "thread ${t##*/} of $c ${p#/proc/}: state ${s%% *}, wchan $(cat "$t/wchan" 2>/dev/null)"; '
    'sed "s/^/    /" "$t/stack" 2>/dev/null; done; done; echo "loadavg $(cat /proc/loadavg)"'
)


@dataclasses.dataclass(frozen=True)
class Vcpu:
    """One vCPU's registers as ``info registers`` shows them."""

    index: int
    rip: int
    rsp: int
    rflags: int
    cpl: int
    halted: bool
    idt_base: int | None

    @property
    def interrupts_on(self) -> bool:
        return bool(self.rflags & 0x200)  # RFLAGS.IF


def parse_registers(text: str) -> list[Vcpu]:
    """The vCPUs of ``info registers -a`` (or of one ``info registers``)."""
    blocks = re.split(r"^CPU#(\d+)\s*$", text, flags=re.M)
    pieces = [("0", text)] if len(blocks) == 1 else list(zip(blocks[1::2], blocks[2::2], strict=True))
    vcpus = []
    for index, body in pieces:
        values = {name: int(value, 16) for name, value in _REGISTER.findall(body)}
        if "RIP" not in values or "RSP" not in values:
            continue
        table = _TABLE.search(body)
        vcpus.append(
            Vcpu(
                index=int(index),
                rip=values["RIP"],
                rsp=values["RSP"],
                rflags=values.get("RFL", 0),
                cpl=values.get("CPL", 0),
                halted=bool(values.get("HLT", 0)),
                idt_base=int(table.group(1), 16) if table else None,
            )
        )
    return vcpus


def parse_words(text: str) -> list[int]:
    """The 64-bit words of an HMP ``x /Nxg ADDR`` dump, in address order."""
    words: list[int] = []
    for _, values in _WORDS.findall(text):
        words += [int(v, 16) for v in values.split()]
    return words


def gate_target(low: int, high: int) -> int:
    """The handler address of a 64-bit IDT gate given as its two words."""
    return (low & 0xFFFF) | ((low >> 48) & 0xFFFF) << 16 | (high & 0xFFFFFFFF) << 32


@dataclasses.dataclass(frozen=True)
class Symbols:
    """The System.map the running kernel matches, and its KASLR shift."""

    map: SymbolMap
    offset: int

    def name(self, address: int) -> str | None:
        return self.map.name(address, self.offset)


def match_symbols(symbol_map: SymbolMap, anchor_address: int) -> tuple[Symbols | None, str]:
    """The kernel's symbols shifted to where the running kernel's IDT says
    ``IDT_ANCHOR`` is (by a whole KASLR shift, none for a PVH boot), and
    why; None when the IDT disagrees with them (another kernel runs)."""
    linked = symbol_map.address(IDT_ANCHOR)
    if linked is None:
        return None, f"{symbol_map.source} has no {IDT_ANCHOR}"
    offset = anchor_address - linked
    if offset % KASLR_ALIGN:
        return None, f"{symbol_map.source}: {IDT_ANCHOR} at {linked:#x}, the IDT points at {anchor_address:#x}"
    return Symbols(symbol_map, offset), f"the kallsyms of {symbol_map.source} (KASLR shift {offset:#x})"


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What was read of a stuck guest; ``problems`` what could not be."""

    samples: tuple[tuple[Vcpu, ...], ...]
    symbols: Symbols | None
    symbols_note: str
    stack: tuple[str, ...]  # the kernel text addresses on vCPU 0's stack, named
    apic: str
    l1: str
    raw_registers: str
    problems: tuple[str, ...]

    def where(self, vcpu: Vcpu) -> str:
        named = self.symbols.name(vcpu.rip) if self.symbols else None
        return named or f"{vcpu.rip:#x}" + (" (user)" if vcpu.cpl == 3 else "")

    def summary(self) -> str:
        """One line: each vCPU's state at the last sample, how many places
        the samples found it, and the APIC's interrupts in service and pending."""
        if not self.samples:
            return "no vCPU state: " + "; ".join(self.problems)
        parts = []
        for vcpu in self.samples[-1]:
            seen = {s[vcpu.index].rip for s in self.samples if len(s) > vcpu.index}
            state = "halted" if vcpu.halted else "running"
            parts.append(
                f"vCPU {vcpu.index} {state} at {self.where(vcpu)}, interrupts {'on' if vcpu.interrupts_on else 'off'}, "
                f"{len(seen)} address(es) in {len(self.samples)} samples"
            )
        # QEMU's tabs and padding, made one line's words
        pending = [" ".join(line.split()) for line in self.apic.splitlines() if line.startswith(("ISR", "IRR"))]
        return "; ".join(parts + pending)

    def text(self) -> str:
        """The whole evidence, for the test's log directory."""
        out = [self.summary(), "", f"symbols: {self.symbols_note}"]
        for n, sample in enumerate(self.samples):
            out.append(
                f"sample {n}: " + ", ".join(f"vCPU {v.index} {self.where(v)} HLT={int(v.halted)}" for v in sample)
            )
        out += ["", "kernel addresses on vCPU 0's stack (newest first):", *(f"  {s}" for s in self.stack)]
        out += [
            "",
            "local APIC:",
            self.apic,
            "",
            "L1, the guest QEMU's threads:",
            self.l1 or "(not a host under test)",
        ]
        out += ["", "registers at the last sample:", self.raw_registers]
        out += ["", "could not read:", *self.problems] if self.problems else []
        return "\n".join(out) + "\n"


def collect(
    hmp: Callable[[str], str],
    symbol_map: Callable[[], SymbolMap] | None,
    l1_threads: Callable[[], str] | None = None,
    samples: int = SAMPLES,
    gap_s: float = SAMPLE_GAP_S,
) -> Evidence:
    """Read a stuck guest through ``hmp`` (its QEMU's human monitor);
    ``symbol_map`` reads its kernel's symbols (images/symbols.py); ``l1_threads`` the
    output of ``L1_QEMU_THREADS`` in its host under test.  Never raises a
    memqual error: what could not be read is in ``problems``."""
    problems: list[str] = []
    taken: list[tuple[Vcpu, ...]] = []
    raw = ""
    pause = threading.Event()
    for n in range(samples):
        if n:
            pause.wait(gap_s)
        try:
            raw = hmp("info registers -a")
        except MemqualError as exc:
            problems.append(f"info registers: {exc}")
            break
        vcpus = tuple(parse_registers(raw))
        if vcpus:
            taken.append(vcpus)
    symbols, note = None, "no vCPU state to match a System.map with"
    stack: list[str] = []
    apic = ""
    if taken:
        first = taken[-1][0]
        symbols, note = _symbols(hmp, first, symbol_map, problems)
        stack = _stack(hmp, first, symbols, problems)
        try:
            apic = hmp("info lapic")
        except MemqualError as exc:
            problems.append(f"info lapic: {exc}")
    l1 = ""
    if l1_threads is not None:
        try:
            l1 = l1_threads()
        except MemqualError as exc:
            problems.append(f"L1's threads: {exc}")
    return Evidence(tuple(taken), symbols, note, tuple(stack), apic, l1, raw, tuple(problems))


def _symbols(
    hmp: Callable[[str], str], vcpu: Vcpu, symbol_map: Callable[[], SymbolMap] | None, problems: list[str]
) -> tuple[Symbols | None, str]:
    if symbol_map is None:
        return None, "no kernel to read symbols from"
    if vcpu.idt_base is None:
        return None, "no IDT base in the registers"
    try:
        gate = parse_words(hmp(f"x /2xg {vcpu.idt_base:#x}"))
    except MemqualError as exc:
        problems.append(f"the IDT: {exc}")
        return None, "the IDT was unreadable"
    if len(gate) < 2:
        return None, "the IDT was unreadable"
    try:
        loaded = symbol_map()
    except (MemqualError, OSError) as exc:
        problems.append(f"the kernel's symbols: {exc}")
        return None, "the kernel's symbols were unreadable"
    return match_symbols(loaded, gate_target(gate[0], gate[1]))


def _stack(hmp: Callable[[str], str], vcpu: Vcpu, symbols: Symbols | None, problems: list[str]) -> list[str]:
    if symbols is None or vcpu.cpl != 0:
        return []
    try:
        words = parse_words(hmp(f"x /{STACK_WORDS}xg {vcpu.rsp:#x}"))
    except MemqualError as exc:
        problems.append(f"the stack: {exc}")
        return []
    named = []
    for at, word in enumerate(words):
        name = symbols.name(word)
        if name is not None:
            named.append(f"rsp+{8 * at:#x}: {name}")
    return named

"""host/core/stuck.py: a stuck guest read from outside, on the monitor's
real output (tests/data/stuck/, captured from a 6.1 guest here) and a
fake monitor; e2e/test_host_under_test.py reads a real guest in L1."""

from __future__ import annotations

from pathlib import Path

import pytest

from memqual.host.core import stuck
from memqual.host.core.errors import GuestError
from memqual.images.symbols import SymbolMap

DATA = Path(__file__).resolve().parent.parent / "data" / "stuck"
REGISTERS = (DATA / "info-registers-a.txt").read_text()
LAPIC = (DATA / "info-lapic.txt").read_text()
# The IDT's first gate as `x /2xg` printed it for that guest: its handler
# is asm_exc_divide_error at 0xffffffff81c00990.
GATE = "fffffe0000000000: 0x81c08e0000100990 0x00000000ffffffff\n"
DIVIDE = 0xFFFFFFFF81C00990
HALT = 0xFFFFFFFF81A592E0  # native_safe_halt in that kernel (its RIP: +0xb)


def kernel_symbols(shift: int = 0) -> SymbolMap:
    return SymbolMap.of(
        "test kernel",
        [
            (HALT - shift, ord("T"), "native_safe_halt"),
            (HALT - shift + 0x20, ord("t"), "amd_e400_idle"),
            (HALT - shift + 0x100, ord("T"), "default_idle_call"),
            (DIVIDE - shift, ord("T"), "asm_exc_divide_error"),
            (DIVIDE - shift + 0x40, ord("D"), "some_data"),
            (DIVIDE - shift + 0x80, ord("T"), "the_end"),
        ],
    )


def test_the_registers_of_every_vcpu_are_read() -> None:
    vcpus = stuck.parse_registers(REGISTERS)
    assert [v.index for v in vcpus] == [0, 1]
    first = vcpus[0]
    assert (first.rip, first.rsp, first.halted, first.cpl) == (0xFFFFFFFF81A592EB, 0xFFFFFFFF82A03E98, True, 0)
    assert first.interrupts_on and first.idt_base == 0xFFFFFE0000000000
    one = REGISTERS.split("\n\n")[0].replace("CPU#0\n", "")
    assert [v.index for v in stuck.parse_registers(one)] == [0], "a one-vCPU guest prints no CPU# line"


def test_a_gate_s_handler_and_a_memory_dump() -> None:
    words = stuck.parse_words(GATE)
    assert stuck.gate_target(*words) == DIVIDE
    dump = "ffffc90000097ed8: 0x0000000000000001 0xffffffff81a592eb\nffffc90000097ee8: 0x0000000000000000\n"
    assert stuck.parse_words(dump) == [1, 0xFFFFFFFF81A592EB, 0]


@pytest.mark.parametrize("shift", [0, 0x3E00000])
def test_the_kernel_s_symbols_match_the_idt_by_a_whole_kaslr_shift(shift: int) -> None:
    found, why = stuck.match_symbols(kernel_symbols(shift), DIVIDE)
    assert found is not None and found.offset == shift, why
    assert found.name(0xFFFFFFFF81A592EB) == "native_safe_halt+0xb"


def test_symbols_of_another_kernel_are_refused() -> None:
    found, why = stuck.match_symbols(kernel_symbols(0x123), DIVIDE)
    assert found is None and "the IDT points at" in why


class Monitor:
    """A guest's human monitor: each ``info registers -a`` the next of
    ``rips`` for vCPU 0; the IDT, the stack and the APIC as captured."""

    def __init__(self, rips: list[int], halted: bool = True, stack: str = "", fails: str = "") -> None:
        self.rips = list(rips)
        self.halted = halted
        self.stack = stack
        self.fails = fails
        self.asked: list[str] = []

    def __call__(self, command: str) -> str:
        self.asked.append(command)
        if self.fails and command.startswith(self.fails):
            raise GuestError(f"QMP human-monitor-command failed: {command}")
        if command == "info registers -a":
            rip = self.rips.pop(0) if len(self.rips) > 1 else self.rips[0]
            text = REGISTERS.replace("RIP=ffffffff81a592eb", f"RIP={rip:016x}", 1)
            return text if self.halted else text.replace("HLT=1", "HLT=0")
        if command.startswith("x /2xg "):
            return GATE
        if command.startswith("x /"):
            return self.stack
        return LAPIC


def test_a_halted_guest_reads_as_halted_at_one_named_place() -> None:
    stack = "ffffffff82a03e98: 0xffffffff81a5930d 0x0000000000000000\nffffffff82a03ea8: 0xffffffff81a593e8\n"
    monitor = Monitor([0xFFFFFFFF81A592EB], stack=stack)
    evidence = stuck.collect(monitor, kernel_symbols, None, samples=3, gap_s=0)
    assert evidence.summary().startswith("vCPU 0 halted at native_safe_halt+0xb, interrupts on, 1 address(es) in 3")
    assert evidence.summary().endswith("ISR (none); IRR (none)")
    assert evidence.stack == ("rsp+0x0: amd_e400_idle+0xd", "rsp+0x10: default_idle_call+0x8")
    text = evidence.text()
    assert "(not a host under test)" in text and "the kallsyms of test kernel (KASLR shift 0x0)" in text
    assert monitor.asked.count("info registers -a") == 3


def test_a_spinning_guest_shows_its_loop_and_an_unknown_kernel_its_addresses() -> None:
    loop = [HALT + 0x100 + n for n in (4, 9, 4, 12)]
    evidence = stuck.collect(Monitor(loop, halted=False), None, lambda: "thread 7 of qemu-system-x86 5: state R", 4, 0)
    assert evidence.summary().startswith(f"vCPU 0 running at {loop[-1]:#x}, interrupts on, 3 address(es) in 4")
    assert "no kernel to read symbols from" in evidence.text()
    assert "thread 7 of qemu-system-x86 5: state R" in evidence.text()


def test_what_cannot_be_read_is_said_and_nothing_raises() -> None:
    assert stuck.collect(Monitor([HALT], fails="info registers"), kernel_symbols, None, 2, 0).summary() == (
        "no vCPU state: info registers: QMP human-monitor-command failed: info registers -a"
    )

    def unreadable() -> SymbolMap:
        raise GuestError("no kallsyms")

    def l1_gone() -> str:
        raise GuestError("L1 does not answer")

    evidence = stuck.collect(Monitor([HALT + 0xB], fails="info lapic"), unreadable, l1_gone, 1, 0)
    assert evidence.symbols is None and evidence.summary().startswith(f"vCPU 0 halted at {HALT + 0xB:#x}")
    assert [p.split(":")[0] for p in evidence.problems] == ["the kernel's symbols", "info lapic", "L1's threads"]

"""The guest side of a QEMU memslot layout: memory blocks, onlining, and
the proof that every slot holds data (guest/mem_probe.c does the guest
half): blocks onlined into ZONE_MOVABLE, a pattern derived from each
page's frame written and read back in the guest, sample frames per slot
read by the host through QMP ``pmemsave``.  The frames touched are the
trace host/memslots/trace.py replays.  docs/memslots-qemu.md."""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.paths import release_tempdir, short_tempdir
from memqual.host.core.polling import poll
from memqual.host.memslots.layout import PAGE_SIZE
from memqual.host.memslots.qemu_layout import (
    Dimm,
    MemoryBlock,
    Observed,
    QemuPlan,
    blocks_in,
    hotplug,
    parse_blocks,
    parse_iomem,
    read_qemu,
)

AGENT = "mem_probe"


def _fields(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split()[1:] if "=" in word)


def read_blocks(vm: Any, agent: str) -> list[MemoryBlock]:
    return parse_blocks(vm.ssh.run([agent, "blocks"], timeout=30).stdout)


def wait_blocks(vm: Any, agent: str, dimms: Sequence[Dimm], timeout: float = 30.0) -> list[MemoryBlock]:
    """Wait until the guest has memory blocks covering every dimm (ACPI
    hotplug is asynchronous in the guest); the blocks, or Timeout."""
    missing: list[Dimm] = list(dimms)

    def covered() -> list[MemoryBlock] | None:
        blocks = read_blocks(vm, agent)
        missing[:] = [d for d in dimms if sum(b.size for b in blocks_in(blocks, d.addr, d.addr + d.size)) != d.size]
        return None if missing else blocks

    def not_covered() -> Timeout:
        return Timeout(
            f"the guest has no memory blocks for {', '.join(d.slot.describe() for d in missing)} "
            f"after {timeout:.0f} s of hotplug"
        )

    # 100 ms: the poll period of a sysfs listing, not a wait for an event
    return poll(covered, timeout, 0.1, what="memory blocks", on_timeout=lambda _: not_covered()).value


def online(vm: Any, agent: str, dimms: Sequence[Dimm]) -> list[str]:
    """Online every block of ``dimms`` into ZONE_MOVABLE; the agent's lines."""
    lines: list[str] = []
    for dimm in dimms:
        out = vm.ssh.run([agent, "online", hex(dimm.addr), hex(dimm.size)], timeout=60).stdout
        lines += [line for line in out.splitlines() if line.startswith("onlined ")]
    return lines


def observe(vm: Any, agent: str | None) -> Observed:
    """Read back QEMU's flat view and dimms, the guest's /proc/iomem and
    (with the agent) its memory blocks."""
    flat, dimms = read_qemu(vm)
    iomem = parse_iomem(vm.ssh.run(["cat", "/proc/iomem"], timeout=30).stdout)
    blocks = tuple(read_blocks(vm, agent)) if agent else None
    return Observed(tuple(flat), tuple(dimms), tuple(iomem), blocks)


def apply_hotplug(vm: Any, plan: QemuPlan, agent: str, timeout: float = 30.0) -> list[str]:
    """Hotplug the plan's hotplug dimms, wait for the guest to add them and
    online every dimm (boot-time ones too: nothing onlines them by itself)."""
    hotplug(vm, plan.hotplug_dimms)
    wait_blocks(vm, agent, plan.dimms, timeout)
    return online(vm, agent, plan.dimms)


# --- the pattern probe ---------------------------------------------------------


def expected_page(frame: int, seed: int) -> bytes:
    """The agent's pattern for one frame: word i = ((frame << 12) | i*8) ^ seed."""
    base = frame << 12
    return struct.pack("<512Q", *(((base | (i * 8)) ^ seed) & 0xFFFFFFFFFFFFFFFF for i in range(512)))


@dataclasses.dataclass
class RangeResult:
    """What the probe found in one slot's guest-physical range."""

    slot: int
    start: int
    size: int
    pages: int = 0  # agent pages whose frame fell in the range
    verified: int = 0  # ... whose pattern read back and whose frame stayed
    bad_words: int = 0
    samples: list[int] = dataclasses.field(default_factory=list)  # frames offered for the host check
    host_verified: int = 0  # sample frames whose page QEMU holds with the pattern

    @property
    def npages(self) -> int:
        return self.size // PAGE_SIZE

    @property
    def coverage(self) -> float:
        return self.verified / self.npages


@dataclasses.dataclass
class ProbeResult:
    ranges: list[RangeResult]
    frames: list[int]  # first-touch order: the trace
    summary: dict[str, int]
    seed: int
    duration_s: float = 0.0

    def by_slot(self) -> dict[int, RangeResult]:
        return {r.slot: r for r in self.ranges}


def parse_probe(lines: Sequence[str], ranges: Sequence[RangeResult], seed: int) -> ProbeResult:
    """The agent's probe output, folded into ``ranges`` (matched by start)."""
    by_start = {r.start: r for r in ranges}
    frames: list[int] = []
    summary: dict[str, int] = {}
    for line in lines:
        if line.startswith("frames "):
            frames.extend(int(word, 16) for word in line.split()[1:])
        elif line.startswith("range "):
            f = _fields(line)
            target = by_start.get(int(f["start"], 16))
            if target is not None:
                target.pages, target.verified = int(f["pages"]), int(f["verified"])
                target.bad_words = int(f["bad_words"])
        elif line.startswith("sample "):
            f = _fields(line)
            target = by_start.get(int(f["range"], 16))
            if target is not None:
                target.samples.append(int(f["frame"], 16))
        elif line.startswith("summary "):
            summary = {k: int(v, 0) for k, v in _fields(line).items()}
        elif line.startswith(("error ", "timeout")):
            raise GuestError(f"{AGENT} failed: {line}")
    if not summary:
        raise GuestError(f"{AGENT} ended without a summary line: {list(lines)[-3:]}")
    return ProbeResult(list(ranges), frames, summary, seed)


def run_probe(
    vm: Any, agent: str, plan: QemuPlan, mib: int, seed: int | None = None, timeout: float = 180.0
) -> ProbeResult:
    """Run the pattern probe over every slot of ``plan`` (base and dimm) and
    check the sample frames through QEMU while the agent holds them."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    ranges = [
        RangeResult(s.id, s.base_gfn * PAGE_SIZE, s.npages * PAGE_SIZE)
        for s in sorted(plan.layout.slots, key=lambda s: s.base_gfn)
    ]
    argv = [agent, "probe", str(mib), hex(seed)] + [f"{r.start:#x}:{r.size:#x}" for r in ranges]
    started = time.monotonic()
    command = vm.ssh.start(argv)
    lines: list[str] = []
    try:
        for line in command.lines(timeout):
            lines.append(line)
            if line == "holding":
                break
        result = parse_probe(lines, ranges, seed)
        host_check(vm, result)
    finally:
        command.kill()  # closes the agent's stdin: it frees its memory and exits
    result.duration_s = time.monotonic() - started
    return result


def host_check(vm: Any, result: ProbeResult) -> None:
    """Read every sample frame through QEMU (pmemsave of one page) and count
    those that hold the agent's pattern."""
    directory = short_tempdir("mqpm")
    try:
        for range_ in result.ranges:
            for frame in range_.samples:
                path = Path(directory) / f"{frame:x}.bin"
                vm.qmp("pmemsave", val=frame * PAGE_SIZE, size=PAGE_SIZE, filename=str(path))
                if path.read_bytes() == expected_page(frame, result.seed):
                    range_.host_verified += 1
                path.unlink()
    finally:
        release_tempdir(directory)

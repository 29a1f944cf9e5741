"""A memslot layout applied to a real QEMU guest, and read back.

``plan_layout`` maps a layout file onto QEMU's pc machine (base slots
checked against what QEMU builds, the rest pc-dimms on the command line or
hotplugged over QMP) and refuses before QEMU starts what QEMU or the guest
would refuse; the read-back parsers and ``differential_check`` compare the
layout with QEMU's flat view, its memory devices and the guest's view.
docs/memslots-qemu.md says how and why.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from memqual.host.core.errors import BadInput, GuestError
from memqual.host.core.flatview import SLOT_KINDS, FlatRange, parse_flatview
from memqual.host.core.qemu import MachineConfig
from memqual.host.memslots.layout import KVM_MEM_READONLY, PAGE_SIZE, Layout, Slot, validate

MIB = 1 << 20
GIB = 1 << 30
FOUR_GIB = 4 * GIB
# The guest kernel adds and onlines hotplugged memory in memory blocks of
# 128 MiB (x86_64 below 64 GiB of RAM): a dimm not made of whole blocks is
# refused by the guest's ACPI memory hotplug even though QEMU plugs it.
GUEST_BLOCK = 128 * MIB
BACKEND_PREFIX = "mq-mem-"
DIMM_PREFIX = "mq-dimm-"


MACHINES = ("pc", "q35")


@dataclasses.dataclass(frozen=True)
class QemuMemory:
    """The ``-m`` settings of a pc or q35 guest: ``-m RAM,slots=SLOTS,maxmem=MAXMEM``."""

    ram_mib: int = 512
    maxmem_mib: int = 4096
    slots: int = 4
    machine: str = "pc"

    def __post_init__(self) -> None:
        if self.machine not in MACHINES:
            raise BadInput(f"machine {self.machine!r}: memslot layouts need one with dimms: {', '.join(MACHINES)}")
        if self.ram_mib < 128:
            raise BadInput(f"guest RAM {self.ram_mib} MiB is too small: give at least 128 MiB")
        if self.slots < 1:
            raise BadInput(f"{self.slots} dimm slots: give at least 1 (-m ...,slots=N)")
        if self.maxmem_mib < self.ram_mib:
            raise BadInput(f"maxmem {self.maxmem_mib} MiB is below the RAM {self.ram_mib} MiB: raise maxmem")

    def below_4g(self) -> int:
        """Bytes of RAM QEMU maps below 4 GiB (QEMU 7.2).  pc: all of it
        below 3.5 GiB, else 3 GiB (gigabyte-aligned split, pc-i440fx >=
        1.7).  q35: all of it below 2.75 GiB, else 2 GiB (the rest of the
        low 4 GiB holds the PCIe MMCONFIG window and PCI holes)."""
        ram = self.ram_mib * MIB
        if self.machine == "q35":
            return ram if ram < 0xB0000000 else 0x80000000
        return ram if ram < 0xE0000000 else 0xC0000000

    def device_memory(self) -> tuple[int, int]:
        """(start, size) in bytes of the region pc-dimms may occupy."""
        above = self.ram_mib * MIB - self.below_4g()
        start = -(-(FOUR_GIB + above) // GIB) * GIB
        size = (self.maxmem_mib - self.ram_mib) * MIB + self.slots * GIB
        return start, size


@dataclasses.dataclass(frozen=True)
class Dimm:
    """One layout slot as a pc-dimm."""

    slot: Slot
    hotplug: bool  # added over QMP after boot, else on the command line

    @property
    def addr(self) -> int:
        return self.slot.base_gfn * PAGE_SIZE

    @property
    def size(self) -> int:
        return self.slot.npages * PAGE_SIZE

    @property
    def backend_id(self) -> str:
        return f"{BACKEND_PREFIX}{self.slot.id}"

    @property
    def device_id(self) -> str:
        return f"{DIMM_PREFIX}{self.slot.id}"

    def object_args(self) -> dict[str, Any]:
        """Arguments of QMP object-add."""
        return {"qom-type": "memory-backend-ram", "id": self.backend_id, "size": self.size}

    def device_args(self) -> dict[str, Any]:
        """Arguments of QMP device_add."""
        return {"driver": "pc-dimm", "id": self.device_id, "memdev": self.backend_id, "addr": self.addr}

    def command_line(self) -> list[str]:
        return [
            "-object",
            f"memory-backend-ram,id={self.backend_id},size={self.size}",
            "-device",
            f"pc-dimm,id={self.device_id},memdev={self.backend_id},addr={self.addr:#x}",
        ]


@dataclasses.dataclass(frozen=True)
class QemuPlan:
    """A layout as QEMU memory: base slots to check, dimms to create."""

    layout: Layout
    memory: QemuMemory
    base: tuple[Slot, ...]
    dimms: tuple[Dimm, ...]

    @property
    def boot_dimms(self) -> tuple[Dimm, ...]:
        return tuple(d for d in self.dimms if not d.hotplug)

    @property
    def hotplug_dimms(self) -> tuple[Dimm, ...]:
        return tuple(d for d in self.dimms if d.hotplug)

    def boot_args(self) -> tuple[str, ...]:
        """QEMU arguments of the boot-time dimms (MachineConfig.extra_args)."""
        return tuple(arg for dimm in self.boot_dimms for arg in dimm.command_line())

    def hotplug_commands(self) -> list[tuple[str, dict[str, Any]]]:
        """The QMP commands that add the hotplugged dimms, in order."""
        commands: list[tuple[str, dict[str, Any]]] = []
        for dimm in self.hotplug_dimms:
            commands.append(("object-add", dimm.object_args()))
            commands.append(("device_add", dimm.device_args()))
        return commands

    def machine_config(self, cpus: int = 1, **overrides: Any) -> Any:
        """A MachineConfig for this plan (its machine, no balloon by default)."""
        fields: dict[str, Any] = dict(
            machine=self.memory.machine,
            memory_mib=self.memory.ram_mib,
            cpus=cpus,
            maxmem_mib=self.memory.maxmem_mib,
            mem_slots=self.memory.slots,
            balloon=None,
            extra_args=self.boot_args(),
        )
        fields.update(overrides)
        return MachineConfig(**fields)

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout.name,
            "memory": dataclasses.asdict(self.memory),
            "device_memory": dict(zip(("start", "size"), self.memory.device_memory(), strict=True)),
            "base_slots": [s.to_json() for s in self.base],
            "dimms": [
                {
                    "slot": d.slot.id,
                    "addr": d.addr,
                    "size": d.size,
                    "hotplug": d.hotplug,
                    "backend": d.backend_id,
                    "device": d.device_id,
                }
                for d in self.dimms
            ],
        }


def plan_layout(layout: Layout, memory: QemuMemory, hotplug: int = 0, check: bool = True) -> QemuPlan:
    """Split ``layout`` into base slots and pc-dimms; the last ``hotplug``
    dimms (registration order) are for QMP hotplug.

    With ``check`` (the default) everything QEMU or the guest would refuse
    is refused here with a BadInput naming the slot; ``check=False`` keeps
    only the split, so that a test can hand QEMU a layout it must refuse.
    """
    where = f"layout {layout.name!r}" if layout.name else "layout"
    region_start, region_size = memory.device_memory()
    region_end = region_start + region_size
    base: list[Slot] = []
    dimm_slots: list[Slot] = []
    for slot in layout.slots:
        start, end = slot.base_gfn * PAGE_SIZE, slot.end_gfn * PAGE_SIZE
        if end <= region_start:
            base.append(slot)
        elif start >= region_start:
            dimm_slots.append(slot)
        else:
            raise BadInput(
                f"{where}: {slot.describe()} straddles the start of the dimm region at {region_start:#x} "
                f"(gfn {region_start // PAGE_SIZE:#x}): end it below or start it at or above that address"
            )
    if hotplug < 0 or hotplug > len(dimm_slots):
        raise BadInput(f"{where}: cannot hotplug {hotplug} dimms, the layout has {len(dimm_slots)} dimm slots")
    first_hotplugged = len(dimm_slots) - hotplug
    dimms = tuple(Dimm(slot, hotplug=i >= first_hotplugged) for i, slot in enumerate(dimm_slots))
    if check:
        validate(layout)  # overlaps and duplicate ids, named as the model names them
        _check_dimms(where, dimms, memory, region_start, region_end)
    return QemuPlan(layout=layout, memory=memory, base=tuple(base), dimms=dimms)


def _check_dimms(where: str, dimms: Sequence[Dimm], memory: QemuMemory, region_start: int, region_end: int) -> None:
    if len(dimms) > memory.slots:
        raise BadInput(
            f"{where}: {len(dimms)} dimm slots but QEMU has {memory.slots} (slots={memory.slots}): "
            f"raise --slots or drop slot {dimms[memory.slots].slot.id} and after"
        )
    for dimm in dimms:
        slot = dimm.slot
        if slot.flags:
            raise BadInput(
                f"{where}: {slot.describe()} has flags {slot.flags}: a pc-dimm is plain read-write RAM, give flags 0"
            )
        if dimm.addr % GUEST_BLOCK or dimm.size % GUEST_BLOCK:
            raise BadInput(
                f"{where}: {slot.describe()} is not made of whole 128 MiB blocks (base_gfn and npages multiples "
                f"of {GUEST_BLOCK // PAGE_SIZE}): the guest onlines hotplugged memory in 128 MiB blocks"
            )
        if dimm.addr + dimm.size > region_end:
            raise BadInput(
                f"{where}: {slot.describe()} ends at {dimm.addr + dimm.size:#x}, beyond the dimm region "
                f"{region_start:#x}-{region_end - 1:#x} that maxmem {memory.maxmem_mib} MiB and "
                f"slots={memory.slots} give: raise --maxmem or move the slot down"
            )
    total = sum(d.size for d in dimms)
    room = (memory.maxmem_mib - memory.ram_mib) * MIB
    if total > room:
        raise BadInput(
            f"{where}: the dimm slots add up to {total // MIB} MiB, above maxmem - ram = {room // MIB} MiB: "
            f"raise --maxmem to at least {memory.ram_mib + total // MIB} MiB or shrink the slots"
        )


# --- applying ----------------------------------------------------------------


def hotplug(vm: Any, dimms: Iterable[Dimm]) -> list[Dimm]:
    """Add ``dimms`` to the running guest over QMP, in order.  When QEMU
    refuses one, its backend is removed again and a BadInput names the slot
    and quotes QEMU; the dimms added before it stay (returned on success)."""
    added: list[Dimm] = []
    for dimm in dimms:
        try:
            vm.qmp("object-add", **dimm.object_args())
        except GuestError as exc:
            raise BadInput(f"QEMU refused the backend of {dimm.slot.describe()}: {_qemu_reason(exc)}") from exc
        try:
            vm.qmp("device_add", **dimm.device_args())
        except GuestError as exc:
            try:
                vm.qmp("object-del", id=dimm.backend_id)
            except GuestError:
                pass  # the refusal below is what the user needs to read
            raise BadInput(
                f"QEMU refused {dimm.slot.describe()} as a pc-dimm at {dimm.addr:#x} "
                f"({dimm.size // MIB} MiB): {_qemu_reason(exc)}"
            ) from exc
        added.append(dimm)
    return added


def _qemu_reason(exc: Exception) -> str:
    text = str(exc)
    return text.split("failed: ", 1)[1] if "failed: " in text else text


# --- read-back: QEMU -----------------------------------------------------------


def layout_from_flatview(ranges: Sequence[FlatRange], name: str = "qemu") -> Layout:
    """The memslots QEMU registers for this flat view: each RAM or ROM range
    one slot (ROM read-only), ids in address order.  Ranges not page
    aligned are rounded out to whole pages (none are on pc)."""
    slots: list[Slot] = []
    for range_ in sorted((r for r in ranges if r.kind in SLOT_KINDS), key=lambda r: r.start):
        first = range_.start // PAGE_SIZE
        last = range_.end // PAGE_SIZE
        flags = KVM_MEM_READONLY if range_.kind != "ram" else 0
        slots.append(Slot(id=len(slots), base_gfn=first, npages=last - first + 1, flags=flags))
    return Layout(tuple(slots), name=name)


_DEVICE_MEMORY = re.compile(r"^\s*([0-9a-fA-F]+)-([0-9a-fA-F]+) \(prio -?\d+, [a-z/ ]+\): device-memory\s*$", re.M)


def parse_device_memory(mtree_text: str) -> tuple[int, int] | None:
    """(start, size) of the ``device-memory`` container in ``info mtree``."""
    match = _DEVICE_MEMORY.search(mtree_text)
    if match is None:
        return None
    start, end = int(match.group(1), 16), int(match.group(2), 16)
    return start, end - start + 1


@dataclasses.dataclass(frozen=True)
class PluggedDimm:
    """One entry of query-memory-devices."""

    id: str
    addr: int
    size: int
    slot: int
    memdev: str
    hotplugged: bool


def parse_memory_devices(reply: Any) -> list[PluggedDimm]:
    """The dimms in a ``query-memory-devices`` reply (other types skipped)."""
    if not isinstance(reply, list):
        raise BadInput(f"query-memory-devices replied {reply!r}, not a list")
    dimms = []
    for entry in reply:
        if not isinstance(entry, dict) or entry.get("type") != "dimm":
            continue
        data = entry.get("data", {})
        dimms.append(
            PluggedDimm(
                id=str(data.get("id", "")),
                addr=int(data["addr"]),
                size=int(data["size"]),
                slot=int(data.get("slot", -1)),
                memdev=str(data.get("memdev", "")),
                hotplugged=bool(data.get("hotplugged", False)),
            )
        )
    return dimms


# --- read-back: guest ----------------------------------------------------------

_IOMEM_LINE = re.compile(r"^( *)([0-9a-fA-F]+)-([0-9a-fA-F]+) : (.*)$")


@dataclasses.dataclass(frozen=True)
class IomemEntry:
    start: int
    end: int  # inclusive
    name: str
    depth: int  # nesting level (two spaces each)


def parse_iomem(text: str) -> list[IomemEntry]:
    """/proc/iomem as entries.  Read as root: for others the kernel prints
    zero addresses, which is refused here."""
    entries = []
    for line in text.splitlines():
        match = _IOMEM_LINE.match(line)
        if match:
            indent, start, end, name = match.groups()
            entries.append(IomemEntry(int(start, 16), int(end, 16), name.strip(), len(indent) // 2))
    if entries and all(e.start == 0 and e.end == 0 for e in entries):
        raise BadInput("/proc/iomem shows only zero addresses: read it as root")
    return entries


def system_ram(entries: Iterable[IomemEntry]) -> list[tuple[int, int]]:
    """Top-level "System RAM" ranges as (start, end exclusive), merged."""
    spans = sorted((e.start, e.end + 1) for e in entries if e.depth == 0 and e.name == "System RAM")
    return _merge(spans)


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covered(start: int, end: int, spans: Sequence[tuple[int, int]]) -> bool:
    return any(s <= start and end <= e for s, e in spans)


@dataclasses.dataclass(frozen=True)
class MemoryBlock:
    """One /sys/devices/system/memory/memoryN, as the guest agent prints it."""

    index: int
    start: int
    size: int
    state: str
    zones: str


def _fields(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split()[1:] if "=" in word)


def parse_blocks(text: str) -> list[MemoryBlock]:
    """The ``block`` lines of ``mem_probe blocks``, sorted by address.
    Output without its ``blocksize`` line or without blocks is a GuestError:
    an empty list would silently turn the memory-block check off."""
    if not text.startswith("blocksize ") or "\nblock " not in text:
        raise GuestError(f"mem_probe blocks printed no memory blocks: {text[:200]!r}")
    blocks = []
    for line in text.splitlines():
        if line.startswith("block "):
            f = _fields(line)
            blocks.append(MemoryBlock(int(f["index"]), int(f["start"], 16), int(f["size"], 16), f["state"], f["zones"]))
    return sorted(blocks, key=lambda b: b.start)


def blocks_in(blocks: Sequence[MemoryBlock], start: int, end: int) -> list[MemoryBlock]:
    return [b for b in blocks if start <= b.start and b.start + b.size <= end]


# --- the differential check ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Observed:
    """Everything read back from one running guest."""

    flatview: tuple[FlatRange, ...]
    dimms: tuple[PluggedDimm, ...]
    # None: not read (a QEMU-only check); an empty tuple is a guest that showed none
    iomem: tuple[IomemEntry, ...] | None
    blocks: tuple[MemoryBlock, ...] | None = None

    def qemu_layout(self) -> Layout:
        return layout_from_flatview(self.flatview, name="qemu-flatview")


@dataclasses.dataclass(frozen=True)
class Difference:
    """One way the layout and a real view disagree."""

    view: str  # "flatview", "memory-devices", "iomem", "blocks"
    slot: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.view}: {self.message}"


def differential_check(plan: QemuPlan, observed: Observed, require_online: bool = False) -> list[Difference]:
    """Every way the layout differs from what QEMU built and the guest sees
    (empty: they agree).

    - flat view: each layout slot (base or dimm) is exactly one RAM/ROM
      range of QEMU's flat view (same start, same size; a dimm's range is
      its own backend); no dimm-backed range is there that the layout lacks.
    - memory devices: the dimms QEMU reports are exactly the layout's, at
      the same addresses and sizes.
    - guest /proc/iomem (unless None: not read): each dimm is System RAM in
      the guest; the guest has no System RAM outside QEMU's RAM ranges.
    - guest memory blocks (unless None): each dimm consists of memory blocks,
      all online when ``require_online``.
    """
    return [
        *flatview_differences(plan, observed.flatview),
        *device_differences(plan, observed.dimms),
        *([] if observed.iomem is None else iomem_differences(plan, observed.iomem, observed.flatview)),
        *([] if observed.blocks is None else block_differences(plan, observed.blocks, require_online)),
    ]


def flatview_differences(plan: QemuPlan, flatview: Sequence[FlatRange]) -> list[Difference]:
    """Each base slot and dimm against QEMU's flat view, and the dimm
    backends there that the layout lacks."""
    diffs: list[Difference] = []
    by_start = {r.start: r for r in flatview if r.kind in SLOT_KINDS}
    for slot in plan.base:
        start, size = slot.base_gfn * PAGE_SIZE, slot.npages * PAGE_SIZE
        range_ = by_start.get(start)
        if range_ is None or range_.size != size:
            found = f"{range_.size} bytes ({range_.kind}: {range_.name})" if range_ else "no RAM/ROM range there"
            diffs.append(Difference("flatview", slot.id, f"base {slot.describe()}: QEMU has {found}"))
        elif bool(slot.flags & KVM_MEM_READONLY) != (range_.kind != "ram"):
            diffs.append(Difference("flatview", slot.id, f"base {slot.describe()}: QEMU maps it as {range_.kind}"))
    wanted_backends = {d.backend_id for d in plan.dimms}
    for dimm in plan.dimms:
        range_ = by_start.get(dimm.addr)
        if range_ is None or range_.size != dimm.size or range_.name != dimm.backend_id or range_.kind != "ram":
            found = f"{range_.kind} {range_.name}, {range_.size} bytes" if range_ else "nothing"
            diffs.append(
                Difference("flatview", dimm.slot.id, f"dimm {dimm.slot.describe()}: QEMU has {found} at {dimm.addr:#x}")
            )
    for range_ in flatview:
        if range_.name.startswith(BACKEND_PREFIX) and range_.name not in wanted_backends:
            diffs.append(Difference("flatview", None, f"{range_.name} at {range_.start:#x} is not in the layout"))
    return diffs


def device_differences(plan: QemuPlan, dimms: Sequence[PluggedDimm]) -> list[Difference]:
    """The layout's dimms against the memory devices QEMU reports."""
    diffs: list[Difference] = []
    plugged = {d.id: d for d in dimms}
    for dimm in plan.dimms:
        got = plugged.pop(dimm.device_id, None)
        if got is None:
            diffs.append(Difference("memory-devices", dimm.slot.id, f"no device {dimm.device_id}"))
        elif (got.addr, got.size) != (dimm.addr, dimm.size):
            diffs.append(
                Difference(
                    "memory-devices",
                    dimm.slot.id,
                    f"{dimm.device_id} at {got.addr:#x} size {got.size}, the layout says "
                    f"{dimm.addr:#x} size {dimm.size}",
                )
            )
    for extra in plugged.values():
        diffs.append(Difference("memory-devices", None, f"dimm {extra.id!r} at {extra.addr:#x} is not in the layout"))
    return diffs


def iomem_differences(plan: QemuPlan, iomem: Sequence[IomemEntry], flatview: Sequence[FlatRange]) -> list[Difference]:
    """Each dimm as System RAM in the guest's /proc/iomem, and no System
    RAM there outside QEMU's RAM ranges."""
    diffs: list[Difference] = []
    guest_ram = system_ram(iomem)
    qemu_ram = _merge((r.start, r.end + 1) for r in flatview if r.kind == "ram")
    for dimm in plan.dimms:
        if not _covered(dimm.addr, dimm.addr + dimm.size, guest_ram):
            diffs.append(Difference("iomem", dimm.slot.id, f"the guest has no System RAM at {dimm.slot.describe()}"))
    for start, end in guest_ram:
        if not _covered(start, end, qemu_ram):
            diffs.append(Difference("iomem", None, f"guest System RAM {start:#x}-{end - 1:#x} is not RAM in QEMU"))
    return diffs


def block_differences(plan: QemuPlan, blocks: Sequence[MemoryBlock], require_online: bool) -> list[Difference]:
    """Each dimm made of the guest's memory blocks, all online when
    ``require_online``."""
    diffs: list[Difference] = []
    for dimm in plan.dimms:
        inside = blocks_in(blocks, dimm.addr, dimm.addr + dimm.size)
        if sum(b.size for b in inside) != dimm.size:
            diffs.append(
                Difference(
                    "blocks", dimm.slot.id, f"{dimm.slot.describe()} has {len(inside)} memory blocks, not all of it"
                )
            )
        elif require_online:
            offline = [b.index for b in inside if b.state != "online"]
            if offline:
                diffs.append(Difference("blocks", dimm.slot.id, f"memory blocks {offline} are not online"))
    return diffs


def read_qemu(vm: Any) -> tuple[list[FlatRange], list[PluggedDimm]]:
    """QEMU's flat view and memory devices of a running machine."""
    return parse_flatview(vm.hmp("info mtree -f")), parse_memory_devices(vm.qmp("query-memory-devices"))

"""Layouts as QEMU memory, read-back parsers and the differential check,
on canned QEMU and guest output (taken from a real pc guest: QEMU 7.2,
-m 512M,slots=4,maxmem=4096M, one 128 MiB dimm at 4 GiB)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from fakes import RefusingQmp
from hypothesis import given, settings
from hypothesis import strategies as st

from memqual.host.core.errors import BadInput, GuestError
from memqual.host.memslots import qemu_layout as Q
from memqual.host.memslots.layout import LAYOUTS_DIR, Layout, Slot, load_layout

BLOCK = Q.GUEST_BLOCK // 4096  # pages in a guest memory block
GIB_GFN = (1 << 30) // 4096
MEMORY = Q.QemuMemory(ram_mib=512, maxmem_mib=4096, slots=4)

FLATVIEW = """\
FlatView #0
 AS "I/O", root: io
 Root memory region: io
  0000000000000000-0000000000000007 (prio 0, i/o): dma-chan
  00000000000003f8-00000000000003ff (prio 0, i/o): serial

FlatView #1
 AS "memory", root: system
 AS "cpu-memory-0", root: system
 AS "virtio-net-pci", root: bus master container
 Root memory region: system
  0000000000000000-00000000000c2fff (prio 0, ram): pc.ram
  00000000000c3000-00000000000e7fff (prio 0, rom): pc.ram @00000000000c3000
  00000000000e8000-00000000000effff (prio 0, ram): pc.ram @00000000000e8000
  00000000000f0000-00000000000fffff (prio 0, rom): pc.ram @00000000000f0000
  0000000000100000-000000001fffffff (prio 0, ram): pc.ram @0000000000100000
  00000000febf8000-00000000febf8fff (prio 0, i/o): virtio-pci-common-virtio-net
  00000000febff000-00000000febff03f (prio 0, i/o): msix-table
  00000000fec00000-00000000fec00fff (prio 0, i/o): ioapic
  00000000fee00000-00000000feefffff (prio 4096, i/o): apic-msi
  00000000fffc0000-00000000ffffffff (prio 0, rom): pc.bios
  0000000100000000-0000000107ffffff (prio 0, ram): mq-mem-1

FlatView #2
 AS "cpu-smm-0", root: memory
 Root memory region: memory
  0000000000000000-000000001fffffff (prio 0, ram): pc.ram
  0000000300000000-0000000307ffffff (prio 0, ram): mq-mem-9

FlatView #3
 AS "i440FX", root: bus master container
 Root memory region: (none)
  No rendered FlatView
"""

MTREE = """\
address-space: memory
  0000000000000000-ffffffffffffffff (prio 0, i/o): system
    0000000000000000-000000001fffffff (prio 0, ram): alias ram-below-4g @pc.ram 0000000000000000-000000001fffffff
    00000000fee00000-00000000feefffff (prio 4096, i/o): apic-msi
    0000000100000000-00000002dfffffff (prio 0, i/o): device-memory
      0000000100000000-0000000107ffffff (prio 0, ram): mq-mem-1
"""

MEMORY_DEVICES: list[dict[str, Any]] = [
    {
        "type": "dimm",
        "data": {
            "memdev": "/objects/mq-mem-1",
            "hotplugged": False,
            "addr": 4294967296,
            "hotpluggable": True,
            "size": 134217728,
            "slot": 0,
            "node": 0,
            "id": "mq-dimm-1",
        },
    },
    {"type": "virtio-mem", "data": {"id": "vm0", "memaddr": 0, "size": 0}},
]

IOMEM = """\
00000000-00000fff : Reserved
00001000-0009fbff : System RAM
0009fc00-000fffff : Reserved
  000a0000-000bffff : PCI Bus 0000:00
  000f0000-000fffff : System ROM
00100000-1ffdffff : System RAM
  01000000-01e01d31 : Kernel code
1ffe0000-1fffffff : Reserved
20000000-febfffff : PCI Bus 0000:00
  febf8000-febfbfff : 0000:00:02.0
    febf8000-febfbfff : virtio-pci-modern
fffc0000-ffffffff : Reserved
100000000-107ffffff : System RAM
300000000-37fffffff : PCI Bus 0000:00
"""

BLOCKS = """\
blocksize size=0x8000000
block index=32 start=0x100000000 size=0x8000000 state=online zones=Movable
block index=0 start=0x0 size=0x8000000 state=online zones=none
block index=3 start=0x18000000 size=0x8000000 state=online zones=DMA32
"""

ONE_DIMM = Layout((Slot(0, 0x100, 0x1FF00), Slot(1, 0x100000, BLOCK)), name="one-dimm")


def observed(**changes: Any) -> Q.Observed:
    base = Q.Observed(
        flatview=tuple(Q.parse_flatview(FLATVIEW)),
        dimms=tuple(Q.parse_memory_devices(MEMORY_DEVICES)),
        iomem=tuple(Q.parse_iomem(IOMEM)),
        blocks=tuple(Q.parse_blocks(BLOCKS)),
    )
    return dataclasses.replace(base, **changes)


# --- the mapping -----------------------------------------------------------------


def test_device_memory_region_matches_what_qemu_reported():
    assert MEMORY.device_memory() == Q.parse_device_memory(MTREE) == (0x100000000, 0x1E0000000)
    # 8 GiB of RAM: 3 GiB below 4 GiB, 5 GiB above, the region at 9 GiB.
    assert Q.QemuMemory(8192, 16384, 2).device_memory() == (9 << 30, (8 << 30) + (2 << 30))
    assert Q.parse_device_memory("no such line") is None


@pytest.mark.parametrize(
    "machine, ram_mib, below_mib, region_gib",
    [
        ("pc", 3072, 3072, 4),  # pc keeps up to 3.5 GiB below 4 GiB
        ("pc", 3584, 3072, 5),  # from 3.5 GiB: 3 GiB below, 0.5 above, region rounded up to 5 GiB
        ("q35", 2048, 2048, 4),
        ("q35", 2816, 2048, 5),  # q35 from 2.75 GiB: 2 GiB below, 0.75 above
        ("q35", 3072, 2048, 5),
    ],
)
def test_low_memory_split_per_machine(machine, ram_mib, below_mib, region_gib):
    memory = Q.QemuMemory(ram_mib, 8192, 2, machine)
    assert memory.below_4g() == below_mib << 20
    assert memory.device_memory()[0] == region_gib << 30
    plan = Q.plan_layout(Layout((), name="empty"), memory)
    assert plan.machine_config().machine == machine


def test_a_machine_without_dimms_is_bad_input():
    with pytest.raises(BadInput, match="microvm"):
        Q.QemuMemory(512, 4096, 4, "microvm")


def test_plan_splits_base_slots_from_dimms_and_hotplugs_the_last():
    plan = Q.plan_layout(load_layout(LAYOUTS_DIR / "qemu-pc-3dimm.json"), MEMORY, hotplug=2)
    assert [s.id for s in plan.base] == [0]
    assert [(d.slot.id, d.hotplug) for d in plan.dimms] == [(1, False), (2, True), (3, True)]
    assert plan.boot_args() == (
        "-object",
        "memory-backend-ram,id=mq-mem-1,size=134217728",
        "-device",
        "pc-dimm,id=mq-dimm-1,memdev=mq-mem-1,addr=0x100000000",
    )
    assert plan.hotplug_commands() == [
        ("object-add", {"qom-type": "memory-backend-ram", "id": "mq-mem-2", "size": 128 << 20}),
        ("device_add", {"driver": "pc-dimm", "id": "mq-dimm-2", "memdev": "mq-mem-2", "addr": 0x108000000}),
        ("object-add", {"qom-type": "memory-backend-ram", "id": "mq-mem-3", "size": 128 << 20}),
        ("device_add", {"driver": "pc-dimm", "id": "mq-dimm-3", "memdev": "mq-mem-3", "addr": 0x120000000}),
    ]
    config = plan.machine_config(warm=False)
    assert (config.machine, config.memory_mib, config.maxmem_mib, config.mem_slots) == ("pc", 512, 4096, 4)
    assert config.extra_args == plan.boot_args() and config.balloon is None and not config.warm


@pytest.mark.parametrize(
    "slots, memory, hotplug, words",
    [
        ((Slot(1, GIB_GFN * 4 - 16, 32),), MEMORY, 0, ["slot 1", "straddles", "0x100000000"]),
        (
            tuple(Slot(i, GIB_GFN * 4 + i * BLOCK, BLOCK) for i in range(5)),
            MEMORY,
            0,
            ["5 dimm slots", "slots=4", "slot 4 and after"],
        ),
        ((Slot(1, GIB_GFN * 4, BLOCK, flags=2),), MEMORY, 0, ["slot 1", "flags 2"]),
        ((Slot(1, GIB_GFN * 4 + 16, BLOCK),), MEMORY, 0, ["slot 1", "128 MiB blocks"]),
        ((Slot(1, GIB_GFN * 4, BLOCK + 1),), MEMORY, 0, ["slot 1", "128 MiB blocks"]),
        ((Slot(7, GIB_GFN * 12, BLOCK),), MEMORY, 0, ["slot 7", "beyond the dimm region", "--maxmem"]),
        ((Slot(1, GIB_GFN * 4, 4 * GIB_GFN),), MEMORY, 0, ["4096 MiB", "maxmem - ram = 3584 MiB", "4608 MiB"]),
        (
            (Slot(1, GIB_GFN * 4, BLOCK), Slot(2, GIB_GFN * 4 + BLOCK // 2, BLOCK)),
            MEMORY,
            0,
            ["slot 1", "slot 2", "overlap"],
        ),
        ((Slot(1, GIB_GFN * 4, BLOCK),), MEMORY, 2, ["cannot hotplug 2", "1 dimm slots"]),
    ],
    ids=[
        "straddle",
        "too-many-slots",
        "flags",
        "misaligned-base",
        "misaligned-size",
        "beyond-region",
        "above-maxmem",
        "overlap",
        "hotplug-count",
    ],
)
def test_plans_qemu_or_the_guest_would_refuse_are_bad_input(slots, memory, hotplug, words):
    with pytest.raises(BadInput) as caught:
        Q.plan_layout(Layout(slots, name="bad"), memory, hotplug=hotplug)
    for word in words:
        assert word in str(caught.value)


def test_unchecked_plan_keeps_what_qemu_must_refuse():
    slots = (Slot(1, GIB_GFN * 4, BLOCK), Slot(2, GIB_GFN * 4 + BLOCK // 2, BLOCK))
    plan = Q.plan_layout(Layout(slots), MEMORY, hotplug=1, check=False)
    assert [d.slot.id for d in plan.hotplug_dimms] == [2]


def test_memory_settings_are_checked():
    with pytest.raises(BadInput, match="maxmem 256 MiB is below the RAM 512 MiB"):
        Q.QemuMemory(512, 256, 4)
    with pytest.raises(BadInput, match="at least 1"):
        Q.QemuMemory(512, 4096, 0)


# --- hotplug over QMP -------------------------------------------------------------


def test_hotplug_sends_the_plans_commands_in_order():
    plan = Q.plan_layout(load_layout(LAYOUTS_DIR / "qemu-pc-3dimm.json"), MEMORY, hotplug=2)
    vm = RefusingQmp()
    assert Q.hotplug(vm, plan.hotplug_dimms) == list(plan.hotplug_dimms)
    assert vm.sent == plan.hotplug_commands()


def test_a_refused_dimm_is_a_bad_input_quoting_qemu_and_its_backend_is_removed():
    plan = Q.plan_layout(load_layout(LAYOUTS_DIR / "qemu-pc-3dimm.json"), MEMORY, hotplug=2)
    vm = RefusingQmp(refuse={0x108000000: "address range conflicts with memory device id='mq-dimm-1'"})
    with pytest.raises(BadInput) as caught:
        Q.hotplug(vm, plan.hotplug_dimms)
    assert str(caught.value) == (
        "QEMU refused slot 2 (gfn 0x108000-0x10ffff) as a pc-dimm at 0x108000000 (128 MiB): "
        "address range conflicts with memory device id='mq-dimm-1'"
    )
    assert vm.sent[-1] == ("object-del", {"id": "mq-mem-2"})
    assert not any(args.get("id") == "mq-dimm-3" for _, args in vm.sent)  # stopped at the refusal


# --- parsers ----------------------------------------------------------------------


def test_flatview_of_the_memory_address_space_only():
    ranges = Q.parse_flatview(FLATVIEW)
    assert len(ranges) == 11
    assert ranges[1] == Q.FlatRange(0xC3000, 0xE7FFF, "rom", "pc.ram", 0xC3000)
    assert ranges[-1] == Q.FlatRange(0x100000000, 0x107FFFFFF, "ram", "mq-mem-1", 0)
    assert not any(r.name == "mq-mem-9" for r in ranges)  # the SMM view is another address space
    smm = Q.parse_flatview(FLATVIEW, "cpu-smm-0")
    assert [r.name for r in smm] == ["pc.ram", "mq-mem-9"]
    with pytest.raises(BadInput, match='no flat view of address space "memory"'):
        Q.parse_flatview('FlatView #0\n AS "I/O", root: io\n')


def test_layout_from_flatview_is_the_memslots_qemu_registers():
    layout = Q.layout_from_flatview(Q.parse_flatview(FLATVIEW))
    assert [(s.base_gfn, s.npages, s.flags) for s in layout.slots] == [
        (0x0, 0xC3, 0),
        (0xC3, 0x25, 2),
        (0xE8, 0x8, 0),
        (0xF0, 0x10, 2),
        (0x100, 0x1FF00, 0),
        (0xFFFC0, 0x40, 2),
        (0x100000, BLOCK, 0),
    ]
    assert [s.id for s in layout.slots] == list(range(7))


def test_memory_devices_keeps_dimms():
    assert Q.parse_memory_devices(MEMORY_DEVICES) == [
        Q.PluggedDimm("mq-dimm-1", 0x100000000, 128 << 20, 0, "/objects/mq-mem-1", False)
    ]
    with pytest.raises(BadInput):
        Q.parse_memory_devices({"error": "x"})


def test_iomem_system_ram_is_top_level_only():
    entries = Q.parse_iomem(IOMEM)
    assert entries[3] == Q.IomemEntry(0xA0000, 0xBFFFF, "PCI Bus 0000:00", 1)
    assert Q.system_ram(entries) == [(0x1000, 0x9FC00), (0x100000, 0x1FFE0000), (0x100000000, 0x108000000)]
    with pytest.raises(BadInput, match="as root"):
        Q.parse_iomem("00000000-00000000 : System RAM\n00000000-00000000 : Reserved\n")


def test_blocks_sorted_by_address():
    blocks = Q.parse_blocks(BLOCKS)
    assert [b.index for b in blocks] == [0, 3, 32]
    assert blocks[-1] == Q.MemoryBlock(32, 0x100000000, 0x8000000, "online", "Movable")
    assert Q.blocks_in(blocks, 0x100000000, 0x108000000) == [blocks[-1]]


# --- the differential check ------------------------------------------------------


def test_differential_check_agrees_on_a_matching_system():
    plan = Q.plan_layout(ONE_DIMM, MEMORY)
    assert Q.differential_check(plan, observed(), require_online=True) == []


def test_differential_check_names_every_view_that_lacks_a_dimm():
    layout = Layout(ONE_DIMM.slots + (Slot(2, 0x108000, BLOCK),))
    diffs = Q.differential_check(Q.plan_layout(layout, MEMORY), observed())
    assert {(d.view, d.slot) for d in diffs} == {("flatview", 2), ("memory-devices", 2), ("iomem", 2), ("blocks", 2)}
    assert "no device mq-dimm-2" in [d.message for d in diffs if d.view == "memory-devices"][0]


def test_differential_check_sees_a_dimm_at_another_address_and_extra_ones():
    moved = [dict(MEMORY_DEVICES[0], data=dict(MEMORY_DEVICES[0]["data"], addr=0x108000000))]
    extra = [MEMORY_DEVICES[0], {"type": "dimm", "data": {"id": "other", "addr": 0x200000000, "size": 1 << 27}}]
    plan = Q.plan_layout(ONE_DIMM, MEMORY)
    diffs = Q.differential_check(plan, observed(dimms=tuple(Q.parse_memory_devices(moved))))
    assert [str(d) for d in diffs] == [
        "memory-devices: mq-dimm-1 at 0x108000000 size 134217728, the layout says 0x100000000 size 134217728"
    ]
    diffs = Q.differential_check(plan, observed(dimms=tuple(Q.parse_memory_devices(extra))))
    assert [str(d) for d in diffs] == ["memory-devices: dimm 'other' at 0x200000000 is not in the layout"]


def test_differential_check_base_slots_must_be_what_qemu_built():
    wrong = Layout((Slot(0, 0x100, 0x1FE00), Slot(5, 0xC3, 0x25, flags=0), ONE_DIMM.slots[1]))
    diffs = Q.differential_check(Q.plan_layout(wrong, MEMORY), observed())
    assert sorted(str(d) for d in diffs) == [
        "flatview: base slot 0 (gfn 0x100-0x1feff): QEMU has 535822336 bytes (ram: pc.ram)",
        "flatview: base slot 5 (gfn 0xc3-0xe7): QEMU maps it as rom",
    ]


def test_differential_check_guest_side():
    plan = Q.plan_layout(ONE_DIMM, MEMORY)
    # The guest lost the dimm's RAM and claims RAM QEMU never gave it.
    iomem = IOMEM.replace("100000000-107ffffff : System RAM", "300000000-300000fff : System RAM")
    diffs = Q.differential_check(plan, observed(iomem=tuple(Q.parse_iomem(iomem))))
    assert sorted(str(d) for d in diffs) == [
        "iomem: guest System RAM 0x300000000-0x300000fff is not RAM in QEMU",
        "iomem: the guest has no System RAM at slot 1 (gfn 0x100000-0x107fff)",
    ]
    offline = BLOCKS.replace("state=online zones=Movable", "state=offline zones=Normal,Movable")
    check = observed(blocks=tuple(Q.parse_blocks(offline)))
    assert Q.differential_check(plan, check) == []
    assert [str(d) for d in Q.differential_check(plan, check, require_online=True)] == [
        "blocks: memory blocks [32] are not online"
    ]
    # No guest view read: a QEMU-only check.
    assert Q.differential_check(plan, observed(iomem=None, blocks=None)) == []


def test_differential_check_sees_a_backend_the_layout_lacks():
    flat = Q.parse_flatview(FLATVIEW) + [Q.FlatRange(0x110000000, 0x117FFFFFF, "ram", "mq-mem-8")]
    diffs = Q.differential_check(Q.plan_layout(ONE_DIMM, MEMORY), observed(flatview=tuple(flat)))
    assert [str(d) for d in diffs] == ["flatview: mq-mem-8 at 0x110000000 is not in the layout"]


def test_plan_json_names_the_region():
    doc = Q.plan_layout(ONE_DIMM, MEMORY).to_json()
    assert doc["device_memory"] == {"start": 0x100000000, "size": 0x1E0000000}
    assert doc["dimms"][0]["device"] == "mq-dimm-1" and doc["base_slots"][0]["id"] == 0


def test_shipped_qemu_layout_is_a_valid_layout_file():
    assert Path(LAYOUTS_DIR / "qemu-pc-3dimm.json").exists()
    assert len(load_layout(LAYOUTS_DIR / "qemu-pc-3dimm.json")) == 4


@pytest.mark.parametrize(
    "text",
    [
        "",
        "blocksize size=0x8000000\n",
        "block index=0 start=0x0 size=0x8000000 state=online zones=none\n",
    ],
)
def test_blocks_output_without_blocks_is_a_guest_error(text):
    with pytest.raises(GuestError, match="no memory blocks"):
        Q.parse_blocks(text)


# --- property: a system built exactly as planned agrees; drop a dimm and only it differs


def built_as_planned(plan: Q.QemuPlan, drop: int | None = None) -> Q.Observed:
    """What QEMU and the guest would show for ``plan``, minus dimm ``drop``."""
    flat = [
        Q.FlatRange(s.base_gfn * 4096, s.end_gfn * 4096 - 1, "rom" if s.flags & 2 else "ram", "pc.ram")
        for s in plan.base
    ]
    dimms, iomem, blocks = [], [], []
    for i, d in enumerate(plan.dimms):
        if d.slot.id == drop:
            continue
        flat.append(Q.FlatRange(d.addr, d.addr + d.size - 1, "ram", d.backend_id))
        dimms.append(Q.PluggedDimm(d.device_id, d.addr, d.size, i, f"/objects/{d.backend_id}", d.hotplug))
        iomem.append(Q.IomemEntry(d.addr, d.addr + d.size - 1, "System RAM", 0))
        blocks += [
            Q.MemoryBlock(a // Q.GUEST_BLOCK, a, Q.GUEST_BLOCK, "online", "Movable")
            for a in range(d.addr, d.addr + d.size, Q.GUEST_BLOCK)
        ]
    iomem += [Q.IomemEntry(s.base_gfn * 4096, s.end_gfn * 4096 - 1, "System RAM", 0) for s in plan.base if not s.flags]
    return Q.Observed(tuple(flat), tuple(dimms), tuple(iomem), tuple(blocks))


@settings(max_examples=60, deadline=None)
@given(
    positions=st.sets(st.integers(0, 59), min_size=1, max_size=4),
    sizes=st.lists(st.integers(1, 3), min_size=4, max_size=4),
    hotplug=st.integers(0, 4),
    drop_index=st.integers(0, 3),
)
def test_built_as_planned_agrees_and_a_missing_dimm_is_named(positions, sizes, hotplug, drop_index):
    start = 0x100000  # gfn of 4 GiB
    slots, cursor = [Slot(0, 0x100, 0x1FF00)], -1
    for i, pos in enumerate(sorted(positions)):
        if pos <= cursor:
            continue
        slots.append(Slot(i + 1, start + pos * BLOCK, sizes[i] * BLOCK))
        cursor = pos + sizes[i] - 1
    layout = Layout(tuple(slots), name="random")
    try:
        plan = Q.plan_layout(layout, MEMORY, hotplug=min(hotplug, len(slots) - 1))
    except BadInput as exc:
        assert "slot" in str(exc) or "MiB" in str(exc)
        return
    assert len(plan.dimms) == len(slots) - 1 <= MEMORY.slots
    assert len(plan.boot_args()) // 4 + len(plan.hotplug_commands()) // 2 == len(plan.dimms)
    assert Q.differential_check(plan, built_as_planned(plan), require_online=True) == []
    dropped = plan.dimms[drop_index % len(plan.dimms)].slot.id
    diffs = Q.differential_check(plan, built_as_planned(plan, drop=dropped), require_online=True)
    assert {d.slot for d in diffs} == {dropped}
    assert {d.view for d in diffs} == {"flatview", "memory-devices", "iomem", "blocks"}


def test_guest_layout_record_holds_a_layout_the_loader_reads():
    """The memslots.guest_layout record of a real guest: one sample (the slot
    count), the config as variant, and a layout layout_from_json accepts,
    slot for slot the flat view's RAM and ROM ranges, named."""
    from memqual.host.core.record import Measurement
    from memqual.host.memslots import guest_layouts as G
    from memqual.host.memslots.layout import layout_from_json

    flat = Q.parse_flatview(FLATVIEW)
    record = G.layout_record("pc-3dimm", flat, {"machine": "pc", "ram_mib": 512})
    again = Measurement.from_json(json.loads(json.dumps(record.to_json())))
    assert (again.scenario, again.metric, again.unit, again.better) == (
        "memslots.guest_layout",
        "slots",
        "slots",
        "lower",
    )
    assert again.variant == {"config": "pc-3dimm"} and again.settings == {"machine": "pc", "ram_mib": 512}
    layout = layout_from_json(again.extra["layout"], "pc-3dimm")
    assert layout == Q.layout_from_flatview(flat, name="pc-3dimm")
    assert again.samples == [len(layout)]
    assert len(again.extra["slot_names"]) == len(layout) and again.extra["slot_names"][-1].startswith("mq-mem-")
    assert G.layout_of(again) == layout


def test_guest_config_arguments():
    from memqual.host.memslots import guest_layouts as G

    config = G.GuestConfig("x", boot_dimms=2, bars=(G.RamBar("v", "VGA", 16), G.RamBar("s", "ivshmem-plain", 4)))
    args = config.extra_args()
    assert args.count("-device") == 4 and "VGA,id=v,vgamem_mb=16" in args
    assert "memory-backend-ram,id=mq-bar-s,size=4M" in args and "ivshmem-plain,id=s,memdev=mq-bar-s" in args
    machine = config.machine_config()
    assert (machine.maxmem_mib, machine.mem_slots, machine.machine) == (512 + 2 * G.GUEST_DIMM_MIB, 2, "pc")
    assert config.settings()["ram_bars"] == ["VGA:16M", "ivshmem-plain:4M"]

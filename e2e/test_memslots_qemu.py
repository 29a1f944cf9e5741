"""Memslot layouts applied to a real QEMU pc guest (docs/memslots-qemu.md).

Run: ``avocado run e2e/test_memslots_qemu.py`` (tags: memslots, qemu).
Two boots of a 512 MiB pc guest, about 15 s each under TCG, a q35 and a
pc guest of 3 GiB, and four short boots whose memslots are only read
(seed 000's guest of 10 GiB among them, about 9 s).
Records (scenario memslots.trace, claim memslot-hit; memslots.guest_layout,
one per real guest configuration) go to the test's output directory.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host.core.errors import BadInput
from memqual.host.memslots import guest_layouts as G
from memqual.host.memslots import qemu_layout as Q
from memqual.host.memslots import qemu_probe as P
from memqual.host.memslots import trace as T
from memqual.host.memslots.layout import LAYOUTS_DIR, Layout, Slot, load_layout
from memqual.host.memslots.model import model_table

LAYOUT = LAYOUTS_DIR / "qemu-pc-3dimm.json"
MEMORY = Q.QemuMemory(ram_mib=512, maxmem_mib=4096, slots=4)
# 3 GiB of RAM: q35 maps 2 GiB of it below 4 GiB and 1 GiB above, pc all 3
# GiB below; the layout describes q35's split.
Q35_LAYOUT = LAYOUTS_DIR / "qemu-q35-3g-2dimm.json"
Q35_MEMORY = Q.QemuMemory(ram_mib=3072, maxmem_mib=8192, slots=4, machine="q35")
BLOCK_PAGES = Q.GUEST_BLOCK // 4096
# Share of a dimm's pages the probe must have written and read back.  The
# guest serves user pages from ZONE_MOVABLE first; measured here: 98.7 to
# 99.99 % of each 128 MiB dimm.  Half leaves room for a busier guest while
# still proving the slot is used as a whole, not just touched.
MIN_COVERAGE = 0.5
# Real guests whose memslots are only read (docs/memslots-qemu.md): plain,
# with RAM-backed BARs, and with many dimms.  64 dimms of 128 MiB boot in
# about 5 s under TCG; 128 took 27 s and 256 made the 512 MiB guest run out
# of memory for the hotplugged sections' page structs.
BARS = (G.RamBar("mq-vga", "VGA", 16),) + tuple(G.RamBar(f"mq-ivshmem{i}", "ivshmem-plain", 1 << i) for i in range(4))
# Seed 000's guest (10 GiB split around the PCI hole, cirrus VGA, an
# emulated rtl8139 whose MMIO BAR is in no slot: its accesses are the misses
# the memslot-miss claim is about) decides that claim; the other rtl8139
# guests give the range its magnitude takes on other layouts.
READ_ONLY_CONFIGS = (
    G.SEED_000_GUEST,
    G.GuestConfig("pc-rtl8139", nic="rtl8139"),
    G.GuestConfig("pc-rtl8139-ram-bars", bars=BARS, nic="rtl8139"),
    G.GuestConfig("pc-64-dimms", boot_dimms=64),
)


class MemslotsQemu(GuestTest):
    """
    :avocado: enable
    :avocado: tags=memslots,qemu
    """

    @measures_nothing
    def test_layout_applied_checked_probed_and_traced(self) -> None:
        """One dimm at boot, two hotplugged: QEMU's flat view, its memory
        devices, the guest's /proc/iomem and memory blocks all equal the
        layout; a pattern is written and read back in every dimm (and seen
        by QEMU at the same guest-physical address); the frames the guest
        touched are replayed through the model.

        :avocado: tags=ab
        """
        started = time.monotonic()
        plan = Q.plan_layout(load_layout(LAYOUT), MEMORY, hotplug=2)
        self.assertEqual([d.slot.id for d in plan.boot_dimms], [1])
        self.assertEqual([d.slot.id for d in plan.hotplug_dimms], [2, 3])
        mmio_log = self.outdir / "qemu-mmio-trace.log"
        vm = self.boot(plan.machine_config(warm=False, extra_args=plan.boot_args() + T.mmio_trace_args(mmio_log)))
        agent = vm.deploy(P.AGENT)

        # Before the hotplug the check must see exactly the two missing dimms
        # (in QEMU's devices and flat view, and in the guest): it can fail.
        before = Q.differential_check(plan, P.observe(vm, agent))
        self.assertEqual({d.slot for d in before}, {2, 3}, [str(d) for d in before])
        self.assertEqual(
            {d.view for d in before}, {"flatview", "memory-devices", "iomem", "blocks"}, [str(d) for d in before]
        )

        onlined = P.apply_hotplug(vm, plan, agent)
        self.assertEqual(len(onlined), 3, onlined)
        observed = P.observe(vm, agent)
        diffs = Q.differential_check(plan, observed, require_online=True)
        self.assertEqual(diffs, [], [str(d) for d in diffs])
        assert observed.blocks is not None, "the guest showed no memory blocks"
        for dimm in plan.dimms:
            blocks = Q.blocks_in(observed.blocks, dimm.addr, dimm.addr + dimm.size)
            self.assertTrue(blocks and all(b.zones == "Movable" for b in blocks), f"{dimm.slot.describe()}: {blocks}")
        hotplugged = {d.id: d.hotplugged for d in observed.dimms}
        self.assertEqual(hotplugged, {"mq-dimm-1": False, "mq-dimm-2": True, "mq-dimm-3": True})
        self._record_layout("pc-dimms-hotplug", observed.flatview, plan, hotplugged=2)

        dimm_bytes = sum(d.size for d in plan.dimms)
        T.set_mmio_tracing(vm, True)  # the device accesses while the probe runs
        probe = P.run_probe(vm, agent, plan, mib=dimm_bytes // Q.MIB + 32)
        T.set_mmio_tracing(vm, False)
        accel = vm.accel
        vm.shutdown()  # QEMU has written its whole log
        self.log.info("probe summary %s in %.1f s", probe.summary, probe.duration_s)
        self.assertEqual(probe.summary["bad_words"], 0)
        self.assertEqual(probe.summary["moved"], 0)
        by_slot = probe.by_slot()
        for dimm in plan.dimms:
            result = by_slot[dimm.slot.id]
            self.log.info(
                "slot %d: %d of %d pages verified, %d/%d samples seen by QEMU",
                result.slot,
                result.verified,
                result.npages,
                result.host_verified,
                len(result.samples),
            )
            self.assertGreaterEqual(result.coverage, MIN_COVERAGE, f"slot {result.slot}")
            self.assertGreaterEqual(len(result.samples), 1)
            self.assertEqual(result.host_verified, len(result.samples), f"slot {result.slot}: QEMU's view")

        # The trace, replayed through the slots QEMU really registered.
        qemu_layout = observed.qemu_layout()
        replay = T.replay(qemu_layout, probe.frames)
        table = replay.table
        self.assertEqual(table.lookups, len(probe.frames))
        self.assertEqual(table.hit_fraction, 1.0, "a frame the guest used is in no slot QEMU built")
        self.assertEqual(
            set(table.structures), {"linear", "reorder", "tree2011", "hbtree", "binsearch", "binsearch-lru", "rbtree"}
        )
        for name, stats in table.structures.items():
            self.log.info("trace %s: mean %.2f max %d nodes", name, stats.mean_nodes, stats.max_nodes)
            if stats.bound_nodes is not None:
                self.assertLessEqual(stats.max_nodes, stats.bound_nodes, name)
        # The agent's pages are consecutive within runs: the last-slot cache
        # answers almost every lookup with its one probe.
        self.assertLess(table.structures["binsearch-lru"].mean_nodes, 1.1)
        # The slot count is what QEMU built, observed, not set: the records'
        # extra carries it, so it does not key the metric.
        settings = {
            "layout": "qemu-flatview",
            "ram_mib": MEMORY.ram_mib,
            "dimms": len(plan.dimms),
            "trace": "mem_probe first touch",
        }
        for record in T.records(replay, settings, duration_s=time.monotonic() - started):
            self.record(record)

        # Device MMIO during the probe: frames in no RAM slot, every one.
        mmio = T.parse_mmio_log(mmio_log.read_text(errors="replace"), observed.flatview)
        self.log.info("MMIO trace: %d accesses in %d frames", len(mmio), len(set(mmio)))
        if not mmio:
            self.assertNotEqual(accel, "tcg", "under TCG the guest's APIC timer alone makes MMIO accesses: none logged")
            self.log.warning(
                "no device MMIO reached QEMU under %s (in-kernel APIC, ioeventfd): no MMIO trace records", accel
            )
            return
        mmio_replay = T.replay(qemu_layout, mmio)
        self.assertEqual(mmio_replay.table.hit_fraction, 0.0, "an MMIO access fell in a RAM slot")
        for name, stats in mmio_replay.table.structures.items():
            self.log.info("MMIO trace %s: mean %.2f max %d nodes", name, stats.mean_nodes, stats.max_nodes)
        self.assertEqual(mmio_replay.table.structures["linear"].mean_nodes, len(qemu_layout))
        for record in T.records(
            mmio_replay,
            dict(settings, trace="device mmio (QEMU trace events)"),
            duration_s=time.monotonic() - started,
            scenario=T.MMIO_SCENARIO,
            claim=T.MMIO_CLAIM,
        ):
            self.record(record)

    @measures_nothing
    def test_qemu_refusals_are_clear_errors(self) -> None:
        """Layouts QEMU refuses (overlap, above maxmem, too many slots): each
        a BadInput that names the slot and quotes QEMU, with QEMU left as it
        was; the same layouts are refused before QEMU by the plan."""
        layout = Layout((Slot(1, 1 << 20, BLOCK_PAGES),), name="one-dimm")
        plan = Q.plan_layout(layout, MEMORY)
        vm = self.boot(plan.machine_config(warm=False))
        base = 1 << 20
        cases = {
            "overlap": (Slot(5, base + BLOCK_PAGES // 2, BLOCK_PAGES), "conflicts"),
            "above maxmem": (Slot(6, base + 4 * BLOCK_PAGES, 32 * BLOCK_PAGES), "not enough space"),
        }
        for what, (slot, quoted) in cases.items():
            bad = Q.plan_layout(Layout(layout.slots + (slot,), name=what), MEMORY, hotplug=1, check=False)
            with self.assertRaises(BadInput, msg=what) as caught:
                Q.hotplug(vm, bad.hotplug_dimms)
            message = str(caught.exception)
            self.log.info("%s: %s", what, message)
            self.assertIn(f"slot {slot.id} ", message)
            self.assertIn(quoted, message)
            with self.assertRaises(BadInput, msg=f"{what} before QEMU"):
                # Layout validation itself refuses the overlap; the plan the rest.
                Q.plan_layout(Layout(layout.slots + (slot,), name=what), MEMORY, hotplug=1)

        # Too many slots: fill the three free slots, the fifth dimm is refused.
        extra = tuple(Slot(10 + i, base + (2 + 2 * i) * BLOCK_PAGES, BLOCK_PAGES) for i in range(4))
        crowded = Q.plan_layout(Layout(layout.slots + extra, name="crowded"), MEMORY, hotplug=4, check=False)
        with self.assertRaises(BadInput) as caught:
            Q.hotplug(vm, crowded.hotplug_dimms)
        message = str(caught.exception)
        self.log.info("too many slots: %s", message)
        self.assertIn("slot 13 ", message)
        with self.assertRaises(BadInput):
            Q.plan_layout(Layout(layout.slots + extra, name="crowded"), MEMORY, hotplug=4)

        # QEMU kept the three that fit and nothing of the refused ones.
        flat, dimms = Q.read_qemu(vm)
        self.assertEqual(sorted(d.id for d in dimms), ["mq-dimm-1", "mq-dimm-10", "mq-dimm-11", "mq-dimm-12"])
        fitted = Q.plan_layout(Layout(layout.slots + extra[:3], name="fitted"), MEMORY, hotplug=3)
        qemu_only = Q.Observed(tuple(flat), tuple(dimms), iomem=None)  # the guest's view is not the point here
        self.assertEqual([str(d) for d in Q.differential_check(fitted, qemu_only)], [])
        backends = {r.name for r in flat if r.name.startswith(Q.BACKEND_PREFIX)}
        self.assertEqual(backends, {"mq-mem-1", "mq-mem-10", "mq-mem-11", "mq-mem-12"})

    @measures_nothing
    def test_q35_split_and_the_same_layout_on_pc(self) -> None:
        """q35 splits 3 GiB of RAM at 2 GiB (1 GiB goes above 4 GiB), pc
        does not: the q35 layout (two base slots, a boot dimm and a
        hotplugged one at 5 GiB) agrees with a q35 guest in every view and
        its dimms hold the pattern; the same layout on a pc guest of the
        same size is caught by the differential check: pc.ram holds 3 GiB
        where the layout says 2 GiB."""
        layout = load_layout(Q35_LAYOUT)
        plan = Q.plan_layout(layout, Q35_MEMORY, hotplug=1)
        self.assertEqual(Q35_MEMORY.below_4g(), 2 << 30)
        self.assertEqual(Q35_MEMORY.device_memory()[0], 5 << 30)
        vm = self.boot(plan.machine_config(warm=False))
        agent = vm.deploy(P.AGENT)
        onlined = P.apply_hotplug(vm, plan, agent)
        self.assertEqual(len(onlined), 2, onlined)
        observed = P.observe(vm, agent)
        diffs = Q.differential_check(plan, observed, require_online=True)
        self.assertEqual(diffs, [], [str(d) for d in diffs])
        self._record_layout("q35-split-dimms", observed.flatview, plan, hotplugged=1)
        # RAM on both sides of 4 GiB: q35 splits its 3 GiB at 2 GiB.
        ram = [s for s in observed.qemu_layout().slots if s.npages >= (1 << 30) // 4096]
        self.assertTrue(any(s.base_gfn < 0x100000 for s in ram) and any(s.base_gfn >= 0x100000 for s in ram), ram)
        probe = P.run_probe(vm, agent, plan, mib=sum(d.size for d in plan.dimms) // Q.MIB + 32)
        self.assertEqual(probe.summary["bad_words"], 0)
        by_slot = probe.by_slot()
        for dimm in plan.dimms:
            self.assertGreaterEqual(by_slot[dimm.slot.id].coverage, MIN_COVERAGE, f"slot {dimm.slot.id}")
        vm.shutdown()

        pc_memory = dataclasses.replace(Q35_MEMORY, machine="pc")
        self.assertEqual(pc_memory.below_4g(), 3 << 30)
        pc_plan = Q.plan_layout(layout, pc_memory, hotplug=1)
        pc_vm = self.boot(pc_plan.machine_config(warm=False))
        pc_agent = pc_vm.deploy(P.AGENT)
        P.apply_hotplug(pc_vm, pc_plan, pc_agent)
        pc_observed = P.observe(pc_vm, pc_agent)
        pc_diffs = Q.differential_check(pc_plan, pc_observed, require_online=True)
        self._record_layout("pc-3g-dimms", pc_observed.flatview, pc_plan, hotplugged=1)
        self.log.info("q35 layout on pc: %s", [str(d) for d in pc_diffs])
        # pc keeps all 3 GiB below 4 GiB, where q35 stops at 2 GiB: base
        # slot 0 does not match pc.ram.  (On pc the dimm region starts at
        # 4 GiB, so slot 1 is planned as a dimm, and QEMU builds it as asked.)
        self.assertEqual({(d.view, d.slot) for d in pc_diffs}, {("flatview", 0)}, [str(d) for d in pc_diffs])

    # -- real guests' layouts, recorded -------------------------------------
    def _record_layout(
        self,
        config: str,
        flatview: Sequence[Q.FlatRange],
        plan: Q.QemuPlan | None = None,
        hotplugged: int = 0,
        settings: dict | None = None,
        duration_s: float = 0.0,
    ) -> int:
        """Write the memslots.guest_layout record of a real guest; check the
        model can run every workload the memslot claims use on it."""
        if settings is None:
            assert plan is not None
            settings = {
                "machine": plan.memory.machine,
                "ram_mib": plan.memory.ram_mib,
                "boot_dimms": len(plan.dimms) - hotplugged,
                "hotplugged_dimms": hotplugged,
                "dimm_mib": [d.size // Q.MIB for d in plan.dimms],
                "ram_bars": [],
            }
        record = G.layout_record(config, flatview, settings, duration_s=duration_s)
        layout = G.layout_of(record)
        for workload in ("miss", "ram-hits", "other-hits"):
            table = model_table(layout, workload, lookups=2000)
            self.assertEqual(table.slots, len(layout))
            self.log.info(
                "%s (%d slots) %s: %s",
                config,
                len(layout),
                workload,
                {n: round(table.structures[n].mean_nodes, 2) for n in ("linear", "reorder", "tree2011", "hbtree")},
            )
        self.record(record)
        return len(layout)

    @measures_nothing
    def test_guest_layouts_recorded(self) -> None:
        """The memslots of real guests as configured in practice: seed 000's
        guest (10 GiB of RAM split around the PCI hole, cirrus VGA, an
        rtl8139), pc with an rtl8139 alone and with RAM-backed BARs beside
        it (a VGA framebuffer, ivshmem regions), and pc with 64 dimms; every
        rtl8139's MMIO BAR recorded, in no slot.  Every RAM BAR and every dimm is exactly one slot of its own
        size, and nothing else appears beside the base RAM and firmware;
        each layout is recorded."""
        counts: dict[str, int] = {}
        base_regions = {"pc.ram", "pc.bios"}
        for config in READ_ONLY_CONFIGS:
            started = time.monotonic()
            vm = self.boot(config.machine_config())
            flat, dimms = Q.read_qemu(vm)
            vm.shutdown()
            slots = [r for r in flat if r.kind in Q.SLOT_KINDS]
            by_name = {r.name: r for r in slots}
            for bar in config.bars:
                region = by_name.get(bar.region_name)
                assert region is not None, f"{config.name}: {bar.driver} BAR {bar.region_name} is no memslot"
                self.assertEqual(region.size, bar.size_mib * Q.MIB, bar.region_name)
            self.assertEqual(len(dimms), config.boot_dimms)
            # Beside base RAM and firmware: exactly the BARs and the dimms,
            # one slot each (the VGA ROM also changes how the PAM windows
            # below 1 MiB split pc.ram, so the base count is not fixed).
            extra = sorted(r.name for r in slots if r.name not in base_regions)
            expected = sorted(
                [b.region_name for b in config.bars]
                + [f"mq-gl-mem-{i}" for i in range(config.boot_dimms)]
                + (["vga.vram"] if config.vga else [])
            )
            self.assertEqual(extra, expected, config.name)
            if config.vga:
                self.assertEqual(by_name["vga.vram"].size, config.vgamem_mib * Q.MIB, config.name)
            if config.ram_mib > 4096:
                # RAM on both sides of the PCI hole, as in the seed: two
                # pc.ram slots of 1 GiB or more, one below 4 GiB, one above.
                big = [r for r in slots if r.name == "pc.ram" and r.size >= 1 << 30]
                self.assertEqual([r.start >= 1 << 32 for r in big], [False, True], config.name)
            if config.nic:
                nic = G.nic_bar(flat, config.nic)
                assert nic is not None, f"{config.name}: the {config.nic} MMIO BAR is not mapped"
                in_slot = Q.layout_from_flatview(flat).find(nic.gfn)
                self.assertIsNone(in_slot, f"{config.name}: the NIC BAR fell in a memslot")
            counts[config.name] = self._record_layout(
                config.name, flat, settings=config.settings(), duration_s=time.monotonic() - started
            )
        self.log.info("memslots of real guests: %s", counts)
        self.assertEqual(counts[G.SEED_000_GUEST.name], 10)
        self.assertGreater(counts["pc-64-dimms"], 64)

"""virtio-mem on a real guest: plug and unplug through QMP, the guest's use
of the memory, QEMU's RSS, timing beside a balloon inflate of the same
size, and dynamic memslots.

Run: ``avocado run e2e/test_virtio_mem.py`` (tag virtio_mem), under the
QEMU ``memqual run --qemu`` chose ($MEMQUAL_QEMU).  A pc guest (virtio-mem
is a PCI device) of 512 MiB with Debian's virtio_mem module; hotplugged
memory is onlined into ZONE_MOVABLE (memhp_default_state=online_movable),
so user pages land in it first and it can be unplugged again.
Records: virtio_mem.resize (grow/shrink, host- and guest-timed, and the
balloon inflate of the same size), virtio_mem.memslots (the memslots
the device occupies as blocks are plugged, with the reference models'
lookup cost at each count), virtio_mem.memslot_layout (each plugged
state's whole layout, which the memslot-miss card lists as a virtio-mem
guest of today) and memslots.kvm_lookup (a complete miss through /dev/kvm
at those states' slot counts, where /dev/kvm can run the harness).
"""

from __future__ import annotations

import time
from typing import Any

from memqual.e2e.base import GuestTest
from memqual.host import virtio_mem as V
from memqual.host.balloon.device import BalloonController
from memqual.host.balloon.rss import rss_kib, wait_rss
from memqual.host.core import kvm as K
from memqual.host.core import qemu_binary
from memqual.host.core.machine import Machine, MachineConfig
from memqual.host.core.qemu import qemu_version
from memqual.host.core.record import Measurement
from memqual.host.memslots import kvm_lookup as L
from memqual.host.memslots import kvm_lookup_results, virtio_layouts
from memqual.host.memslots.model import model_table
from memqual.host.memslots.qemu_layout import layout_from_flatview, parse_flatview
from memqual.host.memslots.table import KVM_LOOKUP

MIB = 1 << 20
BASE_MIB = V.BASE_MIB
AGENT = "vmem_agent"
RESIZE_DEADLINE_S = 60.0
# A request the guest cannot meet: how long it is watched not being met.
# The driver's retries are far apart (its timer starts at 50 s), so a few
# seconds show the state it stays in without waiting for a retry.
UNMET_WINDOW_S = 5.0
# Plugged, then filled with the pattern, beyond what the base memory could
# take back: unplugging all of it cannot succeed while the agent holds it.
# The plug/unplug guest has less base memory, so the fill (the slowest
# step under TCG) can be small and still be more than the base can take.
PLUG_BASE_MIB = 256
PLUG_MIB = 384
FILL_MIB = 320
# Share of the filled pages that must sit in the device's memory: the
# allocator serves user pages from ZONE_MOVABLE first (measured here
# nearly all); half still proves the plugged memory is used.
MIN_IN_RANGE = 0.5
# QEMU's RSS must give back this share of what the fill added once the
# blocks are unplugged (QEMU discards unplugged blocks at once).
RSS_RETURNED = 0.8


def plan() -> V.Plan:
    """The scenario's sizes in the run's profile (host/virtio_mem.py's rows)."""
    return V.RESIZE.sizes_for()


def config(device: V.VirtioMemDevice, base_mib: int = BASE_MIB) -> MachineConfig:
    return MachineConfig(
        memory_mib=base_mib,
        cpus=1,
        machine="pc",
        maxmem_mib=base_mib + device.size_mib,
        mem_slots=1,
        cmdline_extra="memhp_default_state=online_movable",
        extra_args=device.args(),
        warm=False,
    )


def mem_total_kib(vm: Machine) -> int:
    for line in vm.ssh.run(["cat", "/proc/meminfo"]).stdout.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise AssertionError("no MemTotal in the guest's /proc/meminfo")


def field(line: str, key: str) -> int:
    for part in line.split():
        if part.startswith(key + "="):
            return int(part.split("=", 1)[1])
    raise AssertionError(f"no {key}= in agent line {line!r}")


class VirtioMem(GuestTest):
    """
    :avocado: enable
    :avocado: tags=virtio_mem
    """

    def boot_vmem(self, device: V.VirtioMemDevice, base_mib: int = BASE_MIB) -> tuple[Machine, str]:
        vm = self.boot(config(device, base_mib))
        self.require(bool(V.device_properties(vm)), f"QEMU {qemu_version()} has no {V.DEVICE} device")
        loaded = vm.ssh.run(["modprobe", "virtio_mem"], check=False)
        self.require(loaded.status == 0, f"the guest kernel has no virtio_mem module: {loaded.stderr.strip()}")
        return vm, vm.deploy(AGENT)

    def guest_timed(
        self, vm: Machine, agent: str, device: V.VirtioMemDevice, target_bytes: int, base_kib: int
    ) -> tuple[V.Resize, float]:
        """One resize, timed by the host (QOM size) and the guest (MemTotal)."""
        watch = vm.ssh.start([agent, "watch", str(base_kib + target_bytes // 1024), str(RESIZE_DEADLINE_S)])
        lines = watch.lines(timeout=RESIZE_DEADLINE_S)
        self.assertEqual(next(lines), "watching")
        result = V.resize(vm, device, target_bytes, RESIZE_DEADLINE_S)
        reached = next(lines)
        watch.wait(timeout=RESIZE_DEADLINE_S)
        self.assertTrue(result.met, f"virtio-mem did not reach {target_bytes >> 20} MiB: {result}")
        self.assertTrue(reached.startswith("reached "), f"the guest never saw MemTotal change: {reached}")
        return result, float(reached.split("=", 1)[1])

    def test_plug_unplug(self) -> None:
        """Correctness: plugged memory seen and used, a pattern in it survives
        other blocks unplugged, a request the guest cannot meet stays unmet
        with the guest alive, unplug gives QEMU's memory back."""
        device = V.VirtioMemDevice(size_mib=512)
        vm, agent = self.boot_vmem(device, PLUG_BASE_MIB)
        base_kib = mem_total_kib(vm)
        rss_before = rss_kib(vm.pid)

        plugged = V.resize(vm, device, PLUG_MIB * MIB, RESIZE_DEADLINE_S)
        self.assertTrue(plugged.met, plugged)
        self.assertEqual(mem_total_kib(vm), base_kib + PLUG_MIB * 1024)

        start = V.device_base(vm, device)
        fill = vm.ssh.start(
            [agent, "fill", str(FILL_MIB), "0x5eed", hex(start), hex(start + device.size_mib * MIB), "120"]
        )
        lines = fill.lines(timeout=120)
        filled = next(lines)
        self.log.info("%s", filled)
        pages = field(filled, "pages")
        self.assertGreaterEqual(field(filled, "in_range") / pages, MIN_IN_RANGE, filled)
        rss_filled = rss_kib(vm.pid)
        self.assertGreater(rss_filled - rss_before, FILL_MIB * 1024 // 2, "the fill did not reach QEMU's memory")

        # Other blocks: 32 MiB of the plugged memory, which the agent's pages
        # may or may not occupy (then the kernel migrates them first).
        partial = V.resize(vm, device, (PLUG_MIB - 32) * MIB, RESIZE_DEADLINE_S)
        self.assertTrue(partial.met, partial)

        vm.ssh.run(["touch", "/tmp/vmem.verify"])
        verified = next(lines)
        self.log.info("%s", verified)
        self.assertEqual(field(verified, "bad_words"), 0, verified)

        # All of it, while FILL_MIB are held and the base memory cannot take
        # them all.  A clear state within the window, never a hang: the
        # request stays unmet with the holder's memory intact, or the
        # guest's OOM killer ends the holder (measured here under TCG: the
        # driver migrates what fits into the base memory, then the
        # guest's OOM killer ends the agent) and the request is met.
        unmet = V.resize(vm, device, 0, UNMET_WINDOW_S)
        self.log.info("request 0 while %d MiB are held: %s", FILL_MIB, unmet)
        self.assertEqual(vm.ssh.run(["true"]).status, 0, "the guest stopped answering")
        killed = [
            line for line in vm.ssh.run(["dmesg"]).stdout.splitlines() if f"({AGENT})" in line and "Killed" in line
        ]
        if unmet.met:
            self.assertTrue(killed, f"virtio-mem unplugged memory the guest still holds: {unmet}")
        else:
            self.assertGreater(unmet.size_bytes, 0)
        self.assertEqual(vm.ssh.run(["cat", "/proc/meminfo"]).status, 0)
        self.log.info("unmeetable request ended: %s", killed[0] if killed else "unmet, the holder alive")
        vm.ssh.run(["touch", "/tmp/vmem.release"])
        result = fill.wait(timeout=60)
        if not killed:
            self.assertEqual(result.status, 0, result.stderr)

        # Memory free again: the same request is met (asked anew, as the
        # driver's own retry may be a minute away).  What the last unplug
        # takes away was written by the agent (its pages that migrated into
        # the base memory stay resident there), so QEMU's RSS falls by it.
        still_plugged = V.size_bytes(vm, device)
        rss_held = rss_kib(vm.pid)
        V.request(vm, device, still_plugged)
        emptied = V.resize(vm, device, 0, RESIZE_DEADLINE_S)
        self.assertTrue(emptied.met, emptied)
        self.assertEqual(mem_total_kib(vm), base_kib)
        expected_kib = RSS_RETURNED * still_plugged / 1024
        met, rss_after, waited = wait_rss(vm.pid, lambda rss: rss_held - rss >= expected_kib, deadline_s=10.0)
        self.log.info(
            "QEMU RSS: %d MiB before, %d filled, %d with %d MiB plugged, %d after unplug (%.1f s)",
            rss_before >> 10,
            rss_filled >> 10,
            rss_held >> 10,
            still_plugged >> 20,
            rss_after >> 10,
            waited,
        )
        self.assertTrue(
            met, f"unplugging {still_plugged >> 20} MiB gave QEMU's RSS back only {(rss_held - rss_after) >> 10} MiB"
        )

    def test_resize_timing(self) -> None:
        """Growing and shrinking, host- and guest-timed, beside a balloon
        inflate of the same size in the same guest.  Full profile only: two
        cycles in one guest decide nothing, and CI's time goes to the tests
        that assert.

        :avocado: tags=slow
        """
        steps = plan()
        device = V.VirtioMemDevice(size_mib=max(steps.sizes_mib))
        vm, agent = self.boot_vmem(device)
        ctl = BalloonController(vm, device_id="balloon0")
        base_kib = mem_total_kib(vm)
        ram = ctl.ram_bytes()

        def inflate(size_bytes: int) -> float:
            inflated = ctl.reach(ram - size_bytes, deadline_s=RESIZE_DEADLINE_S)
            self.assertTrue(inflated.reached, inflated)
            self.assertTrue(ctl.reach(ram, deadline_s=RESIZE_DEADLINE_S).reached)
            return inflated.seconds

        try:
            timings = V.time_resizes(
                lambda target: self.guest_timed(vm, agent, device, target, base_kib),
                inflate,
                steps.sizes_mib,
                steps.repeats,
            )
        except V.ResizeFailed as exc:
            self.fail(str(exc))
        for timing in timings:
            self.log.info(
                "%d MiB: %s; shrink / balloon inflate (medians) %.2f",
                timing.size_mib,
                timing.figures,
                timing.shrink_over_inflate,
            )
            for measurement in timing.records(BASE_MIB, device.block_mib):
                self.record(measurement)

    def test_dynamic_memslots(self) -> None:
        """The memslots the device's memory occupies as blocks are plugged
        and unplugged (dynamic-memslots=on), fed to the reference models."""
        # Asked of the binary that will run (a QEMU without the property
        # would refuse the command line), not assumed from its version.
        properties = qemu_binary.device_properties(qemu_binary.current(), V.DEVICE)
        self.require(bool(properties), f"QEMU {qemu_version()} has no {V.DEVICE} device")
        self.require(
            V.DYNAMIC_MEMSLOTS in properties,
            f"QEMU {qemu_version()}'s {V.DEVICE} has no {V.DYNAMIC_MEMSLOTS} property (QEMU 8.2 added it)",
        )
        sized = plan()
        device = V.VirtioMemDevice(
            size_mib=max(sized.dyn_device_mib, sized.dyn_large_mib), dynamic_memslots=True, reserve=False
        )
        vm, _agent = self.boot_vmem(device)
        counts: list[int] = []
        steps: list[dict[str, Any]] = []
        states: list[Measurement] = []
        state_settings = {
            "device_mib": device.size_mib,
            "block_mib": device.block_mib,
            "base_mib": BASE_MIB,
            "machine": "pc",
            # QEMU sizes the memslots itself when the device has no
            # ``memslots`` property to set (QEMU 8.2 to 10 have none).
            "memslots": "explicit" if "memslots" in properties else "auto",
        }
        for index, size_mib in enumerate(sized.dyn_steps_mib):
            result = V.resize(vm, device, size_mib * MIB, RESIZE_DEADLINE_S)
            self.assertTrue(result.met, result)
            ranges = parse_flatview(vm.hmp("info mtree -f"))
            slots = V.device_ranges(ranges, device)
            layout = layout_from_flatview(ranges, name=f"virtio-mem-{size_mib}M")
            table = model_table(layout, "miss", lookups=2000)
            states.append(virtio_layouts.state_record(index, size_mib, ranges, device.memdev, state_settings))
            counts.append(len(slots))
            steps.append(
                {
                    "plugged_mib": size_mib,
                    "device_memslots": len(slots),
                    "guest_memslots": len(layout.slots),
                    # Nodes a miss examines in each reference structure (the
                    # 2011 array, the 2011 tree, today's rbtree) at this count.
                    "miss_mean_nodes": {name: st.mean_nodes for name, st in table.structures.items()},
                }
            )
            self.log.info("plugged %d MiB: %d device memslots, %d in all", size_mib, len(slots), len(layout.slots))
        self.assertEqual(counts[0], 0, "an empty device maps no memslot")
        peak = sized.dyn_steps_mib.index(max(sized.dyn_steps_mib))
        self.assertEqual(counts[: peak + 1], sorted(counts[: peak + 1]), f"memslots fell while plugging: {counts}")
        self.assertGreater(counts[peak], counts[1], f"more plugged memory mapped no more memslots: {counts}")
        self.assertEqual(counts[-1], 0, f"unplugging all left memslots mapped: {counts}")
        self.record(
            Measurement(
                scenario="virtio_mem.memslots",
                metric="device_memslots_at_peak",
                unit="memslots",
                better="lower",
                samples=[float(counts[peak])],
                settings={"device_mib": sized.dyn_device_mib, "steps_mib": list(sized.dyn_steps_mib)},
                extra={"steps": steps, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            )
        )
        large = V.resize(vm, device, sized.dyn_large_mib * MIB, RESIZE_DEADLINE_S)
        self.assertTrue(large.met, large)
        ranges = parse_flatview(vm.hmp("info mtree -f"))
        states.append(
            virtio_layouts.state_record(len(states), sized.dyn_large_mib, ranges, device.memdev, state_settings)
        )
        self.log.info(
            "plugged %d MiB in %.1f s: %d device memslots, %d in all",
            sized.dyn_large_mib,
            large.seconds,
            len(V.device_ranges(ranges, device)),
            int(states[-1].samples[0]),
        )
        self.assertGreater(len(V.device_ranges(ranges, device)), max(counts), "the whole device mapped no more")
        for state in states:
            self.record(state)
        # The guest is done: the /dev/kvm harness times the host's kernel
        # alone, at the slot counts the guest had, alternating between them.
        vm.shutdown()
        counts_recorded = virtio_layouts.slot_counts(states)
        misses = self.kvm_at_counts(counts_recorded)
        # What the memslot-miss card needs (the report judges it): every
        # state's slot count with /dev/kvm's miss cost at it.
        missing = set(counts_recorded) - {int(r.variant["slots"]) for r in misses}
        self.assertEqual(missing, set(), "slot counts of the recorded states without a /dev/kvm miss")

    def kvm_at_counts(self, counts: tuple[int, ...]) -> list[Measurement]:
        """A complete miss through /dev/kvm at each of ``counts`` slots, in
        fresh VMs, the counts' order reversed every replicate; only the
        miss points are recorded (the slope over a few close counts says
        nothing).  Skipped, with the layouts already recorded, where
        /dev/kvm cannot run the harness."""
        try:
            with K.Kvm() as kvm:
                nr = kvm.check_extension(K.KVM_CAP_NR_MEMSLOTS)
                ioeventfd = kvm.check_extension(K.KVM_CAP_IOEVENTFD)
        except K.KvmUnavailable as exc:
            self.skip_because(f"layouts recorded; no /dev/kvm lookup at their slot counts: {exc}")
            return []
        self.require(bool(ioeventfd), "layouts recorded; /dev/kvm has no KVM_CAP_IOEVENTFD: misses would exit")
        self.require(max(counts) <= nr, f"layouts recorded; /dev/kvm offers {nr} memslots, fewer than {max(counts)}")
        config = L.LookupConfig(
            slots=counts, replicates=max(KVM_LOOKUP.sizes_for().replicates, 3), rounds=21, iterations=600
        )
        result = L.run_lookup(config, progress=self.log.info)
        misses = [
            r for r in kvm_lookup_results.records(result) if r.metric == "access_ns" and r.variant["kind"] == "miss"
        ]
        self.assertEqual(sorted(r.variant["slots"] for r in misses), sorted(counts))
        for rec in misses:
            self.assertEqual(rec.n_replicates, config.replicates, rec.variant)
            self.log.info(
                "/dev/kvm miss at %d slots: median %.1f ns over %d VMs (VM medians %s)",
                rec.variant["slots"],
                rec.extra["median_ns"],
                rec.n_replicates,
                ", ".join(f"{v:.1f}" for v in rec.extra["replicate_medians_ns"]),
            )
            self.record(rec)
        return misses

"""virtio-mem on a real guest: plug and unplug, the resize timing beside a
balloon inflate, and dynamic memslots, in pc guests with Debian's virtio_mem
module and hotplugged memory onlined movable.

Each test boots its guest, calls host/virtio_mem.py's procedures, records
and asserts; the dynamic-memslots test also records each plugged state's
layout and /dev/kvm's miss cost at its slot count.  Run: ``avocado run
e2e/test_virtio_mem.py`` (tag virtio_mem).  docs/memslots-model.md,
"e2e/test_virtio_mem.py", lists its records."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host import virtio_mem
from memqual.host.balloon.device import BalloonController
from memqual.host.balloon.rss import rss_kib
from memqual.host.balloon.scenarios import AGENT as BALLOON_AGENT
from memqual.host.balloon.timed_move import BalloonMover
from memqual.host.core import kvm as kvm_api
from memqual.host.core import kvm_uapi as uapi
from memqual.host.core import nested, qemu_binary
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig, qemu_version
from memqual.host.core.record import Measurement
from memqual.host.memslots import kvm_lookup, kvm_lookup_results, virtio_layouts
from memqual.host.memslots.model import model_table
from memqual.host.memslots.qemu_layout import layout_from_flatview
from memqual.host.memslots.table import KVM_LOOKUP

MIB = 1 << 20
BASE_MIB = virtio_mem.BASE_MIB
# Share of the filled pages that must sit in the device's memory: the
# allocator serves user pages from ZONE_MOVABLE first (measured here
# nearly all); half still proves the plugged memory is used.
MIN_IN_RANGE = 0.5


def config(device: virtio_mem.VirtioMemDevice, base_mib: int = BASE_MIB) -> MachineConfig:
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


class VirtioMem(GuestTest):
    """
    :avocado: enable
    :avocado: tags=virtio_mem
    """

    def boot_vmem(self, device: virtio_mem.VirtioMemDevice, base_mib: int = BASE_MIB) -> tuple[Machine, str]:
        vm = self.boot(config(device, base_mib))
        self.require(bool(virtio_mem.device_properties(vm)), f"QEMU {qemu_version()} has no {virtio_mem.DEVICE} device")
        loaded = vm.ssh.run(["modprobe", "virtio_mem"], check=False)
        self.require(loaded.status == 0, f"the guest kernel has no virtio_mem module: {loaded.stderr.strip()}")
        return vm, vm.deploy(virtio_mem.AGENT)

    @contextlib.contextmanager
    def scenario(self) -> Iterator[None]:
        """A resize the procedure needed and did not get fails the test."""
        try:
            yield
        except virtio_mem.ResizeFailed as exc:
            self.fail(str(exc))

    @measures_nothing
    def test_plug_unplug(self) -> None:
        """Correctness: plugged memory seen and used, a pattern in it survives
        other blocks unplugged, a request the guest cannot meet stays unmet
        with the guest alive, unplug gives QEMU's memory back.  It times
        nothing and its RSS readings are its own QEMU's, which only host KSM
        (tests holding the lock exclusive) could move: it runs beside
        other such tests."""
        device = virtio_mem.VirtioMemDevice(size_mib=virtio_mem.PLUG_DEVICE_MIB)
        vm, agent = self.boot_vmem(device, virtio_mem.PLUG_BASE_MIB)
        with self.scenario():
            run = virtio_mem.run_plug_unplug(vm, device, agent, lambda: rss_kib(vm.pid))
        self.log.info("filled: %s; verified: %s", run.filled, run.verified)
        self.assertEqual(run.total_plugged_kib, run.base_kib + virtio_mem.PLUG_MIB * 1024)
        self.assertGreaterEqual(run.in_range_share, MIN_IN_RANGE, run.filled)
        self.assertGreater(
            run.rss_filled_kib - run.rss_before_kib,
            virtio_mem.FILL_MIB * 1024 // 2,
            "the fill did not reach QEMU's memory",
        )
        self.assertTrue(run.partial.met, run.partial)
        self.assertEqual(virtio_mem.agent_field(run.verified, "bad_words"), 0, run.verified)
        # Everything asked for while the fill is held: a clear state within
        # the window, never a hang.  The request stays unmet with the
        # holder's memory intact, or the guest's OOM killer ends the holder
        # (measured here under TCG: the driver migrates what fits into the
        # base memory, then the OOM killer ends the agent) and it is met.
        self.log.info("request 0 while %d MiB are held: %s", virtio_mem.FILL_MIB, run.unmet)
        self.assertTrue(run.answered, "the guest stopped answering")
        if run.unmet.met:
            self.assertTrue(run.killed, f"virtio-mem unplugged memory the guest still holds: {run.unmet}")
        else:
            self.assertGreater(run.unmet.size_bytes, 0)
        if not run.killed:
            self.assertEqual(run.holder_status, 0, "the holder failed")
        self.log.info("unmeetable request ended: %s", run.killed[0] if run.killed else "unmet, the holder alive")
        self.assertTrue(run.emptied.met, run.emptied)
        self.assertEqual(run.total_emptied_kib, run.base_kib)
        self.log.info(
            "QEMU RSS: %d MiB before, %d filled, %d with %d MiB plugged, %d after unplug (%.1f s)",
            run.rss_before_kib >> 10,
            run.rss_filled_kib >> 10,
            run.rss_held_kib >> 10,
            run.still_plugged_bytes >> 20,
            run.rss_after_kib >> 10,
            run.rss_waited_s,
        )
        self.assertTrue(
            run.rss_returned,
            f"unplugging {run.still_plugged_bytes >> 20} MiB gave QEMU's RSS back only "
            f"{(run.rss_held_kib - run.rss_after_kib) >> 10} MiB",
        )

    def test_resize_timing(self) -> None:
        """Growing and shrinking, host- and guest-timed, beside a balloon
        inflate of the same size in the same guest.  Full profile only: two
        cycles in one guest decide nothing, and CI's time goes to the tests
        that assert.

        :avocado: tags=slow
        """
        steps = virtio_mem.RESIZE.sizes_for()
        device = virtio_mem.VirtioMemDevice(size_mib=max(steps.sizes_mib))
        vm, agent = self.boot_vmem(device)
        ctl = BalloonController(vm, device_id="balloon0")
        base_kib = virtio_mem.mem_total_kib(vm.ssh)
        ram = ctl.ram_bytes()
        # On a host under test the guest times everything on L1's clock
        # and nothing is polled while it moves: a poll is work of L1 on
        # that clock (and, on QEMUs without the re-delivery fix, what
        # stopped a guest in its first grow here).
        on_l1 = self.host_under_test() is not None
        deadline_s = virtio_mem.RESIZE_DEADLINE_S * (nested.BOOT_TIMEOUT_FACTOR if on_l1 else 1)
        balloon_agent = vm.deploy(BALLOON_AGENT) if on_l1 else ""

        # On L1 the guest times the inflate and the host waits on QEMU's
        # events; here the host's polls time it.
        mover = BalloonMover(ctl, vm.ssh if on_l1 else None, balloon_agent, deadline_s=deadline_s, by_events=on_l1)

        def inflate(size_bytes: int) -> float:
            # 2 s without a change is a stall: BalloonController.reach's own
            # rule (the guest inflates far above its floor).
            inflated = mover.move(ram - size_bytes, stall_s=2.0)
            self.assertTrue(inflated.host.reached, inflated)
            seconds = inflated.guest.seconds if inflated.guest is not None else inflated.host.seconds
            back = mover.move(ram, tracked=False)
            self.assertTrue(back.host.reached, back)
            return seconds

        try:
            timings = virtio_mem.time_resizes(
                lambda target: virtio_mem.guest_timed(vm, agent, device, target, base_kib, on_l1, deadline_s),
                inflate,
                steps.sizes_mib,
                steps.repeats,
                host_timed=not on_l1,
            )
        except virtio_mem.ResizeFailed as exc:
            self.fail(str(exc))
        settings: dict[str, object] = {"timed_by": "the guest, on L1's clock; no polls while it moves"} if on_l1 else {}
        for timing in timings:
            self.log.info(
                "%d MiB: %s; shrink / balloon inflate (medians) %.2f",
                timing.size_mib,
                timing.figures,
                timing.shrink_over_inflate,
            )
            for measurement in timing.records(BASE_MIB, device.block_mib, settings):
                self.record(measurement)

    def test_dynamic_memslots(self) -> None:
        """The memslots the device's memory occupies as blocks are plugged
        and unplugged (dynamic-memslots=on), fed to the reference models."""
        # Asked of the binary that will run (a QEMU without the property
        # would refuse the command line), not assumed from its version.
        properties = qemu_binary.device_properties(qemu_binary.current(), virtio_mem.DEVICE)
        self.require(bool(properties), f"QEMU {qemu_version()} has no {virtio_mem.DEVICE} device")
        self.require(
            virtio_mem.DYNAMIC_MEMSLOTS in properties,
            f"QEMU {qemu_version()}'s {virtio_mem.DEVICE} has no {virtio_mem.DYNAMIC_MEMSLOTS} property "
            "(QEMU 8.2 added it)",
        )
        sized = virtio_mem.MEMSLOTS.sizes_for()
        device = virtio_mem.VirtioMemDevice(
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
        with self.scenario():
            plugged = virtio_mem.plug_states(vm, device, sized.dyn_steps_mib)
        for index, step in enumerate(plugged):
            layout = layout_from_flatview(step.ranges, name=f"virtio-mem-{step.size_mib}M")
            table = model_table(layout, "miss", lookups=2000)
            states.append(virtio_layouts.state_record(index, step.size_mib, step.ranges, device.memdev, state_settings))
            counts.append(len(step.device_slots))
            steps.append(
                {
                    "plugged_mib": step.size_mib,
                    "device_memslots": len(step.device_slots),
                    "guest_memslots": len(layout.slots),
                    # Nodes a miss examines in each reference structure (the
                    # 2011 array, the 2011 tree, today's rbtree) at this count.
                    "miss_mean_nodes": {name: st.mean_nodes for name, st in table.structures.items()},
                }
            )
            self.log.info("plugged %d MiB: %d device memslots, %d in all", step.size_mib, counts[-1], len(layout.slots))
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
        with self.scenario():
            (large,) = virtio_mem.plug_states(vm, device, (sized.dyn_large_mib,))
        states.append(
            virtio_layouts.state_record(len(states), sized.dyn_large_mib, large.ranges, device.memdev, state_settings)
        )
        self.log.info(
            "plugged %d MiB in %.1f s: %d device memslots, %d in all",
            sized.dyn_large_mib,
            large.resized.seconds,
            len(large.device_slots),
            int(states[-1].samples[0]),
        )
        self.assertGreater(len(large.device_slots), max(counts), "the whole device mapped no more")
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
            with kvm_api.Kvm() as kvm:
                nr = kvm.check_extension(uapi.KVM_CAP_NR_MEMSLOTS)
                ioeventfd = kvm.check_extension(uapi.KVM_CAP_IOEVENTFD)
        except kvm_api.KvmUnavailable as exc:
            self.skip_because(f"layouts recorded; no /dev/kvm lookup at their slot counts: {exc}")
            return []
        self.require(bool(ioeventfd), "layouts recorded; /dev/kvm has no KVM_CAP_IOEVENTFD: misses would exit")
        self.require(max(counts) <= nr, f"layouts recorded; /dev/kvm offers {nr} memslots, fewer than {max(counts)}")
        config = kvm_lookup.LookupConfig(
            slots=counts, replicates=max(KVM_LOOKUP.sizes_for().replicates, 3), rounds=21, iterations=600
        )
        result = kvm_lookup.run_lookup(config, progress=self.log.info)
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

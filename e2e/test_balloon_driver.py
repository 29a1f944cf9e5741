"""Seed 003 on a real driver: virtio_balloon_mq, the guest kernel's own
virtio_balloon with a settable number of PFNs per request, in fresh guests.

The procedure is host/balloon/request_size.py's.  Asserted (directions that
can fail): every move reaches its target and the driver counted exactly
those pages; a larger request size sends fewer requests; sizes the driver
refuses fail at load; the stock driver is back afterwards and works.
docs/balloon.md, "e2e/test_balloon_driver.py"."""

from __future__ import annotations

import time

from memqual.e2e.base import GuestTest, profile
from memqual.host.balloon import request_size as rs
from memqual.host.balloon.device import BalloonController
from memqual.host.balloon.driver import PFNS_MAX, VariantDriver
from memqual.host.balloon.host_share import QemuThreads
from memqual.host.balloon.table import REQUEST_SIZE
from memqual.host.balloon.timed_move import BalloonMover
from memqual.host.core import nested
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import BalloonDevice, MachineConfig
from memqual.host.ksm import l1_ksm
from memqual.images import balloon_driver
from memqual.images.balloon_driver import Variant

MIB = 1 << 20
GUEST_MIB = 1024
TARGET_MIB = 256  # the guest keeps this: 768 MiB inflated, 75 % of it
MARGIN_MIB = 64  # MemAvailable must exceed the inflate by this (as e2e/test_balloon.py)
MACHINE = "pc"
# What the scenario records, per size and for the fit (memqual bisect
# --metric reads the names here).
SIZE_METRICS = rs.SIZE_METRICS + rs.HOST_METRICS
FIT_METRICS = tuple(metric for metric, *_ in rs.FIT_RECORDS)


class BalloonDriver(GuestTest):
    """
    :avocado: enable
    :avocado: tags=balloon-driver,balloon
    """

    # A host under test runs the guest under its KVM inside TCG.
    timeout = 900 * (nested.BOOT_TIMEOUT_FACTOR if nested.from_environment() is not None else 1)

    def variant(self) -> Variant:
        try:
            return balloon_driver.for_image(self.image())
        except CapabilityMissing as exc:
            self.skip_because(str(exc))
            raise  # skip_because ends the test

    def test_request_size(self) -> None:
        """Plan the sizes per fresh guest, measure each inflate, record the
        run (host/balloon/request_size.py holds the plumbing).

        :avocado: tags=ab
        """
        started = time.monotonic()
        variant = self.variant()
        row = REQUEST_SIZE.sizes_for()
        guests = row.guests
        request_sizes = rs.request_sizes(GUEST_MIB, row.curve)
        inflate_bytes = (GUEST_MIB - TARGET_MIB) * MIB
        run = rs.RequestSizeRun(request_sizes, inflate_bytes)
        probe_line, taint = "", 0
        for g in range(guests):
            vm = self.boot(MachineConfig(memory_mib=GUEST_MIB, machine=MACHINE, balloon=BalloonDevice()))
            ctl = BalloonController(vm, device_id="balloon0")
            host = self.guest_qemu_threads(vm)
            # On a host under test the move waits on QEMU's events: a poll
            # would be QEMU work in the threads the host's share reads.
            mover = BalloonMover(ctl, by_events=host is not None)
            ram = ctl.ram_bytes()
            available = int(vm.ssh.run(["sh", "-c", "grep MemAvailable /proc/meminfo"]).stdout.split()[1]) * 1024
            self.assertGreaterEqual(
                available - MARGIN_MIB * MIB,
                inflate_bytes,
                f"guest {g}: MemAvailable {available >> 20} MiB cannot spare "
                f"{inflate_bytes >> 20} MiB + {MARGIN_MIB} MiB",
            )
            if host is not None:
                self.warm_up(mover, ram, inflate_bytes)
            driver = VariantDriver(vm, ctl, variant.ko)
            driver.deploy()
            if g == 0:
                for bad in (0, PFNS_MAX + 1):
                    with self.assertRaises(BadInput) as refused:
                        driver.load(bad)
                    self.assertIn("refused", str(refused.exception))
            samples = []
            # The order rotates between guests, and between blocks in an A/B.
            for label, size in rs.guest_plan(list(request_sizes), self.first_unit() + g, inflate_bytes):
                sample = rs.measure_inflate(vm, mover, driver, g, label, request_sizes[label], size, host)
                probe_line = sample.probe_line or probe_line
                taint = driver.taint or taint
                self.check_sample(sample, ram)
                samples.append(sample)
            run.add_guest(samples)
            driver.restore_stock()
            self.assertEqual(ctl.actual(), ram, "the balloon is not back at 0 after the stock driver returned")
            self.assertEqual(vm.ssh.run(["true"]).status, 0)
            vm.shutdown()
        # Direction: a larger request sends fewer requests, both ways, in
        # every guest (the sizes are in increasing order).
        for g in range(guests):
            for direction in ("inflate", "deflate"):
                counts = list(run.requests(g, direction).values())
                self.assertEqual(
                    counts, sorted(counts, reverse=True), f"guest {g}: {direction} requests by size {counts}"
                )
                self.assertLess(counts[-1], counts[0], f"guest {g}: {direction} requests by size {counts}")

        settings = {"guest_mib": GUEST_MIB, "target_mib": TARGET_MIB, "machine": MACHINE, "profile": profile()}
        fits = run.fits()
        records = run.records(settings, variant.to_json(), probe_line, taint, fits)
        self.assertEqual(
            [m.metric for m in records], [*rs.size_metrics(host is not None) * len(request_sizes), *FIT_METRICS]
        )
        if run.on_host:
            self.check_host_share(run)
        for measurement in records:
            self.record(measurement)
        for label in request_sizes:
            runs = run.runs(label)
            self.log.info(
                "%s (%d PFNs): inflate %s s, deflate %s s, QEMU CPU %s s, requests %s",
                label,
                request_sizes[label],
                [round(r["seconds"], 3) for r in runs],
                [round(r["deflate_s"], 3) for r in runs],
                [round(r["qemu_cpu_s"], 3) for r in runs],
                [r["requests"] for r in runs],
            )
        self.log.info(
            "fit: %s; host wait fit: %s; QEMU CPU fit: %s; deflate fit: %s (%.0f s)",
            fits.inflate,
            fits.host_wait,
            fits.qemu_cpu,
            fits.deflate,
            time.monotonic() - started,
        )

    def guest_qemu_threads(self, vm: Machine) -> QemuThreads | None:
        """Under a host under test, its one guest QEMU's threads in L1."""
        if self.host_under_test() is None:
            return None
        qemus = l1_ksm.find(vm.host_ssh, "qemu-system")
        if len(qemus) != 1:
            self.fail(f"the host under test runs {len(qemus)} guest QEMUs ({qemus}), not one")
        vcpus = frozenset(int(cpu["thread-id"]) for cpu in vm.qmp("query-cpus-fast"))
        return QemuThreads(vm.host_ssh, qemus[0], vcpus)

    def warm_up(self, mover: BalloonMover, ram: int, inflate_bytes: int) -> None:
        """One untimed inflate and deflate with the stock driver.  L1 backs
        a fresh guest's memory with huge pages, and the first inflate's
        madvise splits them: from then on every inflate faults and discards
        4 KiB pages.  A fresh guest's first inflate took half the L1 time of
        the later ones (1.5 against 3.0 s), so without this the size that
        came first in a guest's rotation looked twice as fast."""
        self.assertTrue(mover.move(ram - inflate_bytes).reached, "the warm-up inflate stopped short")
        self.assertTrue(mover.move(ram).reached, "the warm-up deflate did not return to guest RAM")

    def check_host_share(self, run: rs.RequestSizeRun) -> None:
        """On L1's one CPU the host's work fits inside the driver's span and
        is part of it: every inflate's host share lies in (0, 100) %, and
        the guest's QEMU ran the guest for some of the span."""
        for label in run.sizes:
            for r in run.runs(label):
                share = r["host_breakdown_pct"]["host_pct"]
                self.assertTrue(0.0 < share < 100.0, f"{label}, guest {r['guest']}: host share {share:.1f} %")
                self.assertGreater(r["host_work_s"]["guest_s"], 0.0, f"{label}: the guest never ran")
            self.log.info("%s: host breakdown %s", label, run.runs(label)[0]["host_breakdown_pct"])

    def check_sample(self, sample: rs.Sample, ram: int) -> None:
        """Every inflate reaches its target per QMP, the driver counted
        exactly those pages, and the deflate gives them back."""
        label, size = sample.label, sample.size_bytes
        self.assertTrue(sample.up.reached, f"{label}: inflate stopped at {sample.up.actual_bytes} of {ram - size}")
        assert sample.inflate is not None
        self.assertEqual(sample.inflate.pfns, sample.pages, f"{label}: driver counted other pages than QMP moved")
        self.assertTrue(
            sample.down is not None and sample.down.reached, f"{label}: deflate did not return to guest RAM"
        )

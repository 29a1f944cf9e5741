"""A QEMU built from Debian's source with memqual's fix for TCG's
re-delivery of injected interrupts (memqual qemu build,
images/qemu_build.py) runs a host under test whose guest has both of
memqual's guards against the bug taken off, through the balloon moves
that deadlock such a guest on the system QEMU (docs/host-under-test.md,
"The fix, built and shown").  Slow: a first build takes about two
minutes of two cores, and the toolchain is not ./setup's."""

from __future__ import annotations

import os

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host.balloon.device import BalloonController
from memqual.host.core import nested, settings
from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.kernelspec import KernelSpec
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.qemu import BalloonDevice, MachineConfig

FIX = REPO_ROOT / "docs" / "patches" / "qemu-0001-target-i386-svm-deliver-injected-interrupt-once.patch"
MIB = 1 << 20
ROUNDS = 3
INFLATE_MIB = 768
MOVE_DEADLINE_S = 120.0  # a move takes about 30 s of wall time at shift 2 here


class QemuFromSource(GuestTest):
    """
    :avocado: enable
    :avocado: tags=slow,qemu-build,host-under-test
    """

    @measures_nothing
    def test_the_fix_keeps_an_unguarded_guest_running(self) -> None:
        from memqual.images.qemu_build import build, check_toolchain

        try:
            check_toolchain()
        except CapabilityMissing as exc:
            self.skip_because(str(exc))
        built = build(None, [FIX], say=self.log.info)
        self.assertEqual(
            [p.subject for p in built.patches][-1:],
            ["target/i386: do not deliver an injected interrupt twice on VMRUN"],
        )
        # this test's process runs the build: the outer QEMU and, copied into L1, the guest's
        os.environ[settings.QEMU] = str(built.binary)
        # paravirtual EOI on and L1 at icount:2: both guards off
        host = nested.HostUnderTest(KernelSpec(self.image().release), guest_cpu="host", max_shift=2)
        config = MachineConfig(memory_mib=1024, machine="pc", balloon=BalloonDevice(), clock="icount:2", warm=False)
        vm = self.boot(config, boot_timeout=300.0, host=host)
        ctl = BalloonController(vm, device_id="balloon0")
        ram = ctl.ram_bytes()
        for round_ in range(ROUNDS):
            inflate = ctl.reach(ram - INFLATE_MIB * MIB, deadline_s=MOVE_DEADLINE_S, stall_s=30.0)
            deflate = ctl.reach(ram, deadline_s=MOVE_DEADLINE_S, stall_s=30.0)
            self.assertTrue(inflate.reached and deflate.reached, f"round {round_ + 1}: {inflate} / {deflate}")
            self.assertEqual(vm.ssh.run(["true"], timeout=60).status, 0)
            self.log.info(
                "round %d: inflate %.2f s, deflate %.2f s (wall)", round_ + 1, inflate.seconds, deflate.seconds
            )

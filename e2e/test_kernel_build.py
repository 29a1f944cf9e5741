"""A guest kernel built from Debian's source with memqual's guest config
(memqual kernel build, images/kernel_build.py) boots the image and has
what the scenarios need, the balloon driver variant built beside it
included.  Slow: a first build takes tens of minutes on two
shared cores (docs/patch-qualification.md); a cached one is found at once."""

from __future__ import annotations

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host.balloon.device import BalloonController
from memqual.host.balloon.driver import VariantDriver
from memqual.host.core.errors import CapabilityMissing
from memqual.host.core.qemu import BalloonDevice, MachineConfig

VIRTIO_BALLOON_F_REPORTING = 5  # include/uapi/linux/virtio_balloon.h


class KernelFromSource(GuestTest):
    """
    :avocado: enable
    :avocado: tags=slow,kernel-build
    """

    @measures_nothing
    def test_debian_source_with_the_guest_config_boots(self) -> None:
        from memqual.images import build as image_build
        from memqual.images.kernel_build import build, check_toolchain

        try:
            check_toolchain()
        except CapabilityMissing as exc:
            self.skip_because(str(exc))
        kernel = build("debian:6.1", say=self.log.info)
        self.assertEqual(kernel.config_unmet, (), "the guest config asks for what olddefconfig dropped")
        self._image = image_build.build(image_build.KernelSource(kernel.bzimage, kernel.modules))
        config = MachineConfig(
            memory_mib=768, cpus=2, machine="pc", warm=False, balloon=BalloonDevice(free_page_reporting=True)
        )
        vm = self.boot(config, boot_timeout=600.0)
        self.assertEqual(vm.ssh.run(["uname", "-r"]).stdout.strip(), kernel.release)
        for driver in ("virtio_net", "virtio_balloon"):
            bound = vm.ssh.run(["ls", f"/sys/bus/virtio/drivers/{driver}"]).stdout.split()
            self.assertTrue(any(name.startswith("virtio") for name in bound), f"no device bound to {driver}: {bound}")
        # virtio_balloon is a module of this kernel (from its modules tree),
        # and free page reporting (feature bit 5) was negotiated with the device
        self.assertIn("virtio_balloon", vm.ssh.run(["cat", "/proc/modules"]).stdout)
        listing = vm.ssh.run(["ls", "/sys/bus/virtio/drivers/virtio_balloon"]).stdout.split()
        device = next(name for name in listing if name.startswith("virtio"))
        features = vm.ssh.run(["cat", f"/sys/bus/virtio/drivers/virtio_balloon/{device}/features"]).stdout.strip()
        self.assertEqual(features[VIRTIO_BALLOON_F_REPORTING : VIRTIO_BALLOON_F_REPORTING + 1], "1", features)
        self.assertIn("[always]", vm.ssh.run(["cat", "/sys/kernel/mm/transparent_hugepage/enabled"]).stdout)
        self.assertIn(vm.ssh.run(["cat", "/sys/kernel/mm/ksm/run"]).stdout.strip(), ("0", "1", "2"))
        # the balloon driver variant built from the same tree loads in its
        # place, drives the balloon (load checks it through QMP) and gives
        # the stock driver back
        self.assertIsNotNone(kernel.balloon_variant, kernel.balloon_variant_unavailable)
        assert kernel.balloon_variant is not None
        variant = VariantDriver(vm, BalloonController(vm, device_id="balloon0"), kernel.balloon_variant)
        variant.deploy()
        variant.load(1024)
        self.assertEqual(variant.loaded, 1024)
        variant.restore_stock()

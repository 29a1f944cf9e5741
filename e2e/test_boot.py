"""Foundation: a guest built from packages boots, answers SSH, has the
memory, CPUs and drivers it was given."""

from __future__ import annotations

import time

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host.machine import MachineConfig

CLOCK_WINDOW_S = 3  # guest-side seconds the clock-rate check spans


class Boot(GuestTest):
    """
    :avocado: enable
    :avocado: tags=boot
    """

    @measures_nothing
    def test_ssh_echo_memory_cpus_drivers(self) -> None:
        # Cold on purpose: this test is about booting.
        config = MachineConfig(memory_mib=768, cpus=2, warm=False)
        vm = self.boot(config)

        token = f"memqual-echo-{vm.ssh_port}"
        self.assertEqual(vm.ssh.run(["echo", token]).stdout.strip(), token)

        meminfo = vm.ssh.run(["cat", "/proc/meminfo"]).stdout
        mem_total_kib = int(meminfo.split("MemTotal:")[1].split()[0])
        # The kernel keeps some memory for itself: MemTotal is a little below
        # what QEMU gives, never above.
        self.assertLessEqual(mem_total_kib, config.memory_mib * 1024)
        self.assertGreaterEqual(mem_total_kib, 0.9 * config.memory_mib * 1024)

        online = vm.ssh.run(["cat", "/sys/devices/system/cpu/online"]).stdout.strip()
        self.assertEqual(online, "0-1" if config.cpus == 2 else f"0-{config.cpus - 1}")

        for driver in ("virtio_net", "virtio_balloon"):
            bound = vm.ssh.run(["ls", f"/sys/bus/virtio/drivers/{driver}"]).stdout.split()
            self.assertTrue(any(name.startswith("virtio") for name in bound), f"no device bound to {driver}: {bound}")

    @measures_nothing
    def test_guest_kernel_is_the_image_kernel(self) -> None:
        """The guest runs the image's kernel.  Tag fleet: one of the cheap
        scenarios e2e/test_hosts.py runs on every lab host.

        :avocado: tags=fleet
        """
        vm = self.boot(MachineConfig(memory_mib=512, cpus=1))
        self.assertEqual(vm.ssh.run(["uname", "-r"]).stdout.strip(), self.image().release)

    def test_guest_clock_runs_at_the_hosts_rate(self) -> None:
        """Guest-side timings (the balloon tracker, the agents' timestamps)
        are only as good as the guest's clock.  Under TCG the guest counts
        the host's TSC at the frequency memqual tells it (tsc_early_khz);
        a wrong figure makes guest seconds longer or shorter than host
        seconds.  The guest sleeps CLOCK_WINDOW_S by its own clock between
        two readings of its uptime; the host times the whole command."""
        vm = self.boot(MachineConfig(memory_mib=512, cpus=2))
        script = 'cut -d" " -f1 /proc/uptime; sleep "$1"; cut -d" " -f1 /proc/uptime'
        start = time.monotonic()
        out = vm.ssh.run(["sh", "-c", script, "clock", str(CLOCK_WINDOW_S)], timeout=60).stdout.split()
        host_s = time.monotonic() - start
        guest_s = float(out[1]) - float(out[0])
        # host_s = guest_s x (host seconds per guest second) + one SSH round
        # trip and two execs: the ratio may fall below 1 by that overhead
        # (tens of ms here), never rise above it by more than /proc/uptime's
        # 10 ms resolution.
        ratio = guest_s / host_s
        self.log.info("guest clock: %.3f guest s in %.3f host s (ratio %.4f)", guest_s, host_s, ratio)
        self.assertLessEqual(ratio, 1.01, f"the guest's clock runs fast: {guest_s:.3f} s in {host_s:.3f} host s")
        self.assertGreaterEqual(ratio, 0.85, f"the guest's clock runs slow: {guest_s:.3f} s in {host_s:.3f} host s")

    @measures_nothing
    def test_pc_machine_with_pci_devices(self) -> None:
        """The pc machine (needed for memory hotplug) boots too and its
        virtio devices sit on PCI."""
        vm = self.boot(MachineConfig(machine="pc", memory_mib=512, cpus=1))
        devices = vm.ssh.run(["cat", "/proc/bus/pci/devices"]).stdout
        virtio_functions = [line for line in devices.splitlines() if line.split()[1].startswith("1af4")]
        self.assertGreaterEqual(len(virtio_functions), 2, devices)


class Panic(GuestTest):
    """
    :avocado: enable
    :avocado: tags=boot
    """

    @measures_nothing
    def test_guest_panic_ends_qemu_at_once(self) -> None:
        """panic=-1 with -no-reboot: a guest panic ends QEMU instead of
        leaving a hung guest for the test's timeout to find."""
        vm = self.boot(MachineConfig(memory_mib=512, cpus=1))
        # The SSH session dies with the guest; do not wait for its status.
        vm.ssh.start(["sh", "-c", "echo c > /proc/sysrq-trigger"])
        panic = vm.console_expect(r"Kernel panic[^\r\n]*", timeout=60)
        self.assertIn("sysrq", panic.lower() + vm.console_log.read_text(errors="replace").lower())
        self.assertEqual(vm.wait_exit(timeout=30), 0, "QEMU should exit (status 0 under -no-reboot) on a guest panic")

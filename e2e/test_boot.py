"""Foundation: a guest built from packages boots, answers SSH, has the
memory, CPUs and drivers it was given."""

from __future__ import annotations

import time

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host.core import clock
from memqual.host.core.qemu import MachineConfig

CLOCK_WINDOW_S = 3  # host seconds between the clock-rate check's two readings
UPTIME_STEP_S = 0.01  # /proc/uptime's resolution


class Boot(GuestTest):
    """
    :avocado: enable
    :avocado: tags=boot,kernel-checks
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
        seconds.  The host reads the guest's uptime twice, CLOCK_WINDOW_S
        apart, each reading bracketed by the host's clock around its SSH
        command: the guest's rate lies between the rates over the outer and
        the inner brackets, however long a busy host makes the commands."""
        self.require(
            not clock.current().icount,
            f"the guest's clock is QEMU's instruction counter ({clock.current().label}): by design it does not "
            "follow the host's (e2e/test_icount.py checks it instead)",
        )
        vm = self.boot(MachineConfig(memory_mib=512, cpus=2))

        def uptime() -> tuple[float, float, float]:
            before = time.monotonic()
            guest = float(vm.ssh.run(["cut", "-d", " ", "-f1", "/proc/uptime"], timeout=60).stdout)
            return before, guest, time.monotonic()

        a1, g1, b1 = uptime()
        # the measurement window itself, not a wait for an event
        time.sleep(CLOCK_WINDOW_S)
        a2, g2, b2 = uptime()
        guest_s = g2 - g1
        # /proc/uptime counts in 10 ms steps: each reading is up to 10 ms short.
        slowest = (guest_s - UPTIME_STEP_S) / (b2 - a1)
        fastest = (guest_s + UPTIME_STEP_S) / (a2 - b1)
        self.log.info(
            "guest clock: %.3f guest s in %.3f-%.3f host s (rate %.4f-%.4f)",
            guest_s,
            a2 - b1,
            b2 - a1,
            slowest,
            fastest,
        )
        self.assertLessEqual(slowest, 1.01, f"the guest's clock runs fast: {slowest:.4f} guest s a host s or more")
        self.assertGreaterEqual(fastest, 0.99, f"the guest's clock runs slow: {fastest:.4f} guest s a host s or less")

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
    :avocado: tags=boot,kernel-checks
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

"""Warm starts: a guest restored from a saved snapshot is a
working guest — clock, SSH, agents, balloon — and a broken snapshot is
replaced by a cold boot, never used."""

from __future__ import annotations

import time

from memqual.e2e.base import GuestTest, measures_nothing
from memqual.host.core import nested, snapshot
from memqual.host.core.kernelspec import KernelSpec
from memqual.host.core.machine import Machine
from memqual.host.core.polling import poll
from memqual.host.core.qemu import MachineConfig

MIB = 1 << 20


class WarmStart(GuestTest):
    """
    :avocado: enable
    :avocado: tags=boot,warm
    """

    def _warm_guest(self, config: MachineConfig, host: nested.HostUnderTest | None = None) -> Machine:
        """A guest of ``config`` (on ``host``) that was certainly restored:
        the first boot may have been the one that saved the snapshot.  Sets
        ``restore_wall_s``: the host's wall time before the restore began."""
        self.restore_wall_s = time.time()
        vm = self.boot(config, host=host)
        if not vm.started_warm:
            vm.shutdown()
            self.restore_wall_s = time.time()
            vm = self.boot(config, host=host)
        self.assertTrue(vm.started_warm, "the second start of one configuration must restore its snapshot")
        return vm

    @measures_nothing
    def test_a_restored_host_under_test_answers_through_its_forwards(self) -> None:
        """L1 restored with its guest: the guest answers SSH and its
        monitor through L1's forwards, under L1's KVM, and L1 its own SSH.
        Two starts of L1 (the first may save): the full profile's.

        :avocado: tags=slow,nested
        """
        host = nested.HostUnderTest(KernelSpec(self.image().release))
        vm = self._warm_guest(MachineConfig(memory_mib=512, cpus=1, clock="wall"), host)
        self.log.info("warm start of L1 and its guest to SSH in %.3f s", vm.boot_to_ssh_s)
        self.assertIn("in TCG+SVM", vm.host_label)
        dmesg = vm.ssh.run(["dmesg"], timeout=60).stdout
        self.assertIn("Hypervisor detected: KVM", dmesg, "the restored guest does not run under L1's KVM")
        self.assertEqual(vm.qmp("query-status")["status"], "running", "the restored guest's QEMU was not continued")
        uptime = vm.host_ssh.run(["cat", "/proc/uptime"], timeout=60).stdout
        self.assertRegex(uptime, r"^\d+\.\d+ ", "L1 does not answer its own SSH after the restore")

    @measures_nothing
    def test_restored_guest_clock_agents_balloon(self) -> None:
        config = MachineConfig(memory_mib=768, cpus=2)
        vm = self._warm_guest(config)
        self.log.info("warm start to SSH in %.3f s", vm.boot_to_ssh_s)

        # The snapshot's clock stood at the time of the save: it was set,
        # to the host's time between the start of the restore and SSH (to
        # the second, and as late as a busy host makes SSH come): so now
        # it reads between the restore's start and the end of this command.
        # Not a bound on the difference, which a slow SSH stretches.
        restored_at = self.restore_wall_s
        guest_now = int(vm.ssh.run(["date", "+%s"]).stdout)
        read_by = time.time()
        self.log.info("guest clock %d, restore started %.1f, read by %.1f", guest_now, restored_at, read_by)
        self.assertGreaterEqual(guest_now, int(restored_at) - 1, "guest wall clock not set after restore")
        self.assertLessEqual(guest_now, read_by + 1, "guest wall clock ahead of the host's after restore")

        # An agent is streamed in and runs.
        agent = vm.deploy("balloon_agent")
        stat = vm.ssh.run([agent, "stat"]).stdout
        self.assertIn("mem_total_kib=", stat)

        # The balloon device works after the restore: inflate by 128 MiB.
        target = (config.memory_mib - 128) * MIB
        vm.qmp("balloon", value=target)
        # 10 ms: the poll period of query-balloon
        reached = poll(
            lambda: vm.qmp("query-balloon")["actual"] == target, 60, 0.01, what="the target", raise_on_timeout=False
        ).met
        self.assertTrue(reached, "balloon did not reach its target after a restore")
        vm.qmp("balloon", value=config.memory_mib * MIB)

    @measures_nothing
    def test_truncated_snapshot_falls_back_to_cold_and_is_replaced(self) -> None:
        # A configuration of its own, so no other test's snapshot is touched.
        config = MachineConfig(memory_mib=640, cpus=1, cmdline_extra="memqual.test=truncate")
        vm = self._warm_guest(config)
        state = snapshot.snapshot_dir(vm) / "state"
        vm.shutdown()

        full = state.stat().st_size
        with open(state, "r+b") as handle:
            handle.truncate(full // 2)

        vm = self.boot(config)
        self.assertFalse(vm.started_warm, "a truncated snapshot must not be restored")
        self.assertEqual(vm.ssh.run(["echo", "cold"]).stdout.strip(), "cold")
        vm.shutdown()
        self.assertGreater(state.stat().st_size, full // 2, "the truncated snapshot was not replaced")

        vm = self.boot(config)
        self.assertTrue(vm.started_warm, "the replaced snapshot does not restore")

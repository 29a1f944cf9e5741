"""Memory slots against the real /dev/kvm: no guest OS, a few bytes of
hand-assembled protected-mode code.

Run: ``avocado run e2e/test_memslots_kvm.py`` (tags: memslots, kvm).
Records (scenario memslots.kvm) go to each test's output directory.
"""

from __future__ import annotations

import math

from avocado import Test

from host.memslots import kvm as K
from host.memslots import kvm_bench as B

SLOT_COUNTS = (1, 32, 509)


class MemslotsKvm(Test):
    """
    :avocado: enable
    :avocado: tags=memslots,kvm
    """

    def setUp(self) -> None:
        try:
            with K.Kvm() as kvm:
                self.nr_memslots = kvm.check_extension(K.KVM_CAP_NR_MEMSLOTS)
                user_memory = kvm.check_extension(K.KVM_CAP_USER_MEMORY)
        except K.KvmUnavailable as exc:
            self._skip(str(exc))
            return
        if not user_memory or self.nr_memslots < max(SLOT_COUNTS):
            self._skip(f"/dev/kvm offers {self.nr_memslots} user memory slots; these tests need {max(SLOT_COUNTS)}")

    def _skip(self, reason: str) -> None:
        # A missing capability is CANCEL under avocado, never a pass.  (The
        # lead's e2e/base.py adapter will replace this when it exists.)
        self.cancel(reason)

    def _bench(self, slots: tuple[int, ...], repeats: int, vcpu: bool) -> tuple[B.BenchResult, dict]:
        result = B.run_bench(B.BenchConfig(slots=slots, repeats=repeats, vcpu=vcpu), progress=self.log.info)
        doc = B.summarize(result)
        B.write_records(result, self.outputdir)
        self.log.info("summary: %s", {k: v for k, v in doc.items() if k != "runs"})
        for run in doc["runs"]:
            self.log.info("run: %s", {k: v for k, v in run.items() if k != "spread"})
        return result, doc

    def test_errnos_and_slot_operation_times(self) -> None:
        """Invalid regions fail with the errno the kernel documents; setup,
        move and delete of 1, 32, 509 slots take a finite, positive time."""
        _, doc = self._bench(SLOT_COUNTS, repeats=3, vcpu=False)
        self.assertEqual(doc["nr_memslots"], self.nr_memslots)
        self.assertEqual(doc["limit_errno"], "EINVAL")
        self.assertEqual(doc["overlap_errno"], "EEXIST")
        self.assertEqual(doc["misaligned_errno"], "EINVAL")
        for probe in doc["probes"]:
            self.assertEqual(probe["observed"], probe["expected"], probe["description"])
        self.assertEqual([r["slots"] for r in doc["runs"]], list(SLOT_COUNTS))
        for run in doc["runs"]:
            self.assertEqual(run["repeats"], 3)
            for key in ("setup_s_per_slot", "move_s_per_slot", "delete_s_per_slot"):
                value = run[key]
                self.assertTrue(math.isfinite(value) and 0 < value < 0.1, f"{run['slots']} slots: {key} = {value}")

    def test_vcpu_touches_every_slot_and_exits_on_every_gap(self) -> None:
        """The protected-mode guest writes one page in every slot (each write
        lands in that slot's host page, no exit) and one frame after every
        slot (exactly one KVM_EXIT_MMIO each, in order, with its data)."""
        result, doc = self._bench(SLOT_COUNTS, repeats=2, vcpu=True)
        if result.vcpu_error:
            self._skip(f"the flat protected-mode guest cannot run on this KVM: {result.vcpu_error}")
        self.assertTrue(doc["vcpu"]["ran"])
        for run in doc["runs"]:
            n, checks = run["slots"], run["vcpu_checks"]
            self.assertEqual(checks["reported"], [[n, n, n, n]] * 2, f"{n} slots: guest counts")
            self.assertEqual(checks["touched_ok"], [n, n], f"{n} slots: host pages holding the guest's write")
            self.assertEqual(checks["mmio_exits"], [n, n], f"{n} slots: MMIO exits")
            self.assertEqual(checks["mmio_mismatches"], [0, 0], f"{n} slots: MMIO exits at a wrong address or value")
            for key in ("first_touch_us", "warm_touch_us", "mmio_exit_us", "empty_pass_us"):
                self.assertTrue(math.isfinite(run[key]), f"{n} slots: {key} = {run[key]}")
            self.assertGreater(run["empty_pass_us"], 0)
            self.assertEqual(run["model_nodes"], math.ceil(math.log2(n + 1)))

    def test_full_vm_refuses_one_slot_more(self) -> None:
        """A VM holding KVM_CAP_NR_MEMSLOTS slots refuses one more with
        EINVAL; the issue's target: the full set within 10 s."""
        n = self.nr_memslots
        if n > 32764:
            self._skip(f"KVM_CAP_NR_MEMSLOTS is {n}: filling it is beyond this test's time budget")
        result, doc = self._bench((n,), repeats=1, vcpu=False)
        self.assertTrue(doc["limit_tested_on_full_vm"])
        self.assertEqual(doc["limit_errno"], "EINVAL")
        (run,) = doc["runs"]
        self.assertLess(run["setup_s"], 10.0, f"setting {n} slots took {run['setup_s']:.2f} s")

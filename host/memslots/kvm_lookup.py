"""Today's kernel: what one guest memory access costs, by memslot count.

Seed 002's three lookup kinds (a miss, a hit into the RAM slot, a hit into
a small slot) timed through /dev/kvm on the running kernel as the slot
count N grows, one fresh VM per (replicate, N); ``ns_per_doubling`` is each
replicate's slope against log2(N).  The layout, the guest loop and its null
pass, and what the figures mean on a host with or without VMX/SVM:
docs/memslots-kvm.md, "How host/memslots/kvm_lookup.py measures".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from memqual.host.core import kvm as K
from memqual.host.core import kvm_uapi as uapi
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.memslots import kvm_bench as B
from memqual.host.memslots import kvm_guest, structures
from memqual.host.memslots.layout import Layout, Slot

log = logging.getLogger(__name__)

PAGE = K.PAGE_SIZE
SCENARIO = "memslots.kvm_lookup"
KINDS = ("miss", "ram_hit", "small_hit")
NULL_ENTRY = 0x800  # the null loop's copy, in the same code page
REPORT_PORT = kvm_guest.REPORT_PORT
# A slope is "resolved" when its 95 % CI is narrower than this on each side:
# 10 ns per doubling is 150 ns over the 15 doublings to 32764 slots, about
# half the per-access cost measured here; a wider interval cannot tell a
# tree walk's growth from none.
SLOPE_RESOLUTION_NS = 10.0
# A point is "resolved" when its CI half-width is at most this share of its
# value.
POINT_RESOLUTION = 0.25

EMULATED_ITERATION_NS = 1000.0
QUICK_SLOTS = (1, 32, 509, 4096, 32764)
FULL_SLOTS = (1, 2, 8, 32, 128, 509, 2048, 8192, 32764)


def lookup_program(write: bool, unroll: int) -> bytes:
    """The guest loop, flat 32-bit protected mode.  Inputs: ESI = target
    address, ECX = iterations.  Each iteration counts in EBX and does
    ``unroll`` times ``mov [esi], ebx`` (89 1e) or, for the null loop, ``mov
    ebx, ebx`` (89 db: same length, no memory access).  Then it reports the
    count with ``out 0x501, eax`` and halts.

        00 31 db        xor ebx, ebx
        02 85 c9        test ecx, ecx        ; loop
        04 74 XX        je done
        06 43           inc ebx
        07 89 1e ...    unroll x mov [esi], ebx
           49           dec ecx
           eb XX        jmp loop
        done:
           89 d8        mov eax, ebx
           66 ba 01 05  mov dx, 0x501
           ef           out dx, eax
           f4           hlt
           eb fd        jmp hlt
    """
    if not 1 <= unroll <= 50:
        raise BadInput(f"unroll {unroll}: give 1 to 50 writes per iteration")
    body = (b"\x89\x1e" if write else b"\x89\xdb") * unroll
    done = 7 + len(body) + 3  # after inc, the body, dec and the 2-byte jmp
    code = b"\x31\xdb\x85\xc9" + bytes([0x74, done - 6]) + b"\x43" + body + b"\x49"
    code += bytes([0xEB, (2 - (len(code) + 2)) & 0xFF])
    assert len(code) == done
    return code + b"\x89\xd8\x66\xba\x01\x05\xef\xf4\xeb\xfd"


@dataclass(frozen=True)
class LookupConfig:
    slots: tuple[int, ...] = QUICK_SLOTS
    replicates: int = 3  # fresh VMs per N
    rounds: int = 9  # timed rounds per VM (each: null, ram_hit, small_hit, miss)
    iterations: int = 2000  # loop iterations per pass
    unroll: int = 8  # writes per iteration
    ram_mib: int = 1024
    device: str = K.DEVICE
    pass_timeout_s: float = 30.0

    RECORD_SETTINGS: ClassVar[tuple[str, ...]] = ("rounds", "iterations", "unroll", "ram_mib")

    def check(self, nr_memslots: int | None = None) -> None:
        if not self.slots or any(n < 1 for n in self.slots):
            raise BadInput("--slots: give slot counts of 1 or more")
        if self.replicates < 1 or self.rounds < 1 or self.iterations < 1:
            raise BadInput("--replicates, --rounds and --iterations must be 1 or more")
        if self.ram_mib < 1:
            raise BadInput(f"RAM slot of {self.ram_mib} MiB: give at least 1")
        top = max(self.geometry(n).top_gpa for n in self.slots)
        if top > kvm_guest.GPA_CEILING:
            raise BadInput(f"the layout reaches {top:#x}, above 4 GiB: use a smaller RAM slot or fewer slots")
        if nr_memslots is not None and max(self.slots) > nr_memslots:
            raise BadInput(f"--slots {max(self.slots)} exceeds KVM_CAP_NR_MEMSLOTS = {nr_memslots} on this host")
        lookup_program(True, self.unroll)

    def geometry(self, n: int) -> LookupGeometry:
        return LookupGeometry(n, self.ram_mib * 1024 * 1024)

    def settings(self) -> dict[str, Any]:
        """What was set (keys the records): not what was measured."""
        fields = dataclasses.asdict(self)
        return {**{key: fields[key] for key in self.RECORD_SETTINGS}, "clock": "thread_time"}


@dataclass(frozen=True)
class LookupGeometry:
    n: int
    ram_bytes: int

    def small_gpa(self, i: int) -> int:
        return self.ram_bytes + (i - 1) * 2 * PAGE

    @property
    def top_gpa(self) -> int:
        return self.ram_bytes + max(self.n - 1, 1) * 2 * PAGE

    @property
    def host_size(self) -> int:
        return self.ram_bytes + max(self.n - 1, 0) * PAGE

    def small_host_offset(self, i: int) -> int:
        return self.ram_bytes + (i - 1) * PAGE

    @property
    def target_slot(self) -> int:
        return self.n // 2  # the small slot hit (n >= 2)

    def targets(self) -> dict[str, int]:
        out = {"ram_hit": self.ram_bytes // 2}
        if self.n >= 2:
            out["small_hit"] = self.small_gpa(self.target_slot)
            out["miss"] = self.small_gpa(self.target_slot) + PAGE
        else:
            out["miss"] = self.ram_bytes
        return out


@dataclass
class VmSample:
    """One fresh VM: per round, the ns per access of each kind (null
    subtracted), plus the raw pass times for the record."""

    slots: int
    replicate: int
    access_ns: dict[str, list[float]]
    null_ns_per_iteration: list[float]
    raw_ns: dict[str, list[float]]  # per access, null not subtracted
    # miss and small_hit minus the RAM hit of the same round: the RAM hit is
    # served by the last-used-slot cache and walks no tree, so this cancels
    # whatever a VM's moment does to every access alike (load, caches)
    over_ram_ns: dict[str, list[float]]
    wall_over_cpu: float  # wall time / CPU time of the timed passes: how much the thread waited
    setup_s: float
    checks: dict[str, Any]


@dataclass
class LookupResult:
    config: LookupConfig
    nr_memslots: int
    kvm_module: str
    host_kernel: str
    samples: list[VmSample] = field(default_factory=list)
    duration_s: float = 0.0
    model_nodes: dict[int, dict[str, int]] = field(default_factory=dict)

    def vms(self, n: int) -> list[VmSample]:
        return [s for s in self.samples if s.slots == n]


class LookupCheckFailed(AssertionError):
    """The guest did not do what the program must (a miscount, a write in
    the wrong place, an unexpected exit): a failure, never a skip."""


def _pass(vcpu: K.Vcpu, entry: int, target: int, iterations: int, timeout_s: float) -> tuple[float, float]:
    """One pass: (CPU seconds, wall seconds) from the first KVM_RUN to the
    report exit.  Any exit but the report (and EINTR) is a failure."""
    regs = uapi.Regs()
    regs.rip = entry
    regs.rflags = K.RFLAGS_RESERVED
    regs.rsi, regs.rcx = target, iterations
    vcpu.set_regs(regs)
    run = vcpu.run
    try:
        with B.Deadline(timeout_s):
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            while True:
                reason = run()
                if reason == uapi.KVM_EXIT_IO:
                    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
                    break
                if reason != uapi.KVM_EXIT_INTR:
                    raise LookupCheckFailed(f"pass at {target:#x} left the guest with {vcpu.describe_exit()}")
            io = vcpu.io()
            reported = struct.unpack("<I", io.data[:4])[0] if io.size == 4 else -1
            if io.port != REPORT_PORT or reported != iterations:
                raise LookupCheckFailed(
                    f"pass at {target:#x}: report {vcpu.describe_exit()} count {reported}, expected {iterations}"
                )
            while (reason := run()) == uapi.KVM_EXIT_INTR:
                pass
            if reason != uapi.KVM_EXIT_HLT:
                raise LookupCheckFailed(f"guest did not halt after its report: {vcpu.describe_exit()}")
    except B.PassTimeout:
        raise LookupCheckFailed(f"a pass of {iterations} iterations did not end within {timeout_s:g} s") from None
    return cpu, wall


def _read_eventfd(fd: int) -> int:
    try:
        return os.eventfd_read(fd)
    except BlockingIOError:
        return 0


def run_vm(kvm: K.Kvm, n: int, replicate: int, config: LookupConfig) -> VmSample:
    geo = config.geometry(n)
    targets = geo.targets()
    kinds = [k for k in KINDS if k in targets]
    per_access = config.iterations * config.unroll
    with K.GuestMemory(geo.host_size) as mem, kvm.create_vm() as vm:
        mem.write(0, lookup_program(True, config.unroll))
        mem.write(NULL_ENTRY, lookup_program(False, config.unroll))
        started = time.perf_counter()
        vm.set_region(0, 0, geo.ram_bytes, mem.address)
        for i in range(1, n):
            vm.set_region(i, geo.small_gpa(i), PAGE, mem.address + geo.small_host_offset(i))
        setup_s = time.perf_counter() - started
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            vm.add_ioeventfd(targets["miss"], 4, efd)
            vcpu = vm.create_vcpu(0)
            K.enter_flat_protected_mode(vcpu)
            entries = {"null": (NULL_ENTRY, targets["ram_hit"])}
            entries.update({k: (0, targets[k]) for k in kinds})
            order = list(entries)
            # Warm-up: fault in the code and target pages, warm the vCPU.
            for name in order:
                _pass(vcpu, *entries[name], 16, config.pass_timeout_s)
            cpu: dict[str, list[float]] = {name: [] for name in order}
            wall_total = cpu_total = 0.0
            for r in range(config.rounds):
                # Rotate the order every round so drift within a VM falls on
                # every kind alike.
                shift = r % len(order)
                for name in order[shift:] + order[:shift]:
                    c, w = _pass(vcpu, *entries[name], config.iterations, config.pass_timeout_s)
                    cpu[name].append(c)
                    cpu_total += c
                    wall_total += w
            misses = _read_eventfd(efd)
        finally:
            os.close(efd)
        expected_misses = (16 + config.rounds * config.iterations) * config.unroll
        checks = {
            "eventfd_misses": misses,
            "expected_misses": expected_misses,
            "ram_word": struct.unpack("<I", mem.read(targets["ram_hit"], 4))[0],
            "small_word": (
                struct.unpack("<I", mem.read(geo.small_host_offset(geo.target_slot), 4))[0]
                if "small_hit" in targets
                else None
            ),
            "expected_word": config.iterations,
        }
    if misses != expected_misses:
        raise LookupCheckFailed(
            f"{n} slots: the miss target's ioeventfd counted {misses} writes, "
            f"expected {expected_misses}: misses left the kernel or hit a slot"
        )
    if checks["ram_word"] != config.iterations or checks["small_word"] not in (None, config.iterations):
        raise LookupCheckFailed(f"{n} slots: target pages hold {checks}: a write went elsewhere")
    null = cpu["null"]
    access = {k: [(c - z) / per_access * 1e9 for c, z in zip(cpu[k], null, strict=True)] for k in kinds}
    raw = {k: [c / per_access * 1e9 for c in cpu[k]] for k in kinds}
    ram_hit = cpu["ram_hit"]
    over_ram = {
        k: [(c - h) / per_access * 1e9 for c, h in zip(cpu[k], ram_hit, strict=True)] for k in kinds if k != "ram_hit"
    }
    return VmSample(
        slots=n,
        replicate=replicate,
        access_ns=access,
        over_ram_ns=over_ram,
        null_ns_per_iteration=[z / config.iterations * 1e9 for z in null],
        raw_ns=raw,
        wall_over_cpu=wall_total / cpu_total if cpu_total > 0 else math.nan,
        setup_s=setup_s,
        checks=checks,
    )


def _schedule(slots: tuple[int, ...], replicates: int) -> list[tuple[int, int]]:
    """Replicate-major, direction alternating (1 32 509 | 509 32 1 ...)."""
    out: list[tuple[int, int]] = []
    for r in range(replicates):
        order = slots if r % 2 == 0 else tuple(reversed(slots))
        out.extend((r, n) for n in order)
    return out


def model_layout(geo: LookupGeometry) -> Layout:
    """The VM's slots as the model takes them, in the order they are
    registered (slot 0, then 1..N-1)."""
    slots = [Slot(0, 0, geo.ram_bytes // PAGE)]
    slots += [Slot(i, geo.small_gpa(i) // PAGE, 1) for i in range(1, geo.n)]
    return Layout(tuple(slots))


def model_nodes(geo: LookupGeometry, structure: str = "rbtree") -> dict[str, int]:
    """Nodes the reference model's ``structure`` (by default its red-black
    tree, today's gfn tree) compares for each target of this layout, with
    the slots inserted in the order the VM registers them.  Whether the
    kernel's structure has the model's shape is what a kernel that counts
    its search tells (host/memslots/l1_lookup.py)."""
    index = structures.build(structure, model_layout(geo))
    return {k: index.lookup(gpa // PAGE)[1] for k, gpa in geo.targets().items()}


def run_lookup(config: LookupConfig, progress: Callable[[str], None] | None = None) -> LookupResult:
    """Open /dev/kvm, check what the measurement needs before trying it (a
    missing capability is CapabilityMissing, checked first; a failure after
    that is a failure), then one fresh VM per (replicate, N)."""
    started = time.perf_counter()
    with K.Kvm(config.device) as kvm:
        nr = kvm.check_extension(uapi.KVM_CAP_NR_MEMSLOTS)
        if not kvm.check_extension(uapi.KVM_CAP_USER_MEMORY) or nr < 1:
            raise K.KvmUnavailable(f"{config.device} has no user memory slots")
        if not kvm.check_extension(uapi.KVM_CAP_IOEVENTFD):
            raise CapabilityMissing(f"{config.device} has no KVM_CAP_IOEVENTFD: misses would exit to userspace")
        config.check(nr)
        import platform

        result = LookupResult(config=config, nr_memslots=nr, kvm_module=B.kvm_module(), host_kernel=platform.release())
        # One discarded VM first: the first VM of a process pays for cold
        # caches and lazily set-up kernel state.
        run_vm(kvm, min(config.slots), -1, dataclasses.replace(config, rounds=1))
        for r, n in _schedule(config.slots, config.replicates):
            if progress:
                progress(f"replicate {r + 1}/{config.replicates}: {n} slots")
            result.samples.append(run_vm(kvm, n, r, config))
    for n in config.slots:
        result.model_nodes[n] = model_nodes(config.geometry(n))
    result.duration_s = time.perf_counter() - started
    return result

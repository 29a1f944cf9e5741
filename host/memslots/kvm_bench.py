"""Memory-slot measurements against the real kernel through /dev/kvm.

For each slot count N, a fresh VM with N one-page slots: their creation
timed, a vCPU's first and warm touches and MMIO misses, the slot limit, a
move and a delete; a separate VM probes the kernel's errnos.  The steps,
the guest physical layout and the host backing:
docs/memslots-kvm.md, "How host/memslots/kvm_bench.py measures".
"""

from __future__ import annotations

import logging
import platform
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from memqual.host.core import kvm as K
from memqual.host.core import kvm_uapi as uapi
from memqual.host.core.environment import Environment
from memqual.host.core.errors import BadInput, MemqualError
from memqual.host.memslots.kvm_guest import (
    GUEST_CODE,
    GUEST_ENTRY,
    PAGE,
    REPORT_PORT,
    SlotGeometry,
    balanced_tree_nodes,
    model_walk,
)

log = logging.getLogger(__name__)

# What each probe asks for, with the host's KVM_CAP_NR_MEMSLOTS as {nr}.
PROBE_DESCRIPTIONS = {
    "limit": "slot id {nr} (= KVM_CAP_NR_MEMSLOTS)",
    "overlap": "new slot 1 over the second page of slot 0",
    "misaligned_gpa": "guest_phys_addr 0x300800",
    "misaligned_size": "memory_size 0x800",
    "misaligned_hva": "userspace_addr + 0x800",
    "resize": "slot 0 from 2 pages to 1",
}
EXPECTED_ERRNO = {
    "limit": "EINVAL",  # slot id >= KVM_CAP_NR_MEMSLOTS
    "overlap": "EEXIST",
    "misaligned_gpa": "EINVAL",
    "misaligned_size": "EINVAL",
    "misaligned_hva": "EINVAL",
    "resize": "EINVAL",  # an existing slot cannot change size
}


# --- configuration and results ----------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    slots: tuple[int, ...] = (1, 32, 509, 32764)
    repeats: int = 3
    slot_pages: int = 1
    vcpu: bool = True  # run the guest passes (first touch, warm touch, MMIO)
    device: str = K.DEVICE
    pass_timeout_s: float = 60.0  # per guest pass; a stuck guest is an error, not a hang


@dataclass
class Probe:
    """One deliberately invalid KVM_SET_USER_MEMORY_REGION."""

    name: str
    description: str
    expected: str
    observed: str  # errno name, or "accepted" when the kernel took it

    @property
    def ok(self) -> bool:
        return self.observed == self.expected


class GuestPass(NamedTuple):
    seconds: float  # until the report
    reported: int  # accesses the guest counted
    other_exits: int  # exits other than the expected MMIO/IO/HLT (EINTR...)


@dataclass
class VcpuSample:
    empty_pass_s: float  # a pass of 0 accesses: one KVM_RUN entry and the report exit
    first_touch_s: float
    warm_touch_s: float
    same_slot_s: float  # n writes into one page of slot 0
    mmio_s: float
    accesses: int  # slot pages written (== n)
    reported: tuple[int, int, int, int]  # counts the guest reported: first, warm, same-slot, MMIO
    mmio_exits: int
    mmio_mismatches: int  # exits at the wrong address or with the wrong data
    touched_ok: int  # slots whose host page holds exactly the guest's write
    other_exits: int  # exits other than the expected MMIO/IO/HLT (EINTR...)


@dataclass
class RunSample:
    slots: int
    repeat: int
    setup_s: float
    move_s: float
    delete_s: float
    vcpu: VcpuSample | None = None
    limit: Probe | None = None  # only when the VM was full


@dataclass
class BenchResult:
    config: BenchConfig
    api_version: int
    nr_memslots: int
    address_spaces: int
    vcpu_mmap_size: int
    kvm_module: str
    host_kernel: str
    probes: list[Probe]
    samples: list[RunSample] = field(default_factory=list)
    vcpu_error: str | None = None  # why the guest passes did not run, if they did not
    model_walks: dict[int, dict[str, Any]] = field(default_factory=dict)  # per N: model_walk()
    model_source: str = ""
    duration_s: float = 0.0
    # Where it ran when not this machine (the host under test, its clock):
    # the environment its records carry instead of this machine's.
    environment: Environment | None = None


class GuestPassError(MemqualError):
    """The guest did not finish a pass the way the program must: the message
    says which exit came instead.  ``unsupported`` is True when this KVM
    cannot run the guest at all (entry failure, internal error, shutdown):
    a capability, reported and skipped; False when it ran and did something
    wrong (a slot access left KVM, a wrong report, no end by the deadline):
    a failure, never skipped."""

    exit_status = 1

    def __init__(self, message: str, unsupported: bool = False) -> None:
        self.unsupported = unsupported
        super().__init__(message)


# --- environment ------------------------------------------------------------------
def kvm_module() -> str:
    """Which module serves /dev/kvm (kvm_intel, kvm_amd, kvm_pvm...)."""
    found = [m for m in ("kvm_intel", "kvm_amd", "kvm_pvm") if Path("/sys/module", m).exists()]
    return ",".join(found) or "unknown"


# --- a watchdog for KVM_RUN --------------------------------------------------------
class PassTimeout(Exception):
    """A guest pass ran past its Deadline."""


class Deadline:
    """SIGALRM-based deadline around KVM_RUN: the handler raises, which
    aborts the blocking ioctl (EINTR) with an exception.  Signals reach only
    the main thread, so elsewhere this is a no-op (the program is fixed and
    checked by tests, so a hang there would be a kernel bug)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.active = threading.current_thread() is threading.main_thread()
        self._old: Any = None

    def __enter__(self) -> Deadline:
        if self.active:

            def handler(signum: int, frame: Any) -> None:
                raise PassTimeout()

            self._old = signal.signal(signal.SIGALRM, handler)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)


# --- probes -------------------------------------------------------------------------
def make_probe(name: str, nr_memslots: int, observed: str) -> Probe:
    """Probe ``name`` of PROBE_DESCRIPTIONS as the kernel answered it."""
    return Probe(name, PROBE_DESCRIPTIONS[name].format(nr=nr_memslots), EXPECTED_ERRNO[name], observed)


def full_vm_probe(nr_memslots: int, n: int, observed: str) -> Probe:
    """One slot more than a full VM of ``n`` slots holds, as answered."""
    return Probe("limit", f"slot {nr_memslots} added to a VM holding {n} slots", EXPECTED_ERRNO["limit"], observed)


def _attempt(vm: K.Vm, slot: int, gpa: int, size: int, hva: int) -> str:
    try:
        vm.set_region(slot, gpa, size, hva)
    except K.KvmIoctlError as exc:
        return exc.errno_name
    return "accepted"


def probe_errors(kvm: K.Kvm, nr_memslots: int) -> list[Probe]:
    """Invalid region requests in a small VM; each result is the errno the
    kernel really returned (the caller compares with EXPECTED_ERRNO)."""
    probes: list[Probe] = []
    with K.GuestMemory(4 * PAGE) as mem, kvm.create_vm() as vm:
        base = mem.address
        vm.set_region(0, 0x100000, 2 * PAGE, base)
        # The last valid id must work, so the limit probe tests the id and
        # nothing else.
        vm.set_region(nr_memslots - 1, 0x200000, PAGE, base + 2 * PAGE)

        def probe(name: str, slot: int, gpa: int, size: int, hva: int) -> None:
            probes.append(make_probe(name, nr_memslots, _attempt(vm, slot, gpa, size, hva)))

        probe("limit", nr_memslots, 0x300000, PAGE, base + 3 * PAGE)
        probe("overlap", 1, 0x101000, 2 * PAGE, base + 2 * PAGE)
        probe("misaligned_gpa", 1, 0x300800, PAGE, base + 3 * PAGE)
        probe("misaligned_size", 1, 0x300000, PAGE // 2, base + 3 * PAGE)
        probe("misaligned_hva", 1, 0x300000, PAGE, base + 3 * PAGE + PAGE // 2)
        probe("resize", 0, 0x100000, PAGE, base)
    return probes


# --- one run --------------------------------------------------------------------------
def _setup_slots(vm: K.Vm, geo: SlotGeometry, hva: int) -> float:
    set_region = vm.set_region
    start = time.perf_counter()
    for i in range(geo.n):
        set_region(i, geo.slot_gpa(i), geo.slot_size(i), hva + geo.slot_host_offset(i))
    return time.perf_counter() - start


def _move_slots(vm: K.Vm, geo: SlotGeometry, hva: int) -> float:
    # One page up: into the slot's own gap frame, never onto the next slot.
    set_region = vm.set_region
    start = time.perf_counter()
    for i in range(geo.n):
        set_region(i, geo.slot_gpa(i) + PAGE, geo.slot_size(i), hva + geo.slot_host_offset(i))
    return time.perf_counter() - start


def _delete_slots(vm: K.Vm, geo: SlotGeometry) -> float:
    delete = vm.delete_region
    start = time.perf_counter()
    for i in range(geo.n):
        delete(i)
    return time.perf_counter() - start


def _run_pass(
    vcpu: K.Vcpu,
    first: int,
    count: int,
    stride: int,
    timeout_s: float,
    on_mmio: Callable[[K.MmioExit], None] | None,
) -> GuestPass:
    """One guest pass.  The timed span is from the first KVM_RUN to the
    report exit: the guest loop plus every exit it takes."""
    regs = uapi.Regs()
    regs.rip = GUEST_ENTRY
    regs.rflags = K.RFLAGS_RESERVED  # interrupts off
    regs.rsi, regs.rcx, regs.rdi = first, count, stride
    vcpu.set_regs(regs)
    other = 0
    run = vcpu.run
    try:
        with Deadline(timeout_s):
            start = time.perf_counter()
            while True:
                reason = run()
                if reason == uapi.KVM_EXIT_MMIO:
                    if on_mmio is None:
                        raise GuestPassError(f"a slot access left KVM: {vcpu.describe_exit()}")
                    on_mmio(vcpu.mmio())
                elif reason == uapi.KVM_EXIT_IO:
                    elapsed = time.perf_counter() - start
                    break
                elif reason == uapi.KVM_EXIT_INTR:
                    other += 1
                else:
                    raise GuestPassError(f"guest pass stopped with {vcpu.describe_exit()}", unsupported=True)
            io = vcpu.io()
            if io.port != REPORT_PORT or not io.is_out or io.size != 4:
                raise GuestPassError(f"unexpected port access: {vcpu.describe_exit()}")
            reported = struct.unpack("<I", io.data[:4])[0]
            # Finish cleanly on HLT so no port access is pending into the next pass.
            while (reason := run()) == uapi.KVM_EXIT_INTR:
                other += 1
            if reason != uapi.KVM_EXIT_HLT:
                raise GuestPassError(f"guest did not halt after its report: {vcpu.describe_exit()}")
    except PassTimeout:
        raise GuestPassError(f"guest pass of {count} accesses did not finish within {timeout_s:g} s") from None
    return GuestPass(elapsed, reported, other)


def _vcpu_passes(vm: K.Vm, mem: K.GuestMemory, geo: SlotGeometry, timeout_s: float) -> VcpuSample:
    vcpu = vm.create_vcpu(0)
    K.enter_flat_protected_mode(vcpu)
    n = geo.n
    # Two empty passes first: the first faults in the code page and warms
    # the fresh vCPU; the second is the fixed cost of a pass (one entry, the
    # report exit), subtracted from the passes below.
    _run_pass(vcpu, geo.touch_gpa(0), 0, geo.stride, timeout_s, None)
    empty = _run_pass(vcpu, geo.touch_gpa(0), 0, geo.stride, timeout_s, None)
    first = _run_pass(vcpu, geo.touch_gpa(0), n, geo.stride, timeout_s, None)
    warm = _run_pass(vcpu, geo.touch_gpa(0), n, geo.stride, timeout_s, None)
    touched_ok = sum(1 for i in range(n) if struct.unpack("<I", mem.read(geo.touch_host_offset(i), 4))[0] == i + 1)
    # The same number of writes into one page of one slot (stride 0): the
    # vCPU's last-used-slot cache always hits, so warm - same is what it
    # costs when every access needs a different slot.
    same = _run_pass(vcpu, geo.touch_gpa(0), n, 0, timeout_s, None)

    state = {"next": 0, "exits": 0, "bad": 0}

    def on_mmio(m: K.MmioExit) -> None:
        i = state["next"]
        state["exits"] += 1
        state["next"] = i + 1
        if not (m.is_write and m.length == 4 and m.phys_addr == geo.gap_gpa(i) and m.data == struct.pack("<I", i + 1)):
            state["bad"] += 1

    mmio = _run_pass(vcpu, geo.gap_gpa(0), n, geo.stride, timeout_s, on_mmio)
    return VcpuSample(
        accesses=n,
        empty_pass_s=empty.seconds,
        first_touch_s=first.seconds,
        warm_touch_s=warm.seconds,
        same_slot_s=same.seconds,
        mmio_s=mmio.seconds,
        reported=(first.reported, warm.reported, same.reported, mmio.reported),
        mmio_exits=state["exits"],
        mmio_mismatches=state["bad"],
        touched_ok=touched_ok,
        other_exits=sum(p.other_exits for p in (empty, first, warm, same, mmio)),
    )


def run_once(kvm: K.Kvm, n: int, repeat: int, config: BenchConfig, nr_memslots: int, with_vcpu: bool) -> RunSample:
    geo = SlotGeometry(n, config.slot_pages)
    geo.check()
    with K.GuestMemory(geo.host_size) as mem, kvm.create_vm() as vm:
        mem.write(GUEST_ENTRY, GUEST_CODE)
        setup_s = _setup_slots(vm, geo, mem.address)
        vsample = _vcpu_passes(vm, mem, geo, config.pass_timeout_s) if with_vcpu else None
        limit = None
        if n >= nr_memslots:
            limit = full_vm_probe(nr_memslots, n, _attempt(vm, nr_memslots, geo.top_gpa + PAGE, PAGE, mem.address))
        move_s = _move_slots(vm, geo, mem.address)
        delete_s = _delete_slots(vm, geo)
    return RunSample(n, repeat, setup_s, move_s, delete_s, vsample, limit)


def schedule(slots: tuple[int, ...], repeats: int) -> Iterator[tuple[int, int]]:
    """Repeat-major order, reversed on odd repeats (ABC CBA ...), so slow
    drift of the host lands on every N alike."""
    for r in range(repeats):
        order = slots if r % 2 == 0 else tuple(reversed(slots))
        for n in order:
            yield r, n


def warmup_slots(slots: tuple[int, ...]) -> int:
    """The slots of the discarded first run."""
    return min(32, *slots)


def run_bench(config: BenchConfig, progress: Callable[[str], None] | None = None) -> BenchResult:
    """Open /dev/kvm, probe the error cases, then run every (repeat, N)."""
    if config.repeats < 1:
        raise BadInput(f"--repeats {config.repeats} is not positive: give 1 or more")
    for n in config.slots:
        SlotGeometry(n, config.slot_pages).check()
    started = time.perf_counter()
    with K.Kvm(config.device) as kvm:
        nr = kvm.check_extension(uapi.KVM_CAP_NR_MEMSLOTS)
        if not kvm.check_extension(uapi.KVM_CAP_USER_MEMORY) or nr < 1:
            raise K.KvmUnavailable(
                f"{config.device} has no user memory slots (KVM_CAP_USER_MEMORY / KVM_CAP_NR_MEMSLOTS = 0)"
            )
        too_many = [n for n in config.slots if n > nr]
        if too_many:
            raise BadInput(
                f"--slots {too_many[0]} exceeds KVM_CAP_NR_MEMSLOTS = {nr} on this host: "
                f"give counts up to {nr} (the limit itself is probed every run)"
            )
        result = BenchResult(
            config=config,
            api_version=kvm.api_version(),
            nr_memslots=nr,
            address_spaces=max(1, kvm.check_extension(uapi.KVM_CAP_MULTI_ADDRESS_SPACE)),
            vcpu_mmap_size=kvm.vcpu_mmap_size(),
            kvm_module=kvm_module(),
            host_kernel=platform.release(),
            probes=probe_errors(kvm, nr),
        )
        result.model_source = balanced_tree_nodes(1)[1]
        with_vcpu = config.vcpu
        if with_vcpu:
            # Whether this KVM can run the guest at all is decided here,
            # before any measurement, by a one-slot VM running the program
            # once.  If it can, a failure in a measured pass is a failure
            # (it raises); nothing later turns into a skip.
            reason = probe_vcpu(kvm, config.pass_timeout_s)
            if reason is not None:
                result.vcpu_error = reason
                log.warning("vCPU passes disabled: %s", reason)
                with_vcpu = False
        # One discarded run first: the first VM of a process pays for cold
        # caches and lazily set-up kernel state, which is no slot's cost.
        run_once(kvm, warmup_slots(config.slots), -1, config, nr, with_vcpu)
        for repeat, n in schedule(config.slots, config.repeats):
            if progress:
                progress(f"repeat {repeat + 1}/{config.repeats}: {n} slots")
            result.samples.append(run_once(kvm, n, repeat, config, nr, with_vcpu))
    for n in config.slots:
        result.model_walks[n] = model_walk(SlotGeometry(n, config.slot_pages))
    result.duration_s = time.perf_counter() - started
    return result


def _is_unsupported(exc: Exception) -> bool:
    """A failure that means this KVM cannot run the flat protected-mode
    guest at all: an entry failure, internal error or shutdown, or KVM
    refusing the vCPU set-up or KVM_RUN itself.  Used by the capability
    probe only."""
    if isinstance(exc, GuestPassError):
        return exc.unsupported
    op = getattr(exc, "operation", "")
    return op.startswith(("KVM_RUN", "KVM_CREATE_VCPU", "KVM_SET_SREGS", "KVM_SET_REGS", "KVM_GET_SREGS"))


def probe_vcpu(kvm: K.Kvm, timeout_s: float = 60.0) -> str | None:
    """None when this KVM runs the guest program (a one-slot VM, an empty
    pass and a pass of one write, checked); else why not.  A pass that runs
    but miscounts is no missing capability: it raises."""
    geo = SlotGeometry(1)
    try:
        with K.GuestMemory(geo.host_size) as mem, kvm.create_vm() as vm:
            mem.write(GUEST_ENTRY, GUEST_CODE)
            _setup_slots(vm, geo, mem.address)
            vcpu = vm.create_vcpu(0)
            K.enter_flat_protected_mode(vcpu)
            _run_pass(vcpu, geo.touch_gpa(0), 0, geo.stride, timeout_s, None)
            reported = _run_pass(vcpu, geo.touch_gpa(0), 1, geo.stride, timeout_s, None).reported
            word = struct.unpack("<I", mem.read(geo.touch_host_offset(0), 4))[0]
    except (GuestPassError, K.KvmIoctlError) as exc:
        if _is_unsupported(exc):
            return f"the flat protected-mode guest cannot run on this KVM: {exc}"
        raise
    if reported != 1 or word != 1:
        raise GuestPassError(
            f"capability probe: the guest reported {reported} writes and wrote {word}, expected 1 and 1"
        )
    return None

"""A small typed wrapper of the KVM API, in pure Python (ioctl, mmap, ctypes).

Enough of /dev/kvm to measure memory slots: the device, capabilities, a VM,
user memory regions, one vCPU and its ``kvm_run``, registers, running it.
Each object owns one file descriptor and closes it; a failed ioctl is
``KvmIoctlError`` with the errno's name, a missing device ``KvmUnavailable``
(a skip).  The structures and numbers it passes are kvm_uapi.py's.
docs/memslots-kvm.md, "The KVM API wrapper".
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import mmap
import os
from dataclasses import dataclass
from typing import Any, TypeVar

from memqual.host.core.closable import Closable
from memqual.host.core.errors import CapabilityMissing, MemqualError
from memqual.host.core.kvm_uapi import (
    KVM_API_VERSION,
    KVM_CHECK_EXTENSION,
    KVM_CREATE_VCPU,
    KVM_CREATE_VM,
    KVM_EXIT_FAIL_ENTRY,
    KVM_EXIT_INTERNAL_ERROR,
    KVM_EXIT_INTR,
    KVM_EXIT_IO,
    KVM_EXIT_IO_OUT,
    KVM_EXIT_MMIO,
    KVM_GET_API_VERSION,
    KVM_GET_REGS,
    KVM_GET_SREGS,
    KVM_GET_VCPU_MMAP_SIZE,
    KVM_IOEVENTFD,
    KVM_RUN,
    KVM_SET_REGS,
    KVM_SET_SREGS,
    KVM_SET_USER_MEMORY_REGION,
    Ioeventfd,
    Regs,
    Run,
    Segment,
    Sregs,
    UserspaceMemoryRegion,
    exit_name,
)

DEVICE = "/dev/kvm"
PAGE_SIZE = 4096


# --- exits, copied out of kvm_run ---------------------------------------------------
@dataclass(frozen=True)
class MmioExit:
    phys_addr: int
    data: bytes  # the written bytes (for a write); meaningless for a read
    length: int
    is_write: bool


@dataclass(frozen=True)
class IoExit:
    port: int
    size: int
    count: int
    is_out: bool
    data: bytes


# --- errors ----------------------------------------------------------------------
class KvmUnavailable(CapabilityMissing):
    """/dev/kvm is missing, not accessible, or does not speak API 12."""


class KvmIoctlError(MemqualError):
    """An ioctl failed.  ``errno_name`` is what the kernel returned (``EINVAL``,
    ``EEXIST``...), ``operation`` names the ioctl and its arguments."""

    exit_status = 1  # a host failure, not the user's input

    def __init__(self, operation: str, err: int) -> None:
        self.operation = operation
        self.errno = err
        self.errno_name = _errno.errorcode.get(err, str(err))
        super().__init__(f"{operation} failed: {self.errno_name} ({os.strerror(err)})")


def _ioctl(fd: int, request: int, arg: Any, operation: str) -> int:
    """ioctl with EINTR retried and every other error as KvmIoctlError."""
    while True:
        try:
            return fcntl.ioctl(fd, request, arg)
        except InterruptedError:
            continue
        except OSError as exc:
            raise KvmIoctlError(operation, exc.errno or 0) from exc


StructT = TypeVar("StructT", bound=ctypes.Structure)


def _ioctl_fill(fd: int, request: int, struct: StructT, operation: str) -> StructT:
    """A KVM_GET_* ioctl: ``struct`` as the kernel filled it in."""
    _ioctl(fd, request, struct, operation)
    return struct


def errno_name(err: int) -> str:
    return _errno.errorcode.get(err, str(err))


# --- objects ----------------------------------------------------------------------
class _FdOwner(Closable):
    """Owns one KVM file descriptor, ``fd``: -1 once closed."""

    fd: int

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Kvm(_FdOwner):
    """The /dev/kvm system fd."""

    def __init__(self, path: str = DEVICE) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise KvmUnavailable(
                f"{path} does not exist: load kvm (kvm_intel, kvm_amd) or run on a host with KVM"
            ) from exc
        except PermissionError as exc:
            raise KvmUnavailable(f"{path}: permission denied: run as root or join the kvm group") from exc
        except OSError as exc:
            raise KvmUnavailable(f"{path}: cannot open ({errno_name(exc.errno or 0)})") from exc
        try:
            version = self.api_version()
        except KvmIoctlError as exc:
            self.close()
            raise KvmUnavailable(f"{path} does not answer KVM_GET_API_VERSION ({exc.errno_name})") from exc
        if version != KVM_API_VERSION:
            self.close()
            raise KvmUnavailable(f"{path} speaks KVM API {version}, not {KVM_API_VERSION}")

    def api_version(self) -> int:
        return _ioctl(self.fd, KVM_GET_API_VERSION, 0, "KVM_GET_API_VERSION")

    def check_extension(self, cap: int) -> int:
        """0 when absent; otherwise a capability-specific value (for
        KVM_CAP_NR_MEMSLOTS the number of user slots per address space)."""
        return _ioctl(self.fd, KVM_CHECK_EXTENSION, cap, f"KVM_CHECK_EXTENSION({cap})")

    def vcpu_mmap_size(self) -> int:
        return _ioctl(self.fd, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")

    def create_vm(self) -> Vm:
        return Vm(self)


class Vm(_FdOwner):
    """One VM fd.  Created by :meth:`Kvm.create_vm`; owns its vCPUs."""

    def __init__(self, kvm: Kvm, machine_type: int = 0) -> None:
        self.kvm = kvm
        fd = _ioctl(kvm.fd, KVM_CREATE_VM, machine_type, "KVM_CREATE_VM")
        self.fd = fd
        self.vcpus: list[Vcpu] = []
        # One reusable struct: the region ioctl is the hot loop of the
        # measurement, and building a ctypes object per call costs more than
        # filling one in place.
        self._region = UserspaceMemoryRegion()

    def check_extension(self, cap: int) -> int:
        """The VM-level answer (may differ from the system one for some caps)."""
        return _ioctl(self.fd, KVM_CHECK_EXTENSION, cap, f"KVM_CHECK_EXTENSION({cap}) on VM")

    def set_region(
        self, slot: int, guest_phys_addr: int, memory_size: int, userspace_addr: int, flags: int = 0
    ) -> None:
        """Create, move (same slot, new guest_phys_addr), change flags of, or
        delete (memory_size 0) a slot."""
        r = self._region
        r.slot = slot
        r.flags = flags
        r.guest_phys_addr = guest_phys_addr
        r.memory_size = memory_size
        r.userspace_addr = userspace_addr
        try:
            fcntl.ioctl(self.fd, KVM_SET_USER_MEMORY_REGION, r)
        except OSError as exc:
            raise KvmIoctlError(
                f"KVM_SET_USER_MEMORY_REGION(slot={slot}, gpa={guest_phys_addr:#x}, size={memory_size:#x}, "
                f"hva={userspace_addr:#x}, flags={flags:#x})",
                exc.errno or 0,
            ) from exc

    def add_ioeventfd(self, addr: int, length: int, fd: int) -> None:
        """Signal eventfd ``fd`` on every guest MMIO write of ``length``
        bytes at ``addr``, in the kernel (KVM_IOEVENTFD, no datamatch)."""
        arg = Ioeventfd()
        arg.addr = addr
        arg.len = length
        arg.fd = fd
        _ioctl(self.fd, KVM_IOEVENTFD, arg, f"KVM_IOEVENTFD(addr={addr:#x}, len={length})")

    def delete_region(self, slot: int) -> None:
        # Deleting is setting size 0; KVM ignores the other fields except the id.
        self.set_region(slot, 0, 0, 0, 0)

    def create_vcpu(self, vcpu_id: int = 0) -> Vcpu:
        vcpu = Vcpu(self, vcpu_id)
        self.vcpus.append(vcpu)
        return vcpu

    def close(self) -> None:
        for vcpu in self.vcpus:
            vcpu.close()
        self.vcpus.clear()
        super().close()


class Vcpu(_FdOwner):
    """One vCPU fd and its mmap of kvm_run."""

    def __init__(self, vm: Vm, vcpu_id: int) -> None:
        self.vm = vm
        self.id = vcpu_id
        self.fd = _ioctl(vm.fd, KVM_CREATE_VCPU, vcpu_id, f"KVM_CREATE_VCPU({vcpu_id})")
        self._mm: mmap.mmap | None = None
        # A ctypes view into the mmap; private so no caller keeps a view
        # alive (a live view makes mmap.close() raise BufferError).
        self._run: Run | None = None
        try:
            size = vm.kvm.vcpu_mmap_size()
            if size < ctypes.sizeof(Run):
                raise KvmUnavailable(f"KVM_GET_VCPU_MMAP_SIZE is {size}, smaller than kvm_run ({ctypes.sizeof(Run)})")
            self._mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._run = Run.from_buffer(self._mm)
        except BaseException:
            self.close()
            raise

    def get_regs(self) -> Regs:
        return _ioctl_fill(self.fd, KVM_GET_REGS, Regs(), "KVM_GET_REGS")

    def set_regs(self, regs: Regs) -> None:
        _ioctl(self.fd, KVM_SET_REGS, regs, "KVM_SET_REGS")

    def get_sregs(self) -> Sregs:
        return _ioctl_fill(self.fd, KVM_GET_SREGS, Sregs(), "KVM_GET_SREGS")

    def set_sregs(self, sregs: Sregs) -> None:
        _ioctl(self.fd, KVM_SET_SREGS, sregs, "KVM_SET_SREGS")

    def run(self) -> int:
        """KVM_RUN once; returns the exit reason (details through
        :meth:`mmio` and :meth:`io`).  EINTR (a signal) comes back as
        KVM_EXIT_INTR."""
        try:
            fcntl.ioctl(self.fd, KVM_RUN, 0)
        except InterruptedError:
            return KVM_EXIT_INTR
        except OSError as exc:
            raise KvmIoctlError("KVM_RUN", exc.errno or 0) from exc
        return self._area().exit_reason

    def _area(self) -> Run:
        if self._run is None:
            raise ValueError("vCPU is closed")
        return self._run

    @property
    def exit_reason(self) -> int:
        return self._area().exit_reason

    def mmio(self) -> MmioExit:
        """The current KVM_EXIT_MMIO, copied out of kvm_run."""
        m = self._area().exit.mmio
        return MmioExit(m.phys_addr, bytes(m.data)[: m.len], m.len, bool(m.is_write))

    def io(self) -> IoExit:
        """The current KVM_EXIT_IO with its bytes (size * count, at data_offset)."""
        assert self._mm is not None
        io = self._area().exit.io
        start = io.data_offset
        data = bytes(self._mm[start : start + io.size * io.count])
        return IoExit(io.port, io.size, io.count, io.direction == KVM_EXIT_IO_OUT, data)

    def describe_exit(self) -> str:
        run = self._area()
        reason = run.exit_reason
        text = exit_name(reason)
        if reason == KVM_EXIT_FAIL_ENTRY:
            text += f" (hardware_entry_failure_reason={run.exit.fail_entry.hardware_entry_failure_reason:#x})"
        elif reason == KVM_EXIT_INTERNAL_ERROR:
            internal = run.exit.internal
            data = ", ".join(f"{internal.data[i]:#x}" for i in range(min(internal.ndata, 16)))
            text += f" (suberror={internal.suberror}, data=[{data}])"
        elif reason == KVM_EXIT_MMIO:
            m = self.mmio()
            text += f" (gpa={m.phys_addr:#x}, len={m.length}, {'write' if m.is_write else 'read'})"
        elif reason == KVM_EXIT_IO:
            io = self.io()
            text += f" (port={io.port:#x}, size={io.size}, {'out' if io.is_out else 'in'})"
        try:
            text += f" at rip={self.get_regs().rip:#x}"
        except KvmIoctlError:
            pass
        return text

    def close(self) -> None:
        # The ctypes view exports the mmap's buffer: drop it first, or
        # mmap.close() raises BufferError.
        self._run = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        super().close()


class GuestMemory(Closable):
    """One anonymous private mapping that backs guest slots.

    MAP_NORESERVE and no pre-touching: host pages appear only where the guest
    (or we) write, so thousands of one-page slots cost little host memory.
    """

    def __init__(self, size: int) -> None:
        if size <= 0 or size % PAGE_SIZE:
            raise ValueError(f"guest memory size {size} is not a positive multiple of {PAGE_SIZE}")
        self.size = size
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
        self.mm: mmap.mmap | None = mmap.mmap(-1, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        # The host virtual address KVM needs: take it from a ctypes view and
        # drop the view at once (a live view would block mmap.close()).
        view = ctypes.c_char.from_buffer(self.mm)
        self.address = ctypes.addressof(view)
        del view

    def write(self, offset: int, data: bytes) -> None:
        assert self.mm is not None
        self.mm[offset : offset + len(data)] = data

    def read(self, offset: int, length: int) -> bytes:
        assert self.mm is not None
        return self.mm[offset : offset + length]

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None


# --- flat 32-bit protected mode ---------------------------------------------------
CR0_PE = 1 << 0
CR0_ET = 1 << 4
RFLAGS_RESERVED = 1 << 1  # bit 1 always reads as 1


def flat_segment(selector: int, code: bool) -> Segment:
    """A 4 GiB, base-0 segment cache as a flat GDT entry would load it:
    code = execute/read (type 0xB), data = read/write (type 0x3), both
    accessed, 32-bit (db=1), page-granular limit (g=1)."""
    seg = Segment()
    seg.base = 0
    seg.limit = 0xFFFFFFFF
    seg.selector = selector
    seg.type = 0xB if code else 0x3
    seg.present = 1
    seg.dpl = 0
    seg.db = 1
    seg.s = 1
    seg.l = 0
    seg.g = 1
    seg.avl = 0
    seg.unusable = 0
    return seg


def enter_flat_protected_mode(vcpu: Vcpu) -> Sregs:
    """Switch the vCPU to flat 32-bit protected mode without paging, through
    KVM_SET_SREGS alone: no GDT in guest memory is needed because KVM loads
    the hidden segment caches directly; with interrupts off and no
    exceptions expected, no IDT either.  TR and LDT keep the reset values
    KVM gave (a busy TSS and an LDT), which VMX accepts for protected mode."""
    sregs = vcpu.get_sregs()
    sregs.cs = flat_segment(0x08, code=True)
    data = flat_segment(0x10, code=False)
    sregs.ds = data
    sregs.es = data
    sregs.fs = data
    sregs.gs = data
    sregs.ss = data
    sregs.cr0 = (sregs.cr0 | CR0_PE | CR0_ET) & ~(1 << 31)  # PE on, PG off
    sregs.cr4 = 0
    sregs.efer = 0
    vcpu.set_sregs(sregs)
    return vcpu.get_sregs()

"""The kernel's KVM UAPI as ctypes, no file descriptor: the ioctl number
encoding, the structures /dev/kvm reads and writes, the ioctl numbers,
capabilities and exit reasons memqual uses.  The layouts are checked
against the kernel's UAPI headers (tests/memslots/test_memslots_kvm.py).
docs/memslots-kvm.md, "The KVM API wrapper".
"""

from __future__ import annotations

import ctypes

# --- ioctl number encoding (include/uapi/asm-generic/ioctl.h) ---------------
_IOC_NRBITS, _IOC_TYPEBITS, _IOC_SIZEBITS = 8, 8, 14
_IOC_NRSHIFT = 0
_IOC_TYPESHIFT = _IOC_NRSHIFT + _IOC_NRBITS
_IOC_SIZESHIFT = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT = _IOC_SIZESHIFT + _IOC_SIZEBITS
_IOC_NONE, _IOC_WRITE, _IOC_READ = 0, 1, 2


def IOC(direction: int, type_: int, nr: int, size: int) -> int:
    if not 0 <= size < (1 << _IOC_SIZEBITS):
        raise ValueError(f"ioctl argument size {size} does not fit in {_IOC_SIZEBITS} bits")
    return (direction << _IOC_DIRSHIFT) | (type_ << _IOC_TYPESHIFT) | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT)


def IO(type_: int, nr: int) -> int:
    return IOC(_IOC_NONE, type_, nr, 0)


def IOR(type_: int, nr: int, size: int) -> int:
    return IOC(_IOC_READ, type_, nr, size)


def IOW(type_: int, nr: int, size: int) -> int:
    return IOC(_IOC_WRITE, type_, nr, size)


# --- UAPI structures ----------------------------------------------------------
class UserspaceMemoryRegion(ctypes.Structure):
    """struct kvm_userspace_memory_region (32 bytes)."""

    _fields_ = [
        ("slot", ctypes.c_uint32),  # bits 0-15 slot id, bits 16-31 address space
        ("flags", ctypes.c_uint32),
        ("guest_phys_addr", ctypes.c_uint64),
        ("memory_size", ctypes.c_uint64),  # 0 deletes the slot
        ("userspace_addr", ctypes.c_uint64),
    ]


class Ioeventfd(ctypes.Structure):
    """struct kvm_ioeventfd (64 bytes): a guest write of ``len`` bytes at
    ``addr`` signals the eventfd ``fd`` inside the kernel, with no exit to
    userspace."""

    _fields_ = [
        ("datamatch", ctypes.c_uint64),
        ("addr", ctypes.c_uint64),
        ("len", ctypes.c_uint32),
        ("fd", ctypes.c_int32),
        ("flags", ctypes.c_uint32),  # 0: MMIO, any data
        ("pad", ctypes.c_uint8 * 36),
    ]


class Regs(ctypes.Structure):
    """struct kvm_regs (x86, 144 bytes)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "rax",
            "rbx",
            "rcx",
            "rdx",
            "rsi",
            "rdi",
            "rsp",
            "rbp",
            "r8",
            "r9",
            "r10",
            "r11",
            "r12",
            "r13",
            "r14",
            "r15",
            "rip",
            "rflags",
        )
    ]


class Segment(ctypes.Structure):
    """struct kvm_segment (24 bytes): a segment register's hidden cache."""

    _fields_ = [
        ("base", ctypes.c_uint64),
        ("limit", ctypes.c_uint32),
        ("selector", ctypes.c_uint16),
        ("type", ctypes.c_uint8),
        ("present", ctypes.c_uint8),
        ("dpl", ctypes.c_uint8),
        ("db", ctypes.c_uint8),
        ("s", ctypes.c_uint8),
        ("l", ctypes.c_uint8),
        ("g", ctypes.c_uint8),
        ("avl", ctypes.c_uint8),
        ("unusable", ctypes.c_uint8),
        ("padding", ctypes.c_uint8),
    ]


class DTable(ctypes.Structure):
    """struct kvm_dtable (16 bytes): GDTR/IDTR."""

    _fields_ = [
        ("base", ctypes.c_uint64),
        ("limit", ctypes.c_uint16),
        ("padding", ctypes.c_uint16 * 3),
    ]


KVM_NR_INTERRUPTS = 256


class Sregs(ctypes.Structure):
    """struct kvm_sregs (x86, 312 bytes)."""

    _fields_ = [
        ("cs", Segment),
        ("ds", Segment),
        ("es", Segment),
        ("fs", Segment),
        ("gs", Segment),
        ("ss", Segment),
        ("tr", Segment),
        ("ldt", Segment),
        ("gdt", DTable),
        ("idt", DTable),
        ("cr0", ctypes.c_uint64),
        ("cr2", ctypes.c_uint64),
        ("cr3", ctypes.c_uint64),
        ("cr4", ctypes.c_uint64),
        ("cr8", ctypes.c_uint64),
        ("efer", ctypes.c_uint64),
        ("apic_base", ctypes.c_uint64),
        ("interrupt_bitmap", ctypes.c_uint64 * ((KVM_NR_INTERRUPTS + 63) // 64)),
    ]


class RunIo(ctypes.Structure):
    """kvm_run.io: a port access (KVM_EXIT_IO)."""

    _fields_ = [
        ("direction", ctypes.c_uint8),  # 0 in, 1 out
        ("size", ctypes.c_uint8),
        ("port", ctypes.c_uint16),
        ("count", ctypes.c_uint32),
        ("data_offset", ctypes.c_uint64),  # from the start of kvm_run
    ]


class RunMmio(ctypes.Structure):
    """kvm_run.mmio: an access to a guest frame in no slot (KVM_EXIT_MMIO)."""

    _fields_ = [
        ("phys_addr", ctypes.c_uint64),
        ("data", ctypes.c_uint8 * 8),
        ("len", ctypes.c_uint32),
        ("is_write", ctypes.c_uint8),
    ]


class RunFailEntry(ctypes.Structure):
    _fields_ = [("hardware_entry_failure_reason", ctypes.c_uint64), ("cpu", ctypes.c_uint32)]


class RunInternal(ctypes.Structure):
    _fields_ = [("suberror", ctypes.c_uint32), ("ndata", ctypes.c_uint32), ("data", ctypes.c_uint64 * 16)]


class RunExit(ctypes.Union):
    """The exit-reason union of kvm_run; 256 bytes (its ``padding`` member)."""

    _fields_ = [
        ("io", RunIo),
        ("mmio", RunMmio),
        ("fail_entry", RunFailEntry),
        ("internal", RunInternal),
        ("padding", ctypes.c_char * 256),
    ]


class Run(ctypes.Structure):
    """The fixed head of struct kvm_run (through the exit union and
    kvm_valid_regs); the kernel's area is larger (KVM_GET_VCPU_MMAP_SIZE) and
    holds the synced registers and, on x86, the PIO data page after it."""

    _fields_ = [
        ("request_interrupt_window", ctypes.c_uint8),
        ("immediate_exit", ctypes.c_uint8),
        ("padding1", ctypes.c_uint8 * 6),
        ("exit_reason", ctypes.c_uint32),
        ("ready_for_interrupt_injection", ctypes.c_uint8),
        ("if_flag", ctypes.c_uint8),
        ("flags", ctypes.c_uint16),
        ("cr8", ctypes.c_uint64),
        ("apic_base", ctypes.c_uint64),
        ("exit", RunExit),
        ("kvm_valid_regs", ctypes.c_uint64),
        ("kvm_dirty_regs", ctypes.c_uint64),
    ]


# --- ioctl numbers -------------------------------------------------------------
KVMIO = 0xAE
KVM_GET_API_VERSION = IO(KVMIO, 0x00)
KVM_CREATE_VM = IO(KVMIO, 0x01)
KVM_CHECK_EXTENSION = IO(KVMIO, 0x03)
KVM_GET_VCPU_MMAP_SIZE = IO(KVMIO, 0x04)
KVM_CREATE_VCPU = IO(KVMIO, 0x41)
KVM_SET_USER_MEMORY_REGION = IOW(KVMIO, 0x46, ctypes.sizeof(UserspaceMemoryRegion))
KVM_RUN = IO(KVMIO, 0x80)
KVM_GET_REGS = IOR(KVMIO, 0x81, ctypes.sizeof(Regs))
KVM_SET_REGS = IOW(KVMIO, 0x82, ctypes.sizeof(Regs))
KVM_GET_SREGS = IOR(KVMIO, 0x83, ctypes.sizeof(Sregs))
KVM_SET_SREGS = IOW(KVMIO, 0x84, ctypes.sizeof(Sregs))
KVM_IOEVENTFD = IOW(KVMIO, 0x79, ctypes.sizeof(Ioeventfd))

KVM_API_VERSION = 12  # the only stable API version there has ever been

# Capabilities (KVM_CHECK_EXTENSION arguments)
KVM_CAP_USER_MEMORY = 3
KVM_CAP_NR_MEMSLOTS = 10
KVM_CAP_IOEVENTFD = 36
KVM_CAP_MULTI_ADDRESS_SPACE = 118
# Memory region flags: memqual.host.memslots.layout (KVM_MEM_LOG_DIRTY_PAGES, KVM_MEM_READONLY).

# Exit reasons (kvm_run.exit_reason)
EXIT_REASONS = {
    0: "KVM_EXIT_UNKNOWN",
    1: "KVM_EXIT_EXCEPTION",
    2: "KVM_EXIT_IO",
    3: "KVM_EXIT_HYPERCALL",
    4: "KVM_EXIT_DEBUG",
    5: "KVM_EXIT_HLT",
    6: "KVM_EXIT_MMIO",
    7: "KVM_EXIT_IRQ_WINDOW_OPEN",
    8: "KVM_EXIT_SHUTDOWN",
    9: "KVM_EXIT_FAIL_ENTRY",
    10: "KVM_EXIT_INTR",
    17: "KVM_EXIT_INTERNAL_ERROR",
    24: "KVM_EXIT_SYSTEM_EVENT",
}
KVM_EXIT_IO = 2
KVM_EXIT_HLT = 5
KVM_EXIT_MMIO = 6
KVM_EXIT_SHUTDOWN = 8
KVM_EXIT_FAIL_ENTRY = 9
KVM_EXIT_INTERNAL_ERROR = 17

KVM_EXIT_INTR = 10
KVM_EXIT_IO_IN, KVM_EXIT_IO_OUT = 0, 1


def exit_name(reason: int) -> str:
    return EXIT_REASONS.get(reason, f"exit reason {reason}")

"""The memslots of a 2011 x86 KVM host (Linux v3.0, qemu-kvm 0.14), as data.

32 user slots and VMX's private slots above them (the TSS, the APIC-access
page, the EPT identity map) in one array walked to ``nmemslots``: on a VMX
host with EPT every miss walks 35 entries, and a guest needing more than
32 user slots could not run.  Sources and addresses: docs/memslots-model.md,
"The 2011 host as data".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from memqual.host.memslots.layout import Layout, Slot

KVM_MEMORY_SLOTS = 32
KVM_PRIVATE_MEM_SLOTS = 4
APIC_DEFAULT_PHYS_BASE = 0xFEE00000
QEMU_KVM_TSS_ADDR = 0xFEFFD000
QEMU_KVM_IDENTITY_MAP_ADDR = 0xFEFFC000
PAGE_SHIFT = 12


@dataclasses.dataclass(frozen=True)
class Host2011:
    """One 2011 host kind: which private slots it registered."""

    name: str
    private: tuple[Slot, ...]


VMX_EPT = Host2011(
    "vmx-ept",
    (
        Slot(KVM_MEMORY_SLOTS + 0, QEMU_KVM_TSS_ADDR >> PAGE_SHIFT, 3),  # TSS_PRIVATE_MEMSLOT
        Slot(KVM_MEMORY_SLOTS + 1, APIC_DEFAULT_PHYS_BASE >> PAGE_SHIFT, 1),  # APIC_ACCESS_PAGE_PRIVATE_MEMSLOT
        Slot(KVM_MEMORY_SLOTS + 2, QEMU_KVM_IDENTITY_MAP_ADDR >> PAGE_SHIFT, 1),  # IDENTITY_PAGETABLE_PRIVATE_MEMSLOT
    ),
)
SVM = Host2011("svm", ())
HOSTS = {h.name: h for h in (VMX_EPT, SVM)}
DEFAULT_HOST = VMX_EPT  # seed 000's netperf host: Intel, EPT on (seed 002 turned it off only for kernbench)


def runs_on_2011(layout: Layout) -> bool:
    """Whether a 2011 host accepted every user slot of the layout."""
    return len(layout) <= KVM_MEMORY_SLOTS and all(s.id < KVM_MEMORY_SLOTS for s in layout.slots)


def on_host(layout: Layout, host: Host2011 = DEFAULT_HOST) -> Layout:
    """The layout with the host's private slots registered after the
    guest's (the vCPU setup registers them once QEMU created the VM).  A
    private slot that overlaps a guest slot is left out: the guest's own
    memory wins there, as its slot came first."""
    slots = list(layout.slots)
    for private in host.private:
        if any(s.base_gfn < private.end_gfn and private.base_gfn < s.end_gfn for s in slots):
            continue
        slots.append(private)
    return Layout(tuple(slots), name=layout.name)


# What a real guest's layout may hold that came after the seeds' kernels
# (2011): a 2011 host accepted its slots (at most 32), but no 2011 guest was
# configured so, and a layout built with them does not speak for the seeds'.
Q35 = "the q35 machine type (QEMU 1.4, 2013)"
PC_DIMM = "pc-dimm (QEMU 2.1, 2014)"
IVSHMEM_PLAIN = "ivshmem-plain with a memory backend (QEMU 2.6, 2016)"
DIMM_REGION_PREFIXES = ("mq-gl-mem-", "mq-mem-")


def newer_than_2011(settings: Mapping[str, Any], slot_names: Sequence[str] = ()) -> tuple[str, ...]:
    """The devices and machine type of a guest configuration (a layout
    record's settings and the QEMU region behind each slot) that no 2011
    guest had, in words with the QEMU release and year that brought them."""
    found = []
    if "q35" in str(settings.get("machine", "")):
        found.append(Q35)
    dimms = int(settings.get("boot_dimms") or 0) + int(settings.get("hotplugged_dimms") or 0)
    if dimms or any(str(n).startswith(DIMM_REGION_PREFIXES) for n in slot_names):
        found.append(PC_DIMM)
    if any(str(b).startswith("ivshmem-plain") for b in settings.get("ram_bars") or ()):
        found.append(IVSHMEM_PLAIN)
    return tuple(found)

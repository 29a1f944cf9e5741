"""The host kernel's code, grouped by the work a scenario's host side does
for its guests, in MAINTAINERS' ``F:`` form (host/core/scenario.py
``kernel_path_matches``).  A scenario row's ``host_paths`` are made of
these groups: the code whose work its primaries measure, so that ``memqual
run --host-patch`` runs the scenarios a host patch can move
(host/run/host_scope.py).  Code every host runs for any guest (the
scheduler, the syscall and interrupt paths, include/linux/mm.h) is in no
group: a patch to it runs every scenario, as a guest patch to the page
allocator does (docs/host-under-test.md, "Qualifying a host patch")."""

from __future__ import annotations

# KVM (L1's kvm and kvm_amd under --host-kernel; this machine's /dev/kvm for
# the memslot benchmarks): every exit a guest makes, its nested page faults
# and their memslot search, memslot updates, the MMU notifier's zaps.
KVM = (
    "virt/kvm/",
    "arch/x86/kvm/",
    "include/linux/kvm_*.h",
    "include/uapi/linux/kvm.h",
    "arch/x86/include/asm/kvm_*.h",
    "arch/x86/include/asm/kvm-x86-ops.h",
    "arch/x86/include/asm/svm.h",
    "arch/x86/include/uapi/asm/kvm.h",
)

# A page of the guest's memory touched first: QEMU's anonymous memory
# faulted in (KVM's get_user_pages, or QEMU's own touch), the page
# allocated and zeroed, a transparent huge page where THP backs the guest.
ANON_FAULT = ("mm/memory.c", "mm/gup.c", "mm/huge_memory.c", "mm/page_alloc.c")

# Memory a guest gives back: QEMU's madvise(MADV_DONTNEED) of the pages a
# balloon or virtio-mem releases (a huge page split first), their unmapping
# and freeing, and the MMU notifier through which KVM drops its mappings.
GIVE_BACK = (
    "mm/madvise.c",
    "mm/memory.c",
    "mm/mmu_gather.c",
    "mm/rmap.c",
    "mm/swap.c",
    "mm/huge_memory.c",
    "mm/page_alloc.c",
    "mm/mmu_notifier.c",
    "include/linux/mmu_notifier.h",
)

# ksmd: its scan, the checksum of every page it covers (xxhash), its trees,
# and the walk that write-protects a page it merges.  No KVM: ksmd reaches
# it only through the MMU notifier when it write-protects or replaces a
# page, a cost per page merged, not per page scanned.
KSMD = ("mm/ksm.c", "include/linux/ksm.h", "mm/page_vma_mapped.c", "lib/xxhash.c", "include/linux/xxhash.h")

# The host's huge page pool backing a guest (hugetlbfs).
HUGETLB = ("mm/hugetlb.c", "fs/hugetlbfs/", "include/linux/hugetlb.h")


def joined(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """The groups' paths, each once, in order: one row's host_paths."""
    return tuple(dict.fromkeys(path for group in groups for path in group))

"""Memory slots: the reference model of KVM's gfn -> memslot lookup.

- layout: the memslot layout type (Slot, Layout), JSON files, validation and
  the shipped layouts (seed-3, seed-3-stacked, seed-32).
- structures: the lookup structures argued over in seeds 000/002 and the ones
  upstream chose later (linear, reorder, wbtree, binsearch, binsearch-lru,
  rbtree), each counting the nodes a lookup examines.
- workloads: seeded streams of guest frame numbers (miss, ram-hits,
  small-hits, mixed).
- model: the table of mean and worst nodes per structure and workload.
- cli: ``memqual memslots model|lookup|kvm``.

The /dev/kvm and QEMU parts live in their own modules (kvm*, qemu*) and use
only ``layout``; nothing here needs a guest or /dev/kvm.
"""

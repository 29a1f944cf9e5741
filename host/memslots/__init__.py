"""Memory slots: the reference model of KVM's gfn -> memslot lookup.

- layout: the memslot layout type (Slot, Layout), JSON files, validation and
  the shipped layouts (seed-3, seed-3-stacked, seed-32, qemu-*), and
  ``layout_from_json`` for layouts read from real guests (records).
- structures: the lookup structures argued over in seeds 000/002 and the ones
  upstream chose later (linear, reorder, tree2011, binsearch, binsearch-lru,
  rbtree), and memqual's own height-budgeted tree (hbtree), each counting the nodes a lookup examines.
- workloads: seeded streams of guest frame numbers (miss, ram-hits,
  other-hits = small-hits, mixed).
- model: the table of mean and worst nodes per structure and workload.
- cli: ``memqual memslots model|lookup|kvm|qemu``.
- kvm, kvm_bench, kvm_cli: the /dev/kvm harness (pure Python ioctls, a tiny
  vCPU), no guest OS.
- qemu_layout, qemu_probe (the command: host/cli/memslots_qemu.py): a layout applied to a real QEMU guest
  (pc-dimms at boot and by hotplug), read back from QEMU and the guest, and
  the differential check.
- trace: guest frames recorded from a real guest replayed through the model.

The model modules (layout, structures, workloads, model) need neither a
guest nor /dev/kvm.
"""

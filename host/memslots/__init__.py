"""Memory slots: the reference model of KVM's gfn -> memslot lookup
(layout, structures, workloads, model: no guest, no /dev/kvm), the
/dev/kvm harness (kvm_bench, kvm_lookup), layouts on real QEMU guests
(qemu_layout, qemu_probe) and traces of real guests replayed through the
model (trace).  Each module's job: docs/memslots-model.md, "The modules of
host/memslots/".
"""

"""Host-side Python of memqual: the QEMU machine, SSH, the probe, and one
module or package per subject (ksm, balloon, memslots), plus statistics,
claims and the report.  Subjects do not import each other; they share the
machine (memqual.host.machine), the environment (memqual.host.environment) and the
measurement record (memqual.host.record).  tests/test_architecture.py checks it,
with no import cycles and no private names imported across modules."""

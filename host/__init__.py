"""Host-side Python of memqual: the QEMU machine, SSH, the probe, and one
module or package per subject (ksm, balloon, memslots, virtio_mem), plus
statistics, claims and the report.  Imports run one way, core <- subjects <-
judging <- reports <- runs <- commands, and subjects do not reach each other;
they share the machine (memqual.host.core.machine), the environment
(memqual.host.core.environment) and the measurement record (memqual.host.core.record).
import-linter's contracts in pyproject.toml say so (``lint-imports``);
tests/test_architecture.py adds no import cycles and no private names
imported across modules."""

"""The environment a measurement was taken in: one typed fingerprint of the
host, QEMU, the accelerator and the guest, under one set of key names.

host/core/probe.py fills the host's part; a scenario adds the accelerator
and the guest image (``with_accel``, ``with_guest``); ``to_json()`` gives
the known keys, the same as results.json's fingerprint
(``FINGERPRINT_KEYS`` first).  docs/architecture.md,
"host/core/environment.py"."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput

# Where the host kernel's KSM and THP knobs are: the probe reads them for the
# fingerprint, memqual.host.ksm reads and writes them.
KSM_ROOT = Path("/sys/kernel/mm/ksm")
THP_ROOT = Path("/sys/kernel/mm/transparent_hugepage")

# The keys a reader of results.json wants first, in this order.
FINGERPRINT_KEYS = (
    "host_kernel",
    "qemu",
    "qemu_origin",
    "accel",
    "accel_reason",
    "clock",
    "cpu",
    "ksm",
    "thp",
    "kvm_nr_memslots",
    "guest_kernel",
    "guest_kernel_sha256",
)


@dataclasses.dataclass(frozen=True)
class Environment:
    """What shapes a measurement besides its own settings.  None: not known
    (or not applicable), and left out of ``to_json()``."""

    host_kernel: str | None = None  # uname -r of the host (the host under test's release when there is one)
    # The host under test the guests ran on (host/core/nested.py): its kernel
    # and KVM parameters and how L1 ran ("6.1.0-57-amd64 in TCG+SVM, L2
    # accel kvm"); None: this machine.
    host_under_test: str | None = None
    qemu: str | None = None  # QEMU's version ("7.2.22"), of $MEMQUAL_QEMU when set
    qemu_origin: str | None = None  # where that QEMU came from: the system's, Debian's archive, a build
    accel: str | None = None  # kvm | tcg: what the guests ran under
    accel_reason: str | None = None  # why that accelerator
    # The clock the guest's timings were read with (memqual.host.core.clock):
    # "wall", or "icount:SHIFT" where a guest-timed figure counts guest
    # instructions; a record with no guest (the host's own benchmarks) is wall.
    clock: str | None = None
    vcpus: int | None = None  # the guest's vCPUs (under icount they take turns in one thread)
    cpu: str | None = None  # the host CPU's model name
    ksm: Mapping[str, str] | None = None  # the host's KSM knobs (sysfs name -> value)
    thp: str | None = None  # transparent huge pages: always | madvise | never | unavailable
    kvm_nr_memslots: int | None = None  # KVM_CAP_NR_MEMSLOTS
    guest_kernel: str | None = None  # the guest kernel's release
    guest_kernel_sha256: str | None = None
    initramfs_sha256: str | None = None
    # The CPU the guest saw (QEMU's model: ``-cpu max`` is another CPU in
    # another QEMU version, and the guest kernel picks code paths by it),
    # read from the guest's /proc/cpuinfo.
    guest_cpu: str | None = None  # "AuthenticAMD family 15 model 107 (QEMU TCG CPU version 2.5+)"
    guest_cpu_flags: str | None = None  # its flags, sorted, space-separated
    python: str | None = None  # the Python that ran the scenario
    # The /dev/kvm harness (memslots kvm): the device and what it said.
    kvm_module: str | None = None  # kvm_intel, kvm_amd, kvm_pvm...
    kvm_device: str | None = None
    kvm_api_version: int | None = None
    kvm_address_spaces: int | None = None
    kvm_vcpu_mmap_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The known keys and their values, in field order (a record's
        ``environment``)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                out[field.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Environment:
        """The known keys of a record's or results.json's environment;
        others (another version's) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def with_accel(self, accel: str, reason: str) -> Environment:
        return dataclasses.replace(self, accel=accel, accel_reason=reason)

    def with_host(self, label: str, release: str) -> Environment:
        """The host under test the guests ran on, and its kernel's release."""
        return dataclasses.replace(self, host_under_test=label, host_kernel=release)

    def with_clock(self, clock: str, vcpus: int | None = None) -> Environment:
        """The clock a guest ran on (a label: wall, icount:SHIFT) and its vCPUs."""
        return dataclasses.replace(self, clock=clock, vcpus=vcpus)

    def with_guest(self, image: Any) -> Environment:
        """The guest image's kernel release and hashes (a memqual.images.build
        Image, or anything with those attributes)."""
        return dataclasses.replace(
            self,
            guest_kernel=image.release,
            guest_kernel_sha256=image.kernel_sha256,
            initramfs_sha256=image.initramfs_sha256,
        )

    def with_guest_cpu(self, cpuinfo: str) -> Environment:
        """The guest's CPU from its /proc/cpuinfo; unchanged when that says
        nothing of it."""
        cpu = guest_cpu_from(cpuinfo)
        if cpu is None:
            return self
        return dataclasses.replace(self, guest_cpu=cpu[0], guest_cpu_flags=cpu[1])

    def replace(self, **changes: Any) -> Environment:
        return dataclasses.replace(self, **changes)


def guest_cpu_from(cpuinfo: str) -> tuple[str, str] | None:
    """(vendor, family, model and name in one line; the sorted flags) of
    the first processor in a /proc/cpuinfo, or None without a vendor."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    vendor = fields.get("vendor_id")
    if not vendor:
        return None
    cpu = f"{vendor} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    if fields.get("model name"):
        cpu += f" ({fields['model name']})"
    return cpu, " ".join(sorted(set(fields.get("flags", "").split())))


def shared_fact(facts: Mapping[str, str | None], unsaid: str, *, differ: str, advice: str, joiner: str = " ") -> str:
    """The one value of a fact of the environment (the clock, the host)
    that several sources must share (an A/B's arms, compare's files),
    given as ``{source: value}``; a source that does not say has
    ``unsaid``.  When they differ, one line (BadInput): ``differ``, each
    source with its value (``joiner`` between), then ``advice``."""
    named = {source: (value or unsaid) for source, value in facts.items()}
    found = sorted(set(named.values()))
    if len(found) > 1:
        which = ", ".join(f"{source}{joiner}{value}" for source, value in named.items())
        raise BadInput(f"{differ} ({which}): {advice}")
    return found[0] if found else unsaid

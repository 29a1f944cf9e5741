"""What a bisect's series is of, and the arms a probe's step runs.

A series of GUEST kernels: each probe's guests boot it, on this machine or
on one host under test every probe shares (``--host-kernel``).  A series
of HOST kernels (``--host-kernels``, ``--host-kernel-source``): each
probe's guests run on it, booted as L1 under TCG with emulated SVM
(host/core/nested.py), the guest one kernel every probe shares (the
default image, ``--debian-kernel`` or ``--guest-kernel``).  Either way
the two arms of a step differ on the series' axis alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core.errors import BadInput
from memqual.host.core.kernelspec import KernelSpec, parse_kernel
from memqual.host.core.nested import HostUnderTest, parse_host
from memqual.host.run.config import Arm, GuestKernel
from memqual.host.run.host_checks import check_hosts

if TYPE_CHECKING:
    from memqual.host.core.qemu_binary import QemuChoice

GUEST = "guest"
HOST = "host"
AXES = (GUEST, HOST)


@dataclasses.dataclass(frozen=True)
class FixedGuest:
    """A host series' one guest kernel: ``name`` as the command line gave
    it, its files (checked when the bisect started) and the words it adds
    to the guest's command line."""

    name: str
    bzimage: str
    modules: str
    sha256: str
    cmdline_extra: str = ""

    def kernel(self, label: str) -> GuestKernel:
        return GuestKernel(
            label,
            Path(self.bzimage),
            Path(self.modules) if self.modules else None,
            self.sha256,
            self.cmdline_extra,
        )


@dataclasses.dataclass(frozen=True)
class Axis:
    """The series' axis (``kind``) and what the other axis holds fixed:
    a guest series' one host under test (``host``, KERNEL[:CMDLINE]; ""
    this machine), a host series' one guest (``guest``; None the default
    image).  ``host_params``: the kvm/kvm_amd parameters of every host
    under test of the bisect."""

    kind: str = GUEST
    host: str = ""
    host_params: tuple[str, ...] = ()
    guest: FixedGuest | None = None

    def __post_init__(self) -> None:
        if self.kind not in AXES:
            raise ValueError(f"axis {self.kind!r}: guest or host")
        if self.kind == HOST and self.host:
            raise ValueError("a series of host kernels has no fixed host")
        if self.kind == GUEST and self.guest is not None:
            raise ValueError("a series of guest kernels has no fixed guest")
        if self.host_params and not self.on_hosts:
            raise ValueError("host parameters without a host under test")

    @property
    def on_hosts(self) -> bool:
        """Do the bisect's guests run on hosts under test?"""
        return self.kind == HOST or bool(self.host)

    def fixed_host(self) -> HostUnderTest | None:
        return parse_host(self.host, self.host_params) if self.host else None

    def host_of(self, spec: KernelSpec) -> HostUnderTest | None:
        """The host under test the guests of this kernel of the series run
        on (None: this machine)."""
        if self.kind == HOST:
            return HostUnderTest(spec, self.host_params)
        return self.fixed_host()

    def hosts(self, series: Iterable[KernelSpec]) -> list[HostUnderTest]:
        """Every distinct host under test of the series, in order."""
        found: list[HostUnderTest] = []
        for spec in series:
            host = self.host_of(spec)
            if host is not None and host not in found:
                found.append(host)
        return found

    def label(self, spec: KernelSpec) -> str:
        """How the log and the page name a kernel of the series."""
        return f"host {spec.name}" if self.kind == HOST else spec.name

    def describe(self) -> str:
        """The axis in words, for the log's header and the page."""
        params = "".join(f" {p}" for p in self.host_params)
        if self.kind == HOST:
            guest = f"guest kernel {self.guest.name}" if self.guest else "the default guest image"
            return (
                f"host kernels: each probe's guests run on its host kernel{params}, booted as L1 under TCG "
                f"with emulated SVM; every guest {guest}"
            )
        where = f"on host {self.host}{params} (L1 under TCG with emulated SVM)" if self.host else "on this machine"
        return f"guest kernels: each probe's guests boot it, {where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "host": self.host,
            "host_params": list(self.host_params),
            "guest": dataclasses.asdict(self.guest) if self.guest else None,
            "text": self.describe(),
        }

    @classmethod
    def from_json(cls, data: Any) -> Axis:
        """A state's axis; a state from before axes is a guest series on this machine."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("axis: not an object")
        guest = data.get("guest")
        return cls(
            kind=str(data.get("kind", GUEST)),
            host=str(data.get("host") or ""),
            host_params=tuple(str(p) for p in data.get("host_params") or ()),
            guest=FixedGuest(**guest) if isinstance(guest, dict) else None,
        )


def parse_hosts(texts: list[str], params: list[str]) -> list[HostUnderTest]:
    """--host-kernels' hosts, each with every --host-kernel-param (bad
    form: one line)."""
    return [parse_host(text, params) for text in texts]


def fixed_host_text(texts: list[str] | None) -> str:
    """--host-kernel of a guest series: once at most, checked for form."""
    texts = texts or []
    if len(texts) > 1:
        raise BadInput(
            "--host-kernel given twice: a bisect over guest kernels runs every probe on one host; "
            "bisect host kernels with --host-kernels K1 ... Kn"
        )
    return parse_kernel(texts[0]).name if texts else ""


def build_host_revision(version: str) -> str:
    """A revision's host kernel, built with images/host.config on top of
    memqual's config (as ``memqual run --host-patch`` builds host kernels),
    or found in the cache: its ``memqual kernel build`` name."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_build import HOST_CONFIG, build

    return build(version, (), [HOST_CONFIG]).name


@dataclasses.dataclass
class HostNames:
    """The name a host under test boots for each kernel of a host series:
    a Debian or built kernel's own name; a revision (``DIR@commit``)
    built when first probed, then checked as the series' other hosts were
    before any job (kvm_amd, the parameters)."""

    params: tuple[str, ...] = ()
    build: Callable[[str], str] = build_host_revision
    check: Callable[[list[HostUnderTest]], None] = check_hosts
    names: dict[str, str] = dataclasses.field(default_factory=dict)

    def __call__(self, spec: KernelSpec) -> KernelSpec:
        # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
        from memqual.images.kernel_sources import is_source_revision

        if not is_source_revision(spec.version):
            return spec
        if spec.version not in self.names:
            name = self.build(spec.version)
            self.check([HostUnderTest(KernelSpec(name), self.params)])
            self.names[spec.version] = name
        return KernelSpec(self.names[spec.version], spec.cmdline_extra)


GuestOf = Callable[[str, KernelSpec], GuestKernel]


def step_arms(
    axis: Axis,
    specs: dict[str, KernelSpec],
    guest_of: GuestOf,
    host_name: Callable[[KernelSpec], KernelSpec],
    qemu: QemuChoice | None = None,
) -> dict[str, Arm]:
    """The arms of one step, by label ("A" K1, "B" the probe): on a guest
    series each arm's guest kernel (``guest_of``) on the one host; on a
    host series each arm's host under test (its kernel's boot name,
    ``host_name``), the one guest on both."""
    arms = {}
    for label, spec in specs.items():
        if axis.kind == HOST:
            kernel = axis.guest.kernel(label) if axis.guest else None
            host: HostUnderTest | None = HostUnderTest(host_name(spec), axis.host_params)
        else:
            kernel, host = guest_of(label, spec), axis.fixed_host()
        arms[label] = Arm(label, kernel, qemu, host)
    return arms


def step_hosts(arms: dict[str, Arm]) -> tuple[HostUnderTest, ...]:
    """A step's hosts under test as a RunConfig holds them: one when every
    arm shares it (the jobs' environment), else each arm's (its variant's)."""
    hosts = [a.host for a in arms.values() if a.host is not None]
    if not hosts:
        return ()
    return (hosts[0],) if len(hosts) == len(arms) and len(set(hosts)) == 1 else tuple(hosts)

"""The hosts under test of a run or a bisect, checked against their own
kernels before any job: a kernel that is unknown or has no kvm_amd, and a
``--host-kernel-param`` its kvm or kvm_amd does not have, are one line,
exit 2 (``memqual run --host-kernel``, ``memqual bisect --host-kernels``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from memqual.host.core import nested
from memqual.host.core.clock import Clock


def check_hosts(hosts: Iterable[nested.HostUnderTest]) -> None:
    """Each host's kernel found (a Debian kernel is fetched once, a built
    one read from the cache) with its kvm_amd, and each of its parameters
    one that kernel's module has (read with modinfo)."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import KernelSource
    from memqual.images.host_image import module_parameters

    for host in hosts:
        nested.check_params(host, module_parameters(KernelSource(debian=host.kernel.version)))


def host_run_clock(asked: Clock, option: str = "--clock") -> Clock:
    """The clock a host under test runs on for ``asked`` (icount, or auto's
    icount, no coarser than nested.MAX_SHIFT), said on stderr when it is
    not the one asked."""
    if asked.shift is None or asked.shift <= nested.MAX_SHIFT:
        return asked
    chosen = Clock(asked.kind, nested.MAX_SHIFT)
    print(
        f"{option} {asked.label}: the host under test runs on {chosen.label} (its figures were measured "
        "there; at shift 4 its guest stalls: docs/host-under-test.md)",
        file=sys.stderr,
    )
    return chosen

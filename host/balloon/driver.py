"""The balloon driver variant in a guest: push virtio_balloon_mq.ko
over SSH, swap it for the stock virtio_balloon with a chosen number of PFNs
per request, prove through QMP that it drives the device, read its
guest-clock counters, and put the stock driver back.

The request-size experiment built on it (its plan, measure and fit) is
host/balloon/request_size.py.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any

from memqual.host.balloon.device import PAGE
from memqual.host.core.errors import BadInput, GuestError

MODULE = "virtio_balloon_mq"
STOCK = "virtio_balloon"
GUEST_KO = "/tmp/virtio_balloon_mq.ko"
PARAMS = f"/sys/module/{MODULE}/parameters"
STOCK_PFNS = 256  # VIRTIO_BALLOON_ARRAY_PFNS_MAX, mainline's request size
# One request is one virtqueue buffer.  The driver turns indirect descriptors
# off (virtballoon_validate), so a buffer is one descriptor over a kmalloc'd
# array, at most KMALLOC_MAX_SIZE = 4 MiB on x86-64 6.1 (order 10), or one
# descriptor per page of a vmalloc'd array, at most the queue's 128 entries
# (QEMU's virtio_add_queue(vdev, 128, ...)): 1 << 20 PFNs of 4 bytes.
PFNS_MAX = 1 << 20
PROBE_BYTES = 4 << 20  # the QMP check that the loaded driver moves the balloon


def check_pfns(pfns: int) -> int:
    """Refuse, before anything boots, a size the driver would refuse."""
    if not isinstance(pfns, int) or pfns < 1 or pfns > PFNS_MAX:
        raise BadInput(f"PFNs per request {pfns!r}: give 1..{PFNS_MAX} (the driver's one-buffer limit)")
    return pfns


@dataclasses.dataclass(frozen=True)
class DirectionTiming:
    requests: int = 0
    pfns: int = 0
    alloc_ns: int = 0
    wait_ns: int = 0
    total_ns: int = 0  # summed over the driver's fill/leak calls
    span_ns: int = 0  # first call's start to the last ack

    def breakdown(self) -> dict[str, float]:
        """Shares (%) of the driver's span: allocating pages, waiting for
        the host's ack, the rest inside the calls, and between calls (the
        work item re-queued)."""
        span = self.span_ns or 1
        rest = max(self.total_ns - self.alloc_ns - self.wait_ns, 0)
        return {
            "alloc_pct": 100.0 * self.alloc_ns / span,
            "host_wait_pct": 100.0 * self.wait_ns / span,
            "rest_pct": 100.0 * rest / span,
            "between_calls_pct": 100.0 * max(self.span_ns - self.total_ns, 0) / span,
        }


def parse_timing(text: str) -> dict[str, DirectionTiming]:
    """The driver's ``timing`` parameter: one line per direction,
    ``inflate requests=N pfns=N alloc_ns=N ...``."""
    out = {}
    fields = {f.name for f in dataclasses.fields(DirectionTiming)}
    for line in text.strip().splitlines():
        name, *pairs = line.split()
        values = dict(p.split("=", 1) for p in pairs)
        out[name] = DirectionTiming(**{k: int(v) for k, v in values.items() if k in fields})
    if set(out) != {"inflate", "deflate"}:
        raise GuestError(f"unexpected {MODULE} timing text: {text.strip()[:200]!r}")
    return out


class VariantDriver:
    """One guest's balloon driver: the stock one or the variant.

    ``vm`` is a Machine (ssh, qmp); ``ctl`` its BalloonController."""

    def __init__(self, vm: Any, ctl: Any, ko: Any) -> None:
        self.vm, self.ctl, self.ko = vm, ctl, ko
        self.loaded: int | None = None  # PFNs per request of the loaded variant
        self.taint: int | None = None

    def _sh(self, script: str, check: bool = True, timeout: float = 60.0) -> Any:
        return self.vm.ssh.run(["sh", "-c", script], check=check, timeout=timeout)

    def deploy(self) -> None:
        self.vm.ssh.push(self.ko, GUEST_KO, 0o644)

    def load(self, pfns: int) -> str:
        """Swap in the variant at ``pfns`` per request; return its probe line.
        A size the driver refuses fails here with the driver's own line."""
        self._sh(f"rmmod {MODULE} 2>/dev/null; rmmod {STOCK} 2>/dev/null; true")
        result = self._sh(f"insmod {GUEST_KO} pfns_per_request={shlex.quote(str(pfns))}", check=False)
        if result.status != 0:
            refusal = [
                line
                for line in self._sh("dmesg | tail -5").stdout.splitlines()
                if MODULE in line and f"pfns_per_request={pfns} refused" in line
            ]
            self.loaded = None
            raise BadInput(
                f"{MODULE} refused pfns_per_request={pfns}: "
                + (refusal[-1].split("] ", 1)[-1] if refusal else result.stderr.strip())
            )
        bound = self._sh(
            f"ls /sys/bus/virtio/drivers/{MODULE}/ | grep -c '^virtio'; "
            f"cat {PARAMS}/pfns_per_request /proc/sys/kernel/tainted"
        ).stdout.split()
        if bound[0] == "0" or int(bound[1]) != pfns:
            raise GuestError(f"{MODULE} loaded but bound to no balloon device (or at {bound[1]} PFNs)")
        self.loaded, self.taint = pfns, int(bound[2])
        self.check_drives()
        probe = [line for line in self._sh("dmesg | tail -20").stdout.splitlines() if "memqual variant" in line]
        return probe[-1].split("] ", 1)[-1] if probe else ""

    def check_drives(self) -> None:
        """Through QMP: a small target moves ``actual`` there and back, and
        the variant's counters saw those pages."""
        ram = self.ctl.ram_bytes()
        self.reset_timing()
        there = self.ctl.reach(ram - PROBE_BYTES, deadline_s=30)
        back = self.ctl.reach(ram, deadline_s=30)
        counted = self.timing()["inflate"].pfns
        self.reset_timing()
        if not (there.reached and back.reached) or counted != PROBE_BYTES // PAGE:
            raise GuestError(
                f"{MODULE} does not drive the balloon: QMP moved {there.actual_bytes} / "
                f"{back.actual_bytes}, the driver counted {counted} pages"
            )

    def timing(self) -> dict[str, DirectionTiming]:
        return parse_timing(self._sh(f"cat {PARAMS}/timing").stdout)

    def reset_timing(self) -> None:
        self._sh(f"echo 1 > {PARAMS}/timing")

    def restore_stock(self) -> None:
        """The stock driver back, checked: bound, and it moves the balloon."""
        self._sh(f"rmmod {MODULE} 2>/dev/null; modprobe {STOCK}")
        self.loaded = None
        n = self._sh(f"ls /sys/bus/virtio/drivers/{STOCK}/ | grep -c '^virtio'", check=False).stdout.strip()
        ram = self.ctl.ram_bytes()
        there = self.ctl.reach(ram - PROBE_BYTES, deadline_s=30)
        back = self.ctl.reach(ram, deadline_s=30)
        if n != "1" or not (there.reached and back.reached):
            raise GuestError(f"the stock {STOCK} did not come back (bound devices: {n})")


def qemu_cpu_s(pid: int) -> float:
    """CPU seconds QEMU's threads have run (schedstat, ns): what an inflate
    costs the host whatever else competes for the cores, where wall time
    grows with every other guest's load."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between listdir and open
    return total / 1e9


def taint_flags(value: int) -> str:
    """The letters the kernel prints for a taint mask we expect to see."""
    letters = {12: "O (out-of-tree)", 13: "E (unsigned)"}
    return ", ".join(v for bit, v in letters.items() if value >> bit & 1) or str(value)

"""The balloon driver variant in a guest (issue 12): push virtio_balloon_mq.ko
over SSH, swap it for the stock virtio_balloon with a chosen number of PFNs
per request, prove through QMP that it drives the device, read its
guest-clock counters, and put the stock driver back.

Also the pieces the scenario and its tests share: the request sizes scaled
to the guest (the seed's bitmaps covered 1/16, 1/8 and all of a 16 GB
guest), the interleaved plan, and the fit
``seconds = fixed + requests x per_request + pages x per_page`` with
confidence intervals from the independent guests.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shlex
from typing import Any, Sequence

import numpy as np

from host.errors import BadInput, GuestError

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
PAGE = 4096
PROBE_BYTES = 4 << 20  # the QMP check that the loaded driver moves the balloon


def check_pfns(pfns: int) -> int:
    """Refuse, before anything boots, a size the driver would refuse."""
    if not isinstance(pfns, int) or pfns < 1 or pfns > PFNS_MAX:
        raise BadInput(f"PFNs per request {pfns!r}: give 1..{PFNS_MAX} (the driver's one-buffer limit)")
    return pfns


def request_sizes(guest_mib: int) -> dict[str, int]:
    """The seed's three bitmaps scaled to this guest (32 KB covered 1 GB of
    16 GB: 1/16; 64 KB 1/8; 512 KB all of it) and the stock 256."""
    pages = guest_mib * (1 << 20) // PAGE
    return {"256 pfns": STOCK_PFNS, "1/16 guest": pages // 16, "1/8 guest": pages // 8, "whole guest": pages}


def interleaved(labels: Sequence[str], guest_index: int) -> list[str]:
    """The sizes in an order rotated per guest, so no size always runs
    first in a fresh guest or last in a tired host minute."""
    k = guest_index % len(labels)
    return list(labels[k:]) + list(labels[:k])


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
            refusal = [line for line in self._sh("dmesg | tail -5").stdout.splitlines()
                       if MODULE in line and f"pfns_per_request={pfns} refused" in line]
            self.loaded = None
            raise BadInput(f"{MODULE} refused pfns_per_request={pfns}: "
                           + (refusal[-1].split("] ", 1)[-1] if refusal else result.stderr.strip()))
        bound = self._sh(f"ls /sys/bus/virtio/drivers/{MODULE}/ | grep -c '^virtio'; "
                         f"cat {PARAMS}/pfns_per_request /proc/sys/kernel/tainted").stdout.split()
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
            raise GuestError(f"{MODULE} does not drive the balloon: QMP moved {there.actual_bytes} / "
                             f"{back.actual_bytes}, the driver counted {counted} pages")

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


# -- the fit ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Inflate:
    guest: int  # index of the fresh guest (the independent unit)
    pages: int
    requests: int
    seconds: float


def _ols(rows: Sequence[Inflate]) -> np.ndarray:
    a = np.array([[1.0, r.requests, r.pages] for r in rows])
    y = np.array([r.seconds for r in rows])
    scale = np.linalg.norm(a, axis=0)
    coef, *_ = np.linalg.lstsq(a / scale, y, rcond=None)
    return coef / scale


def fit_costs(rows: Sequence[Inflate], resamples: int = 2000, seed: int = 12) -> dict[str, Any]:
    """seconds = fixed + requests x per_request + pages x per_page, least
    squares; 95 % intervals by resampling whole guests (the independent
    units) with replacement and refitting."""
    if len({r.pages for r in rows}) < 2 or len({r.requests for r in rows}) < 2:
        raise ValueError("the fit needs inflates of two sizes and two request counts")
    a = np.array([[1.0, r.requests, r.pages] for r in rows])
    if np.linalg.matrix_rank(a) < 3:
        raise ValueError("requests and pages move together: the costs are not identifiable")
    point = _ols(rows)
    guests = sorted({r.guest for r in rows})
    by_guest = {g: [r for r in rows if r.guest == g] for g in guests}
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        sample = [r for g in rng.choices(guests, k=len(guests)) for r in by_guest[g]]
        b = np.array([[1.0, r.requests, r.pages] for r in sample])
        if np.linalg.matrix_rank(b) == 3:
            draws.append(_ols(sample))
    residual = np.array([r.seconds for r in rows]) - a @ point
    out: dict[str, Any] = {
        "n_inflates": len(rows),
        "n_guests": len(guests),
        "residual_rms_s": float(np.sqrt(np.mean(residual**2))),
        "ci": "95 %, percentile bootstrap over guests" + (" (few guests: coarse)" if len(guests) < 5 else ""),
    }
    for i, name in enumerate(("fixed_s", "per_request_s", "per_page_s")):
        values = sorted(float(d[i]) for d in draws)
        low = values[int(0.025 * (len(values) - 1))] if values else math.nan
        high = values[int(math.ceil(0.975 * (len(values) - 1)))] if values else math.nan
        out[name] = {"value": float(point[i]), "low": low, "high": high}
    return out


def requests_for(pages: int, pfns: int) -> int:
    return math.ceil(pages / pfns)


def taint_flags(value: int) -> str:
    """The letters the kernel prints for a taint mask we expect to see."""
    letters = {12: "O (out-of-tree)", 13: "E (unsigned)"}
    return ", ".join(v for bit, v in letters.items() if value >> bit & 1) or str(value)


# -- by hand: memqual balloon measure --pfns-per-request N[,N...] -----------
def parse_sizes(text: str) -> list[int]:
    """``256,16384`` -> [256, 16384]; BadInput (exit 2) before anything boots."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"--pfns-per-request {text!r}: give whole numbers, comma-separated (e.g. 256,262144)") from None
    if not sizes:
        raise BadInput("--pfns-per-request: give at least one size")
    for n in sizes:
        check_pfns(n)
    return list(dict.fromkeys(sizes))


def measure_sizes(config: Any, sizes: Sequence[int], image: Any, console: Any = None) -> dict[str, Any]:
    """One guest, the variant at each size in turn (order rotated every
    repeat): inflate to ``config.target_mib`` and back, timed by QMP, with
    the driver's requests and breakdown.  The stock driver goes back at the
    end.  Stops at the guest's floor (the balloon given back over QMP at
    once) with ``reached`` False."""
    import statistics

    from host.balloon import BalloonController
    from host.machine import BalloonDevice, Machine, MachineConfig
    from images import balloon_driver

    variant = balloon_driver.build(str(image.release))
    machine_config = MachineConfig(memory_mib=config.memory_mib, machine=config.machine, warm=config.warm,
                                   balloon=BalloonDevice())
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    reached = True
    with Machine(machine_config, image=image) as vm:
        ctl = BalloonController(vm, device_id="balloon0")
        driver = VariantDriver(vm, ctl, variant.ko)
        driver.deploy()
        ram = ctl.ram_bytes()
        target = config.target_mib * (1 << 20)
        for repeat in range(config.repeats):
            for n in interleaved([str(s) for s in sizes], repeat):
                driver.load(int(n))
                up = ctl.reach(target, deadline_s=120.0, stall_s=0.6)
                if not up.reached:
                    ctl.reach(ram, deadline_s=120.0)
                    reached = False
                    break
                inflate = driver.timing()["inflate"]
                down = ctl.reach(ram, deadline_s=120.0)
                runs[int(n)].append({"seconds": up.seconds, "requests": inflate.requests, "pfns": inflate.pfns,
                                     "deflate_s": down.seconds, "breakdown_pct": inflate.breakdown()})
                if console is not None:
                    console.print(f"repeat {repeat + 1}/{config.repeats}: {n} PFNs per request: "
                                  f"{up.moved_bytes >> 20} MiB in {up.seconds:.3f} s, {inflate.requests} requests",
                                  highlight=False)
            if not reached:
                break
        driver.restore_stock()
        taint = driver.taint
    out: dict[str, Any] = {"memory_mib": config.memory_mib, "target_mib": config.target_mib, "reached": reached,
                           "taint": taint, "driver": variant.to_json(), "sizes": {}}
    for n, done in runs.items():
        if not done:
            continue
        secs = [r["seconds"] for r in done]
        out["sizes"][str(n)] = {
            "median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs), "n": len(secs),
            "gbps": statistics.median([r["pfns"] * PAGE / r["seconds"] / 1e9 for r in done]),
            "requests": statistics.median([r["requests"] for r in done]),
            "host_wait_pct": statistics.median([r["breakdown_pct"]["host_wait_pct"] for r in done]),
            "alloc_pct": statistics.median([r["breakdown_pct"]["alloc_pct"] for r in done]),
            "runs": done,
        }  # fmt: skip
    return out


def print_sizes(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"balloon driver variant: {result['memory_mib']} MiB guest down to "
                        f"{result['target_mib']} MiB, by PFNs per request")
    for column in ("PFNs/request", "median s", "min s", "max s", "GB/s", "requests", "host wait %", "alloc %"):
        table.add_column(column, justify="right")
    for n, s in result["sizes"].items():
        table.add_row(n, f"{s['median_s']:.3f}", f"{s['min_s']:.3f}", f"{s['max_s']:.3f}", f"{s['gbps']:.2f}",
                      f"{s['requests']:.0f}", f"{s['host_wait_pct']:.1f}", f"{s['alloc_pct']:.1f}")
    console.print(table)

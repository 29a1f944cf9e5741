"""virtio-mem from the host: the device's command line, plug and unplug
through QMP (``requested-size``), and the memslots its memory occupies.

virtio-mem resizes a guest in blocks: the host sets ``requested-size``, the
guest's driver plugs or unplugs blocks until the device's ``size`` meets
it.  A request the guest cannot meet (its memory is in use) leaves ``size``
above the request while the driver retries; ``resize`` reports that as an
unmet result with the size reached, never waits without a deadline.

With ``dynamic-memslots=on`` (QEMU 8.2 and later) QEMU splits the device's
memory into several memslots and maps only those that hold plugged
blocks, so the flat view's ranges of the device's memory backend are its
memslots.  Whether a QEMU has the property is asked of the running QEMU
(``device-list-properties``), never assumed from its version.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from memqual.host.core.flatview import FlatRange, parse_flatview
from memqual.host.core.polling import poll
from memqual.host.core.profiles import AB, FULL, QUICK
from memqual.host.core.record import Measurement
from memqual.host.core.scenario import Scenario

MIB = 1 << 20
DEVICE = "virtio-mem-pci"
DYNAMIC_MEMSLOTS = "dynamic-memslots"


class QmpMachine(Protocol):
    def qmp(self, command: str, **arguments: Any) -> Any: ...

    def hmp(self, command_line: str) -> str: ...


@dataclasses.dataclass(frozen=True)
class VirtioMemDevice:
    """One virtio-mem device and its memory backend."""

    size_mib: int  # the backend: the most the device can plug
    block_mib: int = 2
    dynamic_memslots: bool = False
    id: str = "vmem0dev"
    memdev: str = "vmem0"
    # False: the backend is mapped without reserving swap space
    # (MAP_NORESERVE), so a device far larger than the host's free memory
    # can be created; only plugged blocks the guest writes take memory.
    reserve: bool = True

    def args(self) -> tuple[str, ...]:
        device = f"{DEVICE},id={self.id},memdev={self.memdev},block-size={self.block_mib}M,requested-size=0"
        if self.dynamic_memslots:
            device += f",{DYNAMIC_MEMSLOTS}=on"
        backend = f"memory-backend-ram,id={self.memdev},size={self.size_mib}M"
        if not self.reserve:
            backend += ",reserve=off"
        return ("-object", backend, "-device", device)

    @property
    def qom_path(self) -> str:
        return f"/machine/peripheral/{self.id}"


def device_properties(vm: QmpMachine, device: str = DEVICE) -> frozenset[str]:
    """The properties the running QEMU's ``device`` has (empty: no such device)."""
    try:
        reply = vm.qmp("device-list-properties", typename=device)
    except Exception:  # QEMU refuses an unknown type: the device is not there
        return frozenset()
    return frozenset(str(p["name"]) for p in reply)


@dataclasses.dataclass(frozen=True)
class Resize:
    """One ``requested-size`` change as the host saw it."""

    requested_bytes: int
    start_bytes: int
    size_bytes: int  # the device's size when the wait ended
    met: bool
    seconds: float  # from the request to the first poll that saw it met (or the deadline)
    polls: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def size_bytes(vm: QmpMachine, device: VirtioMemDevice) -> int:
    return int(vm.qmp("qom-get", path=device.qom_path, property="size"))


def request(vm: QmpMachine, device: VirtioMemDevice, requested_bytes: int) -> None:
    vm.qmp("qom-set", path=device.qom_path, property="requested-size", value=requested_bytes)


def resize(
    vm: QmpMachine,
    device: VirtioMemDevice,
    requested_bytes: int,
    deadline_s: float,
    period_s: float = 0.002,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> Resize:
    """Request ``requested_bytes`` and poll ``size`` until it is met or the
    deadline passes (then ``met`` is False: the guest could not give or
    take that much, and ``size_bytes`` says how far it got)."""
    start = size_bytes(vm, device)
    began = clock()
    request(vm, device, requested_bytes)
    # The deadline and the time count from ``began``, before the request.
    requested_s = clock() - began
    polled = poll(
        lambda: size_bytes(vm, device),
        max(0.0, deadline_s - requested_s),
        period_s,
        what=f"virtio-mem size {requested_bytes}",
        until=lambda size: size == requested_bytes,
        clock=clock,
        sleep=sleep,
        raise_on_timeout=False,
    )
    return Resize(requested_bytes, start, polled.value, polled.met, requested_s + polled.elapsed_s, polled.polls)


def device_ranges(ranges: Sequence[FlatRange], device: VirtioMemDevice) -> list[FlatRange]:
    """The flat view's RAM ranges of the device's memory: its memslots."""
    return [r for r in ranges if r.kind == "ram" and r.name == device.memdev]


def memslots(vm: QmpMachine, device: VirtioMemDevice) -> list[FlatRange]:
    """The memslots the device's memory occupies now, from ``info mtree -f``."""
    return device_ranges(parse_flatview(vm.hmp("info mtree -f")), device)


def device_base(vm: QmpMachine, device: VirtioMemDevice) -> int:
    """The guest-physical address of the device's memory."""
    return int(vm.qmp("qom-get", path=device.qom_path, property="memaddr"))


# -- resize timing (e2e/test_virtio_mem.py's test_resize_timing) -----------
RESIZE_FIGURES = ("grow_s", "grow_guest_s", "shrink_s", "shrink_guest_s", "balloon_inflate_s")
# One resize timed by the host (the Resize) and by the guest (seconds until
# MemTotal changed); one balloon inflate of the same size, its seconds.
TimedResize = Callable[[int], tuple[Resize, float]]
TimedInflate = Callable[[int], float]


class ResizeFailed(Exception):
    """A resize the timing scenario asked for was not met."""


@dataclasses.dataclass(frozen=True)
class ResizeTiming:
    """One size's cycles: grow, shrink and a balloon inflate of the same
    size, each timed ``repeats`` times in one guest (samples of one
    replicate)."""

    size_mib: int
    figures: dict[str, list[float]]

    @property
    def shrink_over_inflate(self) -> float:
        """The medians' ratio: what a shrink costs against a balloon inflate."""
        return _median(self.figures["shrink_s"]) / max(_median(self.figures["balloon_inflate_s"]), 1e-9)

    def records(self, base_mib: int, block_mib: int) -> list[Measurement]:
        return [
            Measurement(
                scenario="virtio_mem.resize",
                metric=metric,
                unit="s",
                better="lower",
                samples=samples,
                settings={"size_mib": self.size_mib, "base_mib": base_mib, "block_mib": block_mib},
                extra={"shrink_over_balloon_inflate": self.shrink_over_inflate} if metric == "shrink_s" else {},
            )
            for metric, samples in self.figures.items()
        ]


def _median(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 2]


def time_resizes(
    timed_resize: TimedResize, timed_inflate: TimedInflate, sizes_mib: Sequence[int], repeats: int
) -> list[ResizeTiming]:
    """For each size: grow to it, shrink to 0, inflate the balloon by it,
    ``repeats`` times; ResizeFailed when a resize is not met."""
    timings = []
    for size_mib in sizes_mib:
        figures: dict[str, list[float]] = {name: [] for name in RESIZE_FIGURES}
        for _ in range(repeats):
            grow, grow_guest = timed_resize(size_mib * MIB)
            shrink, shrink_guest = timed_resize(0)
            for done in (grow, shrink):
                if not done.met:
                    raise ResizeFailed(f"virtio-mem did not reach {done.requested_bytes >> 20} MiB: {done}")
            inflate_s = timed_inflate(size_mib * MIB)
            for name, value in zip(
                RESIZE_FIGURES, (grow.seconds, grow_guest, shrink.seconds, shrink_guest, inflate_s), strict=True
            ):
                figures[name].append(value)
        timings.append(ResizeTiming(size_mib, figures))
    return timings


BASE_MIB = 512  # the guest's base memory beside the device


@dataclasses.dataclass(frozen=True)
class Plan:
    """The resize and memslots scenarios' sizes in one profile."""

    # Quick: one size, two cycles (a guest's cycles are samples of one
    # replicate); full: 1 GiB and 3/4 of the guest, five cycles.
    sizes_mib: tuple[int, ...]
    repeats: int
    # QEMU sizes the memslots itself (about 1 GiB each here): steps that
    # cross slot boundaries.  Unplugging under TCG costs seconds per GiB.
    dyn_device_mib: int
    dyn_steps_mib: tuple[int, ...]
    # Then the whole device plugged and left so (the guest is shut down,
    # not unplugged: unplugging is the slow part under TCG): the most
    # memslots this guest maps, recorded as a layout beside the others.
    # Its memmap (64 bytes a 4 KiB page) comes from the base memory.
    dyn_large_mib: int = 8192


PLANS = {
    QUICK: Plan((256,), 2, 2048, (0, 512, 2048, 0)),
    FULL: Plan((1024, 3 * BASE_MIB // 4), 5, 4096, (0, 512, 1536, 3072, 1024, 0)),
    AB: Plan((256,), 2, 2048, (0, 512, 2048, 0)),
}
# The scenario table's rows (host/core/scenario.py); the memslot counts a
# plugged device makes are also recorded as memslots.kvm_lookup, memslots' row.
RESIZE = Scenario("virtio_mem.resize", ("virtio_mem",), PLANS, e2e="test_virtio_mem:VirtioMem.test_resize_timing")
MEMSLOTS = Scenario(
    "virtio_mem.memslots", ("virtio_mem",), PLANS, e2e="test_virtio_mem:VirtioMem.test_dynamic_memslots"
)
SCENARIOS = (RESIZE, MEMSLOTS)

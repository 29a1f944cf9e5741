"""virtio-mem from the host: the device's command line, plug and unplug
through QMP (``requested-size``), the memslots its memory occupies, and the
procedures of e2e/test_virtio_mem.py (plug and unplug, the plugged states,
the resize timing), tested on fakes.

``resize`` never waits without a deadline: a request the guest cannot meet
is an unmet result with the size reached.  docs/memslots-model.md,
"host/virtio_mem.py", says how dynamic memslots map the device."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from memqual.host.core import host_code
from memqual.host.core.errors import GuestError
from memqual.host.core.flatview import FlatRange, parse_flatview
from memqual.host.core.polling import poll
from memqual.host.core.profiles import AB, FULL, QUICK
from memqual.host.core.record import Measurement
from memqual.host.core.scenario import Scenario
from memqual.host.core.shell import Shell

MIB = 1 << 20
DEVICE = "virtio-mem-pci"
DYNAMIC_MEMSLOTS = "dynamic-memslots"


class QmpMachine(Protocol):
    def qmp(self, command: str, **arguments: Any) -> Any: ...

    def hmp(self, command_line: str) -> str: ...


class Guest(QmpMachine, Protocol):
    """A booted guest: host/core/machine.py's Machine, or a fake."""

    @property
    def ssh(self) -> Shell: ...


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
    before_polls: Callable[[], object] | None = None,
) -> Resize:
    """Request ``requested_bytes`` and poll ``size`` until it is met or the
    deadline passes (then ``met`` is False: the guest could not give or
    take that much, and ``size_bytes`` says how far it got).
    ``before_polls`` runs between the request and the first poll (a quiet
    resize waits there for the guest's own report)."""
    start = size_bytes(vm, device)
    began = clock()
    request(vm, device, requested_bytes)
    if before_polls is not None:
        before_polls()
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


class ResizeFailed(GuestError):
    """A resize a scenario asked for was not met."""


# -- the guest's side --------------------------------------------------------
AGENT = "vmem_agent"
RESIZE_DEADLINE_S = 60.0


def mem_total_kib(ssh: Shell) -> int:
    for line in ssh.run(["cat", "/proc/meminfo"]).stdout.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise GuestError("no MemTotal in the guest's /proc/meminfo")


def agent_field(line: str, key: str) -> int:
    """``key=<int>`` of one vmem_agent line."""
    for part in line.split():
        if part.startswith(key + "="):
            return int(part.split("=", 1)[1])
    raise GuestError(f"no {key}= in vmem_agent line {line!r}")


# A quiet resize's reads of QOM's size once the guest has seen it: a
# host under test's guest has done its part by then, and a poll is an
# interrupt of L1 (docs/host-under-test.md, "virtio-mem on L1's clock").
QUIET_PERIOD_S = 0.5


def guest_timed(
    vm: Guest,
    agent: str,
    device: VirtioMemDevice,
    target_bytes: int,
    base_kib: int,
    quiet: bool = False,
    deadline_s: float = RESIZE_DEADLINE_S,
) -> tuple[Resize, float]:
    """One resize, timed by the host (QOM size) and by the guest (seconds
    until its MemTotal changed); ResizeFailed when either side missed it.
    ``quiet`` (a host under test): nothing is polled while the guest
    resizes; QOM's size is read once the guest saw its MemTotal reach the
    target (the host's seconds then time that wait, nothing finer)."""
    watch = vm.ssh.start([agent, "watch", str(base_kib + target_bytes // 1024), str(deadline_s)])
    lines = watch.lines(timeout=deadline_s)
    armed = next(lines, "")
    if armed != "watching":
        raise ResizeFailed(f"vmem_agent watch did not start: {armed!r}")
    seen: list[str] = []
    if quiet:
        result = resize(
            vm, device, target_bytes, deadline_s, QUIET_PERIOD_S, before_polls=lambda: seen.append(next(lines, ""))
        )
    else:
        result = resize(vm, device, target_bytes, deadline_s)
        seen.append(next(lines, ""))
    reached = seen[0]
    watch.wait(timeout=deadline_s)
    if not result.met:
        raise ResizeFailed(f"virtio-mem did not reach {target_bytes >> 20} MiB: {result}")
    if not reached.startswith("reached "):
        raise ResizeFailed(f"the guest never saw MemTotal change: {reached!r}")
    return result, float(reached.split("=", 1)[1])


# -- plug and unplug (e2e/test_virtio_mem.py's test_plug_unplug) -------------
# A request the guest cannot meet: how long it is watched not being met.
# The driver's retries are far apart (its timer starts at 50 s), so a few
# seconds show the state it stays in without waiting for a retry.
UNMET_WINDOW_S = 5.0
# Plugged, then filled with the pattern, beyond what the base memory could
# take back: unplugging all of it cannot succeed while the agent holds it.
# The guest has less base memory than the others, so the fill (the slowest
# step under TCG) can be small and still be more than the base can take.
PLUG_BASE_MIB = 256
PLUG_DEVICE_MIB = 512
PLUG_MIB = 384
FILL_MIB = 320
PARTIAL_MIB = 32  # unplugged while the fill holds its pages
# Share of what the last unplug takes away that must leave QEMU's RSS
# (QEMU discards unplugged blocks at once).
RSS_RETURNED = 0.8
RSS_DEADLINE_S = 10.0


@dataclasses.dataclass(frozen=True)
class PlugUnplug:
    """What the plug and unplug scenario saw, step by step."""

    base_kib: int  # the guest's MemTotal before any plug
    plugged: Resize  # PLUG_MIB plugged
    total_plugged_kib: int
    filled: str  # the agent's line after its fill
    rss_before_kib: int
    rss_filled_kib: int
    partial: Resize  # PARTIAL_MIB unplugged under the fill
    verified: str  # the agent's line after checking its pattern
    unmet: Resize  # everything unplugged while the fill is held
    answered: bool  # the guest answered SSH after that
    killed: list[str]  # the guest's OOM kills of the agent
    holder_status: int
    still_plugged_bytes: int
    rss_held_kib: int
    emptied: Resize  # everything unplugged once the fill let go
    total_emptied_kib: int
    rss_returned: bool  # RSS_RETURNED of what was still plugged left QEMU's RSS
    rss_after_kib: int
    rss_waited_s: float

    @property
    def in_range_share(self) -> float:
        return agent_field(self.filled, "in_range") / agent_field(self.filled, "pages")


def run_plug_unplug(
    vm: Guest,
    device: VirtioMemDevice,
    agent: str,
    rss_kib: Callable[[], int],
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> PlugUnplug:
    """Plug PLUG_MIB, fill FILL_MIB of it with a pattern (user pages land in
    ZONE_MOVABLE first), unplug PARTIAL_MIB under the fill and check the
    pattern, ask for everything while the fill is held (a clear state within
    UNMET_WINDOW_S: unmet with the holder alive, or met after the guest's
    OOM killer ended the holder), then release and unplug everything.
    ``rss_kib`` reads QEMU's resident memory."""

    def resized(requested_bytes: int, deadline_s: float) -> Resize:
        return resize(vm, device, requested_bytes, deadline_s, clock=clock, sleep=sleep)

    base_kib = mem_total_kib(vm.ssh)
    rss_before = rss_kib()
    plugged = resized(PLUG_MIB * MIB, RESIZE_DEADLINE_S)
    if not plugged.met:
        raise ResizeFailed(f"virtio-mem did not plug {PLUG_MIB} MiB: {plugged}")
    # The device counts a block plugged when it answers the driver's
    # request; the guest adds and onlines the block after that answer, so
    # MemTotal may lag the device's size by the last block for a moment
    # (seen beside another guest: 128 MiB short).
    want_kib = base_kib + PLUG_MIB * 1024
    total_plugged = poll(
        lambda: mem_total_kib(vm.ssh),
        RESIZE_DEADLINE_S,
        0.1,
        what="the guest's MemTotal",
        until=lambda kib: kib >= want_kib,
        clock=clock,
        sleep=sleep,
        raise_on_timeout=False,
    ).value
    start = device_base(vm, device)
    fill = vm.ssh.start([agent, "fill", str(FILL_MIB), "0x5eed", hex(start), hex(start + device.size_mib * MIB), "120"])
    lines = fill.lines(timeout=120)
    filled = next(lines, "")
    rss_filled = rss_kib()
    # 32 MiB of the plugged memory, which the agent's pages may or may not
    # occupy (then the kernel migrates them first).
    partial = resized((PLUG_MIB - PARTIAL_MIB) * MIB, RESIZE_DEADLINE_S)
    vm.ssh.run(["touch", "/tmp/vmem.verify"])
    verified = next(lines, "")
    unmet = resized(0, UNMET_WINDOW_S)
    answered = vm.ssh.run(["true"], check=False).status == 0
    dmesg = vm.ssh.run(["dmesg"]).stdout.splitlines()
    killed = [line for line in dmesg if f"({AGENT})" in line and "Killed" in line]
    vm.ssh.run(["touch", "/tmp/vmem.release"])
    holder = fill.wait(timeout=60)
    # Memory free again: the same request is met (asked anew, as the
    # driver's own retry may be a minute away).  What the last unplug takes
    # away was written by the agent (its pages that migrated into the base
    # memory stay resident there), so QEMU's RSS falls by it.
    still_plugged = size_bytes(vm, device)
    rss_held = rss_kib()
    request(vm, device, still_plugged)
    emptied = resized(0, RESIZE_DEADLINE_S)
    total_emptied = mem_total_kib(vm.ssh)
    expected_kib = RSS_RETURNED * still_plugged / 1024
    fallen = poll(
        rss_kib,
        RSS_DEADLINE_S,
        0.1,
        what="QEMU's RSS",
        until=lambda rss: rss_held - rss >= expected_kib,
        clock=clock,
        sleep=sleep,
        raise_on_timeout=False,
    )
    return PlugUnplug(
        base_kib=base_kib,
        plugged=plugged,
        total_plugged_kib=total_plugged,
        filled=filled,
        rss_before_kib=rss_before,
        rss_filled_kib=rss_filled,
        partial=partial,
        verified=verified,
        unmet=unmet,
        answered=answered,
        killed=killed,
        holder_status=holder.status,
        still_plugged_bytes=still_plugged,
        rss_held_kib=rss_held,
        emptied=emptied,
        total_emptied_kib=total_emptied,
        rss_returned=fallen.met,
        rss_after_kib=fallen.value,
        rss_waited_s=fallen.elapsed_s,
    )


# -- dynamic memslots (e2e/test_virtio_mem.py's test_dynamic_memslots) -------
@dataclasses.dataclass(frozen=True)
class PluggedState:
    """The flat view with ``size_mib`` plugged."""

    size_mib: int
    resized: Resize
    ranges: list[FlatRange]
    device_slots: list[FlatRange]


def plug_states(vm: QmpMachine, device: VirtioMemDevice, steps_mib: Sequence[int]) -> list[PluggedState]:
    """Resize to each of ``steps_mib`` in turn and read the flat view there;
    ResizeFailed when a step is not met."""
    states = []
    for size_mib in steps_mib:
        resized = resize(vm, device, size_mib * MIB, RESIZE_DEADLINE_S)
        if not resized.met:
            raise ResizeFailed(f"virtio-mem did not reach {size_mib} MiB: {resized}")
        ranges = parse_flatview(vm.hmp("info mtree -f"))
        states.append(PluggedState(size_mib, resized, ranges, device_ranges(ranges, device)))
    return states


# -- resize timing (e2e/test_virtio_mem.py's test_resize_timing) -----------
RESIZE_FIGURES = ("grow_s", "grow_guest_s", "shrink_s", "shrink_guest_s", "balloon_inflate_s")
# On a host under test only the guest's clock (L1's) times anything: this
# machine's polls would be L1's work, and its wall clock is not the host's.
GUEST_FIGURES = ("grow_guest_s", "shrink_guest_s", "balloon_inflate_guest_s")
# One resize timed by the host (the Resize) and by the guest (seconds until
# MemTotal changed); one balloon inflate of the same size, its seconds.
TimedResize = Callable[[int], tuple[Resize, float]]
TimedInflate = Callable[[int], float]


@dataclasses.dataclass(frozen=True)
class ResizeTiming:
    """One size's cycles: grow, shrink and a balloon inflate of the same
    size, each timed ``repeats`` times in one guest (samples of one
    replicate)."""

    size_mib: int
    figures: dict[str, list[float]]

    @property
    def _ratio_figures(self) -> tuple[str, str]:
        """The shrink and the inflate compared: the host's figures where it
        timed them, else the guest's."""
        if "shrink_s" in self.figures:
            return "shrink_s", "balloon_inflate_s"
        return "shrink_guest_s", "balloon_inflate_guest_s"

    @property
    def shrink_over_inflate(self) -> float:
        """The medians' ratio: what a shrink costs against a balloon inflate."""
        shrink, inflate = self._ratio_figures
        return _median(self.figures[shrink]) / max(_median(self.figures[inflate]), 1e-9)

    def records(self, base_mib: int, block_mib: int, settings: dict[str, object] | None = None) -> list[Measurement]:
        shrink, _ = self._ratio_figures
        return [
            Measurement(
                scenario="virtio_mem.resize",
                metric=metric,
                unit="s",
                better="lower",
                samples=samples,
                settings={"size_mib": self.size_mib, "base_mib": base_mib, "block_mib": block_mib, **(settings or {})},
                extra={"shrink_over_balloon_inflate": self.shrink_over_inflate} if metric == shrink else {},
            )
            for metric, samples in self.figures.items()
        ]


def _median(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 2]


def time_resizes(
    timed_resize: TimedResize,
    timed_inflate: TimedInflate,
    sizes_mib: Sequence[int],
    repeats: int,
    host_timed: bool = True,
) -> list[ResizeTiming]:
    """For each size: grow to it, shrink to 0, inflate the balloon by it,
    ``repeats`` times; ResizeFailed when a resize is not met.  Without
    ``host_timed`` (a host under test) only the guest's figures are kept
    (``GUEST_FIGURES``: ``timed_inflate`` is then the guest's too)."""
    timings = []
    names = RESIZE_FIGURES if host_timed else GUEST_FIGURES
    for size_mib in sizes_mib:
        figures: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(repeats):
            grow, grow_guest = timed_resize(size_mib * MIB)
            shrink, shrink_guest = timed_resize(0)
            for done in (grow, shrink):
                if not done.met:
                    raise ResizeFailed(f"virtio-mem did not reach {done.requested_bytes >> 20} MiB: {done}")
            inflate_s = timed_inflate(size_mib * MIB)
            values = {
                "grow_s": grow.seconds,
                "grow_guest_s": grow_guest,
                "shrink_s": shrink.seconds,
                "shrink_guest_s": shrink_guest,
                "balloon_inflate_s": inflate_s,
                "balloon_inflate_guest_s": inflate_s,
            }
            for name in names:
                figures[name].append(values[name])
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
# The guest code they run (Scenario.kernel_paths): the driver and memory
# hot(un)plug; the resize's timings also inflate the balloon by each size.
VIRTIO_MEM_PATHS = (
    "drivers/virtio/virtio_mem.c",
    "include/uapi/linux/virtio_mem.h",
    "mm/memory_hotplug.c",
    "include/linux/memory_hotplug.h",
    "drivers/base/memory.c",
    "include/linux/memory.h",
    "mm/page_isolation.c",
    "include/linux/page-isolation.h",
)
# On the host (Scenario.host_paths): QEMU's device maps and unmaps its
# memslots in KVM as blocks are plugged, faults the plugged memory in and
# gives the unplugged back with madvise.
VIRTIO_MEM_HOST_PATHS = host_code.joined(host_code.KVM, host_code.ANON_FAULT, host_code.GIVE_BACK)
RESIZE = Scenario(
    "virtio_mem.resize",
    ("virtio_mem",),
    PLANS,
    e2e="test_virtio_mem:VirtioMem.test_resize_timing",
    on_a_host_under_test=True,
    kernel_paths=(
        *VIRTIO_MEM_PATHS,
        "drivers/virtio/virtio_balloon.c",
        "include/uapi/linux/virtio_balloon.h",
        "mm/balloon_compaction.c",
        "include/linux/balloon_compaction.h",
    ),
    host_paths=VIRTIO_MEM_HOST_PATHS,
)
MEMSLOTS = Scenario(
    "virtio_mem.memslots",
    ("virtio_mem",),
    PLANS,
    e2e="test_virtio_mem:VirtioMem.test_dynamic_memslots",
    kernel_paths=VIRTIO_MEM_PATHS,
    host_paths=VIRTIO_MEM_HOST_PATHS,
    off_a_host_under_test="its miss cost at each slot count is this machine's /dev/kvm's, driven from memqual's "
    "Python, which L1 does not have",
)
SCENARIOS = (RESIZE, MEMSLOTS)

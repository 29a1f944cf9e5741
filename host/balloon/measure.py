"""``memqual balloon measure``: time a real guest's balloon by hand.

Boots a guest with a virtio-balloon, inflates it until the guest has
``--target`` MiB left and deflates it back, ``--repeats`` times, each move
timed by the host's QMP polls and inside the guest; prints median, min and
max with GB/s.  A target below the guest's floor stops short with exit
status 1; bad input is one line and exit status 2, before anything boots.
docs/balloon.md, "host/balloon/measure.py", has the usage."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memqual.host.core.errors import BadInput

if TYPE_CHECKING:
    from rich.console import Console

MIB = 1 << 20
MIN_MEMORY_MIB = 256  # below this the guest has nothing to give
MAX_REPEATS = 100


@dataclasses.dataclass(frozen=True)
class MeasureConfig:
    memory_mib: int
    target_mib: int
    repeats: int = 5
    machine: str = "pc"
    warm: bool = True
    guest_timed: bool = True

    def check(self) -> None:
        """BadInput, one line, for what cannot be measured."""
        if self.memory_mib < MIN_MEMORY_MIB:
            raise BadInput(f"--memory {self.memory_mib}: give the guest at least {MIN_MEMORY_MIB} MiB")
        if self.target_mib <= 0:
            raise BadInput(f"--target {self.target_mib}: the target is the MiB the guest keeps, more than 0")
        if self.target_mib >= self.memory_mib:
            raise BadInput(
                f"--target {self.target_mib} MiB is not below the guest's {self.memory_mib} MiB of RAM: "
                "nothing would be inflated (QEMU clamps a target above RAM to RAM); give a smaller --target"
            )
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise BadInput(f"--repeats {self.repeats}: give 1 to {MAX_REPEATS}")


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def measure(config: MeasureConfig, image: Any, console: Console | None = None) -> dict[str, Any]:
    """Boot, inflate and deflate ``repeats`` times; the results as a dict."""
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.balloon.agent import GuestClock
    from memqual.host.balloon.device import BalloonController
    from memqual.host.balloon.timed_move import BalloonMover, Move
    from memqual.host.core.machine import Machine
    from memqual.host.core.qemu import BalloonDevice, MachineConfig

    machine_config = MachineConfig(
        memory_mib=config.memory_mib, machine=config.machine, warm=config.warm, balloon=BalloonDevice()
    )
    moves: list[dict[str, Any]] = []
    with Machine(machine_config, image=image) as vm:
        ctl = BalloonController(vm, device_id="balloon0")
        agent = vm.deploy("balloon_agent") if config.guest_timed else ""
        clock = GuestClock.read(vm.ssh).to_json() if config.guest_timed else None
        mover = BalloonMover(ctl, vm.ssh, agent)
        ram = ctl.ram_bytes()
        for repeat in range(config.repeats):
            inflate = mover.move(config.target_mib * MIB)
            if not inflate.reached:
                # The floor: the mover gave the balloon back at once; the
                # guest is not held there again.
                assert inflate.given_back is not None
                moves.append(
                    {
                        "repeat": repeat + 1,
                        "inflate": inflate.to_json(),
                        "deflate": Move(
                            direction="deflate", pages_asked=inflate.pages_asked, host=inflate.given_back
                        ).to_json(),
                    }
                )
                if console is not None:
                    console.print(
                        f"repeat {repeat + 1}/{config.repeats}: stopped short at "
                        f"{inflate.host.actual_bytes / MIB:.1f} MiB (the guest's floor)",
                        highlight=False,
                    )
                break
            deflate = mover.move(ram)
            moves.append({"repeat": repeat + 1, "inflate": inflate.to_json(), "deflate": deflate.to_json()})
            if console is not None:
                console.print(
                    f"repeat {repeat + 1}/{config.repeats}: inflated {inflate.host.moved_bytes / MIB:.0f} MiB in "
                    f"{inflate.host.seconds:.3f} s"
                    + (f" (guest {inflate.guest.seconds:.3f} s)" if inflate.guest else ""),
                    highlight=False,
                )
        started = {"warm": vm.started_warm, "accel": vm.accel, "boot_to_ssh_s": round(vm.boot_to_ssh_s, 3)}
    return _result(config, ram, moves, started) | {"guest_clock": clock}


def _result(config: MeasureConfig, ram: int, moves: list[dict[str, Any]], started: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "guest": {"memory_mib": config.memory_mib, "ram_bytes": ram, "machine": config.machine, **started},
        "target_mib": config.target_mib,
        "repeats_asked": config.repeats,
        "repeats_done": len(moves),
        "reached": all(m["inflate"]["reached"] for m in moves),
        "moves": moves,
    }
    for direction in ("inflate", "deflate"):
        done = [m[direction] for m in moves if m[direction]["reached"]]
        host_s = [m["host_s"] for m in done]
        guest_s = [m["guest_s"] for m in done if m["guest_s"] is not None]
        moved = [m["moved_bytes"] for m in done]
        out[direction] = {
            "host_s": _summary(host_s),
            "guest_s": _summary(guest_s),
            "gbps_host": statistics.median([b / s / 1e9 for b, s in zip(moved, host_s, strict=True)]) if done else None,
            "gbps_guest": (
                statistics.median([m["moved_bytes"] / m["guest_s"] / 1e9 for m in done if m["guest_s"]])
                if guest_s
                else None
            ),
            "host_resolution_s": _summary([m["host_resolution_s"] for m in done]),
            "guest_resolution_s": _summary([m["guest_resolution_s"] for m in done if m["guest_resolution_s"]]),
        }
    if not out["reached"]:
        stopped = [m["inflate"]["actual_bytes"] for m in moves if not m["inflate"]["reached"]]
        out["stopped_at_mib"] = stopped[0] / MIB
    return out


def print_result(result: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    guest = result["guest"]
    table = Table(
        title=f"balloon: {guest['memory_mib']} MiB guest ({guest['machine']}, {guest['accel']}, "
        f"{'warm' if guest['warm'] else 'cold'} start) down to {result['target_mib']} MiB, "
        f"{result['repeats_done']} of {result['repeats_asked']} repeats"
    )
    for column in ("move", "timed by", "median s", "min s", "max s", "GB/s", "resolution ms"):
        table.add_column(column, justify="left" if column in ("move", "timed by") else "right")
    for direction in ("inflate", "deflate"):
        d = result[direction]
        for side, label in (("host", "host (QMP polls)"), ("guest", "guest (counters)")):
            s, res, gbps = d[f"{side}_s"], d[f"{side}_resolution_s"], d[f"gbps_{side}"]
            if s is None:
                continue
            table.add_row(
                direction,
                label,
                f"{s['median']:.3f}",
                f"{s['min']:.3f}",
                f"{s['max']:.3f}",
                f"{gbps:.2f}" if gbps else "-",
                f"{1000 * res['median']:.2f}" if res else "-",
            )
    console.print(table)
    clock = result.get("guest_clock")
    if clock:
        console.print(
            f"guest clock: {clock['source']}, CLOCK_MONOTONIC resolves {clock['resolution_ns']} ns; the guest's "
            "resolution column is the gap between its polls around each end, which a busy host stretches",
            highlight=False,
        )
    if not result["reached"]:
        console.print(
            f"[yellow]the guest stopped giving pages at {result['stopped_at_mib']:.1f} MiB[/] (its floor): "
            "the target is below what it can give; try a higher --target",
            highlight=False,
        )


# --- the driver variant by request size: --pfns-per-request N[,N...] ---------
def parse_sizes(text: str) -> list[int]:
    """``256,16384`` -> [256, 16384]; BadInput (exit 2) before anything boots."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"--pfns-per-request {text!r}: give whole numbers, comma-separated (e.g. 256,262144)") from None
    if not sizes:
        raise BadInput("--pfns-per-request: give at least one size")
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.balloon.driver import check_pfns

    for n in sizes:
        check_pfns(n)
    return list(dict.fromkeys(sizes))


def measure_sizes(config: Any, sizes: Sequence[int], image: Any, console: Console | None = None) -> dict[str, Any]:
    """One guest, the variant at each size in turn (order rotated every
    repeat): inflate to ``config.target_mib`` and back, timed by QMP, with
    the driver's requests and breakdown.  The stock driver goes back at the
    end.  Stops at the guest's floor (the balloon given back over QMP at
    once) with ``reached`` False."""
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.balloon.device import BalloonController
    from memqual.host.balloon.driver import PAGE, VariantDriver
    from memqual.host.balloon.request_size import interleaved
    from memqual.host.balloon.timed_move import BalloonMover
    from memqual.host.core.machine import Machine
    from memqual.host.core.qemu import BalloonDevice, MachineConfig
    from memqual.images import balloon_driver

    variant = balloon_driver.build(str(image.release))
    machine_config = MachineConfig(
        memory_mib=config.memory_mib, machine=config.machine, warm=config.warm, balloon=BalloonDevice()
    )
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    reached = True
    with Machine(machine_config, image=image) as vm:
        ctl = BalloonController(vm, device_id="balloon0")
        driver = VariantDriver(vm, ctl, variant.ko)
        driver.deploy()
        mover = BalloonMover(ctl)
        ram = ctl.ram_bytes()
        target = config.target_mib * MIB
        for repeat in range(config.repeats):
            for n in interleaved([str(s) for s in sizes], repeat):
                driver.load(int(n))
                up = mover.move(target).host  # at the floor: given back at once
                if not up.reached:
                    reached = False
                    break
                inflate = driver.timing()["inflate"]
                down = mover.move(ram).host
                runs[int(n)].append(
                    {
                        "seconds": up.seconds,
                        "requests": inflate.requests,
                        "pfns": inflate.pfns,
                        "deflate_s": down.seconds,
                        "breakdown_pct": inflate.breakdown(),
                    }
                )
                if console is not None:
                    console.print(
                        f"repeat {repeat + 1}/{config.repeats}: {n} PFNs per request: "
                        f"{up.moved_bytes >> 20} MiB in {up.seconds:.3f} s, {inflate.requests} requests",
                        highlight=False,
                    )
            if not reached:
                break
        driver.restore_stock()
        taint = driver.taint
    out: dict[str, Any] = {
        "memory_mib": config.memory_mib,
        "target_mib": config.target_mib,
        "reached": reached,
        "taint": taint,
        "driver": variant.to_json(),
        "sizes": {},
    }
    for pfns, done in runs.items():
        if not done:
            continue
        secs = [r["seconds"] for r in done]
        out["sizes"][str(pfns)] = {
            "median_s": statistics.median(secs),
            "min_s": min(secs),
            "max_s": max(secs),
            "n": len(secs),
            "gbps": statistics.median([r["pfns"] * PAGE / r["seconds"] / 1e9 for r in done]),
            "requests": statistics.median([r["requests"] for r in done]),
            "host_wait_pct": statistics.median([r["breakdown_pct"]["host_wait_pct"] for r in done]),
            "alloc_pct": statistics.median([r["breakdown_pct"]["alloc_pct"] for r in done]),
            "runs": done,
        }
    return out


def print_sizes(result: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    table = Table(
        title=f"balloon driver variant: {result['memory_mib']} MiB guest down to "
        f"{result['target_mib']} MiB, by PFNs per request"
    )
    for column in ("PFNs/request", "median s", "min s", "max s", "GB/s", "requests", "host wait %", "alloc %"):
        table.add_column(column, justify="right")
    for n, s in result["sizes"].items():
        table.add_row(
            n,
            f"{s['median_s']:.3f}",
            f"{s['min_s']:.3f}",
            f"{s['max_s']:.3f}",
            f"{s['gbps']:.2f}",
            f"{s['requests']:.0f}",
            f"{s['host_wait_pct']:.1f}",
            f"{s['alloc_pct']:.1f}",
        )
    console.print(table)

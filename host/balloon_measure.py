"""``memqual balloon measure``: time a real guest's balloon by hand.

    memqual balloon measure --memory 1024 --target 256 [--repeats 5]
                            [--machine pc|microvm] [--cold] [--json]
                            [--pfns-per-request N[,N...]]

Boots a guest with a virtio-balloon (restored from a warm-start snapshot
when one exists), inflates the balloon until the guest has ``--target`` MiB
left, deflates it back, ``--repeats`` times.  Each move is timed twice, as
the balloon scenarios do (docs/balloon.md): by the host's QMP polls of
``query-balloon`` and inside the guest by ``balloon_agent track`` (sub-
millisecond).  Prints median, min and max of each with GB/s.

A target below what the guest can give (its floor) is not an error: the
inflate stops short, the result says where, and no further repeats run (a
guest held at its floor may start killing processes), and the exit status
is 1.  Bad input -- a target at or above the guest's RAM, no target, a
guest too small -- is one line and exit status 2, before anything boots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from typing import Any

from host.errors import BadInput

MIB = 1 << 20
MIN_MEMORY_MIB = 256  # below this the guest has nothing to give
MAX_REPEATS = 100
TRACK_PERIOD_US = 1000
DEADLINE_S = 120.0
# Stopped short when `actual` has not moved for this long.  Short on
# purpose: a guest held at its floor starts killing processes (measured: a
# 64 MiB target on a 1 GiB guest held for 3 s cost the guest its SSH
# server), and the driver retries every 200 ms when out of pages.
STALL_S = 0.6


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


def measure(config: MeasureConfig, image: Any, console: Any = None) -> dict[str, Any]:
    """Boot, inflate and deflate ``repeats`` times; the results as a dict."""
    from host.balloon import PAGE, BalloonController, GuestTracker, expected_actual
    from host.machine import BalloonDevice, Machine, MachineConfig

    machine_config = MachineConfig(
        memory_mib=config.memory_mib, machine=config.machine, warm=config.warm, balloon=BalloonDevice()
    )
    moves: list[dict[str, Any]] = []
    with Machine(machine_config, image=image) as vm:
        ctl = BalloonController(vm, device_id="balloon0")
        agent = vm.deploy("balloon_agent") if config.guest_timed else ""
        ram = ctl.ram_bytes()
        target = config.target_mib * MIB
        pages = (ram - expected_actual(ram, target)) // PAGE
        for repeat in range(config.repeats):
            tracker = GuestTracker(vm.ssh, agent, "inflate", pages, TRACK_PERIOD_US, int(DEADLINE_S)) if agent else None
            inflate = ctl.reach(target, deadline_s=DEADLINE_S, stall_s=STALL_S)
            if not inflate.reached:
                # The floor: give the memory back before anything else (QMP
                # only, no SSH: the guest may be killing processes), then
                # stop; the guest is not held there again.
                deflate = ctl.reach(ram, deadline_s=DEADLINE_S)
                if tracker is not None:
                    tracker.cancel()  # it waits for pages the guest never gave
                moves.append({"repeat": repeat + 1, "inflate": _move(inflate, None), "deflate": _move(deflate, None)})
                if console is not None:
                    console.print(f"repeat {repeat + 1}/{config.repeats}: stopped short at "
                                  f"{inflate.actual_bytes / MIB:.1f} MiB (the guest's floor)", highlight=False)
                break
            guest_inflate = tracker.result() if tracker is not None else None
            tracker = GuestTracker(vm.ssh, agent, "deflate", inflate.pages, TRACK_PERIOD_US, int(DEADLINE_S)) if agent else None
            deflate = ctl.reach(ram, deadline_s=DEADLINE_S)
            guest_deflate = tracker.result() if tracker is not None else None
            moves.append({
                "repeat": repeat + 1,
                "inflate": _move(inflate, guest_inflate),
                "deflate": _move(deflate, guest_deflate),
            })  # fmt: skip
            if console is not None:
                console.print(
                    f"repeat {repeat + 1}/{config.repeats}: inflated {inflate.moved_bytes / MIB:.0f} MiB in "
                    f"{inflate.seconds:.3f} s" + (f" (guest {guest_inflate.seconds:.3f} s)" if guest_inflate else ""),
                    highlight=False,
                )  # fmt: skip
        started = {"warm": vm.started_warm, "accel": vm.accel, "boot_to_ssh_s": round(vm.boot_to_ssh_s, 3)}
    return _result(config, ram, moves, started)


def _move(host_side: Any, guest_side: Any) -> dict[str, Any]:
    return {
        "reached": host_side.reached,
        "stalled": host_side.stalled,
        "moved_bytes": host_side.moved_bytes,
        "actual_bytes": host_side.actual_bytes,
        "host_s": host_side.seconds,
        "host_resolution_s": host_side.resolution_s,
        "guest_s": guest_side.seconds if guest_side else None,
        "guest_resolution_s": guest_side.resolution_s if guest_side else None,
    }


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
            "gbps_host": statistics.median([b / s / 1e9 for b, s in zip(moved, host_s)]) if done else None,
            "gbps_guest": (
                statistics.median([m["moved_bytes"] / m["guest_s"] / 1e9 for m in done if m["guest_s"]])
                if guest_s else None
            ),
            "host_resolution_s": _summary([m["host_resolution_s"] for m in done]),
            "guest_resolution_s": _summary([m["guest_resolution_s"] for m in done if m["guest_resolution_s"]]),
        }  # fmt: skip
    if not out["reached"]:
        stopped = [m["inflate"]["actual_bytes"] for m in moves if not m["inflate"]["reached"]]
        out["stopped_at_mib"] = stopped[0] / MIB
    return out


def print_result(result: dict[str, Any], console: Any) -> None:
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
                direction, label, f"{s['median']:.3f}", f"{s['min']:.3f}", f"{s['max']:.3f}",
                f"{gbps:.2f}" if gbps else "-", f"{1000 * res['median']:.2f}" if res else "-",
            )  # fmt: skip
    console.print(table)
    if not result["reached"]:
        console.print(
            f"[yellow]the guest stopped giving pages at {result['stopped_at_mib']:.1f} MiB[/] (its floor): "
            "the target is below what it can give; try a higher --target",
            highlight=False,
        )


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("measure", help="boot a guest and time its balloon: inflate to --target MiB and back")
    parser.add_argument("--memory", type=int, default=1024, metavar="MIB", help="guest RAM (default 1024)")
    parser.add_argument("--target", type=int, required=True, metavar="MIB", help="MiB the guest keeps when inflated")
    parser.add_argument("--repeats", type=int, default=5, help="inflate/deflate cycles (default 5)")
    parser.add_argument("--machine", choices=("pc", "microvm"), default="pc")
    warm = parser.add_mutually_exclusive_group()
    warm.add_argument("--warm", dest="warm", action="store_true", default=True, help="restore a snapshot (default)")
    warm.add_argument("--cold", dest="warm", action="store_false", help="always boot the kernel")
    parser.add_argument("--no-guest-timing", dest="guest_timed", action="store_false",
                        help="time by the host's QMP polls only (no agent in the guest)")
    parser.add_argument("--pfns-per-request", metavar="N[,N...]",
                        help="load the balloon driver variant at each size in turn (docs/balloon.md) and "
                             "report each: median time, GB/s, requests sent")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_cmd_measure)


def _cmd_measure(args: argparse.Namespace) -> int:
    from rich.console import Console

    from host.qemu import qemu_binary
    from images.build import build

    config = MeasureConfig(
        memory_mib=args.memory, target_mib=args.target, repeats=args.repeats, machine=args.machine,
        warm=args.warm, guest_timed=args.guest_timed,
    )  # fmt: skip
    config.check()  # before anything is built or booted
    sizes = None
    if getattr(args, "pfns_per_request", None) is not None:
        from host.balloon_driver import parse_sizes

        sizes = parse_sizes(args.pfns_per_request)
    qemu_binary()
    console = Console(stderr=True)
    if sizes is not None:
        from host.balloon_driver import measure_sizes, print_sizes

        by_size = measure_sizes(config, sizes, build(), console=None if args.json else console)
        if args.json:
            print(json.dumps(by_size, indent=2))
        else:
            print_sizes(by_size, Console())
        return 0 if by_size["reached"] else 1
    result = measure(config, build(), console=None if args.json else console)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result, Console())
    return 0 if result["reached"] else 1

"""``memqual memslots model|lookup|kvm|qemu``.

Why it is built so: docs/architecture.md, "Module notes", host/cli/memslots.py.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from memqual.host.cli import args as cliargs
from memqual.host.cli import memslots_kvm as kvm_cli
from memqual.host.cli import memslots_qemu as qemu_cli
from memqual.host.cli.command import Command, dispatch
from memqual.host.core import printable
from memqual.host.core.errors import BadInput
from memqual.host.memslots.layout import load_layout, parse_gfn


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="memslots_command", metavar="SUBCOMMAND", required=True)

    model = sub.add_parser("model", help="nodes examined per structure for a layout and workload")
    model.add_argument(
        "--layout", required=True, metavar="FILE_OR_NAME", help="layout file or seed-3, seed-3-stacked, seed-32"
    )
    model.add_argument(
        "--workload", required=True, metavar="NAME", help="miss, ram-hits, other-hits (alias small-hits) or mixed"
    )
    model.add_argument("--lookups", type=int, default=10000, metavar="N", help="frames to look up (default 10000)")
    model.add_argument("--seed", type=cliargs.seed, default=0, metavar="S", help="seed of the workload (default 0)")
    model.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    model.set_defaults(handler=run_model)

    lookup = sub.add_parser("lookup", help="look gfns up in every structure")
    lookup.add_argument("--layout", required=True, metavar="FILE_OR_NAME", help="layout file or a shipped layout name")
    lookup.add_argument(
        "gfns",
        nargs="+",
        metavar="GFN",
        help="guest frame number, decimal or 0x hex; looked up in this order "
        "(binsearch-lru keeps its last-slot cache from one to the next)",
    )
    lookup.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    lookup.set_defaults(handler=run_lookup)

    _register_kvm(sub)
    _register_qemu(sub)


def _register_kvm(sub: argparse._SubParsersAction) -> None:
    summary = "time memslot setup, delete, move and lookups on /dev/kvm"
    parser = sub.add_parser("kvm", help=summary, description=(kvm_cli.__doc__ or summary).splitlines()[0])
    kvm_cli.add_arguments(parser)
    parser.set_defaults(handler=kvm_cli.run)


def _register_qemu(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "qemu",
        help="apply a layout to a real QEMU guest and check it",
        description=(qemu_cli.__doc__ or "").splitlines()[0],
    )
    qemu_cli.add_arguments(parser)
    parser.set_defaults(handler=qemu_cli.run)


def _check_count(name: str, value: int, least: int) -> None:
    if value < least:
        raise BadInput(f"{name} {value} is too small: give {least} or more")
    if value > cliargs.COUNT_LIMIT:
        raise BadInput(f"{name} {value} is too large: give at most {cliargs.COUNT_LIMIT}")


def run_model(args: argparse.Namespace) -> int:
    # lazy: the memslot code (~85 ms) is only `memqual memslots`'s
    from memqual.host.memslots.model import model_table

    _check_count("--lookups", args.lookups, 1)
    layout = load_layout(args.layout)
    table = model_table(layout, args.workload, lookups=args.lookups, seed=args.seed)
    if args.json:
        print(json.dumps(table.to_json(), indent=2))
    else:
        _print_model(table)
    return 0


def _print_model(table: Any) -> None:
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.table import Table

    # lazy: the memslot code (~85 ms) is only `memqual memslots`'s
    from memqual.host.memslots.model import PUBLISHED

    applies = table.published_applies
    out = Table(
        title=(
            f"memslot lookups: layout {table.layout} ({table.slots} slots), workload {table.workload}, "
            f"{table.lookups} lookups, seed {table.seed}, {table.hit_fraction:.0%} hits"
        ),
        title_justify="left",
    )
    out.add_column("structure")
    out.add_column("mean nodes", justify="right")
    out.add_column("max nodes", justify="right")
    out.add_column("bound", justify="right")
    out.add_column("seed 000 (misses, 32 slots)", justify="right")
    for name, stats in table.structures.items():
        published = PUBLISHED["structures"].get(name, {}).get("nodes", "")
        out.add_row(
            name,
            f"{stats.mean_nodes:.2f}",
            str(stats.max_nodes),
            "-" if stats.bound_nodes is None else str(stats.bound_nodes),
            published,
        )
    console = printable.console()
    console.print(out)
    console.print(
        "nodes: slot ranges compared per lookup (docs/memslots-model.md); "
        "bound: worst case guaranteed by construction for this slot count."
    )
    console.print(
        "tree2011: the 2011 tree as seed 000 describes it (largest slot on top, no height bound); "
        "hbtree: memqual's own height-budgeted proposal, no kernel had it."
    )
    if not applies:
        console.print("the seed's figures are for misses on 32 slots; shown for reference only.")


def run_lookup(args: argparse.Namespace) -> int:
    # lazy: the memslot code (~85 ms) is only `memqual memslots`'s
    from memqual.host.memslots.structures import build_all

    gfns = [parse_gfn(text) for text in args.gfns]
    layout = load_layout(args.layout)
    indexes = build_all(layout)
    results: list[dict[str, Any]] = []
    for gfn in gfns:
        per = {}
        for name, index in indexes.items():
            slot, nodes = index.lookup(gfn)
            per[name] = {"slot": slot, "nodes": nodes}
        results.append({"gfn": gfn, "structures": per})
    if args.json:
        print(json.dumps({"layout": layout.name, "results": results}, indent=2))
        return 0
    width = max(len(name) for name in indexes)
    gfn_width = max(len(f"{gfn:#x}") for gfn in gfns)
    for result in results:
        for name, answer in result["structures"].items():
            where = "miss" if answer["slot"] is None else f"slot {answer['slot']}"
            print(f"gfn {result['gfn']:<#{gfn_width}x}  {name:<{width}}  {where:<10}  nodes {answer['nodes']}")
    return 0


COMMAND = Command(
    "memslots",
    help="memslot lookup model (no guest), /dev/kvm measurements, layouts on QEMU",
    configure=configure,
    run=dispatch,
    description="The reference model of KVM's gfn -> memslot lookup, and the /dev/kvm measurements.",
)

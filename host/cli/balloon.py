"""``memqual balloon model|measure|curve``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from memqual.host.balloon import measure
from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command, dispatch
from memqual.host.core import printable
from memqual.host.core.errors import BadInput
from memqual.host.core.qemu import qemu_binary
from memqual.host.core.record import collect, load
from memqual.host.judge.results import load_results


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="balloon_command", metavar="ACTION", required=True)
    model = sub.add_parser("model", help="the seed's bitmap timings predicted by the transfer-cost model")
    source = model.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--per-page-us",
        type=float,
        help="cost of one page inflated with PFN arrays (microseconds), e.g. a record's "
        "extra.model.calibration.combined_per_page_s",
    )
    source.add_argument("--record", help="a balloon.inflate record (memqual-balloon.inflate-*.json): show its model")
    model.add_argument("--fixed-ms", type=float, default=0.0, help="fixed cost per inflate (ms), with --per-page-us")
    model.set_defaults(handler=_cmd_model)
    curve = sub.add_parser(
        "curve",
        help="the request-size curve: time against PFNs per request and the fitted costs with CIs, "
        "from a results.json or a directory of records",
    )
    curve.add_argument("source", help="results.json of a memqual run, or a directory with balloon.request_size records")
    curve.add_argument("--png", type=cliargs.output_file, metavar="FILE", help="write the plot to FILE")
    curve.set_defaults(handler=_cmd_curve)
    _add_measure(sub)


def _cmd_curve(args: argparse.Namespace) -> int:
    # lazy: the pages bring jinja2, numpy and scipy (~300 ms); only this path writes one
    from memqual.host.report import balloon_curve as plot

    source = Path(args.source)
    entries: list[Any]
    if source.is_dir():
        entries = list(collect(source))
    elif source.is_file():
        entries = list(load_results(source).metrics)
    else:
        raise BadInput(f"{source}: no such results.json or records directory")
    found = plot.curves(entries)
    if not found:
        raise BadInput(f"{source}: no {', '.join(sorted(plot.drawn()))} records of inflate_s or deflate_s")
    for curve in found:
        print(f"settings: {curve.settings}")
        print(f"{'per request':>12} {'PFNs':>7} {'metric':>10} {'guests':>6} {'median s':>9}  range")
        for metric in plot.CURVE_METRICS:
            for p in curve.series(metric):
                print(
                    f"{p.label:>12} {p.pfns:>7} {metric:>10} {len(p.values):>6} {p.median:>9.3f}"
                    f"  [{min(p.values):.3f}, {max(p.values):.3f}]"
                )
        for c in curve.costs:
            mean, low, high = c.interval()
            print(f"{c.metric} ({c.unit}): {mean:.4g} [{low:.4g}, {high:.4g}] over {len(c.values)} guests")
    if args.png:
        plot.write_png(entries, args.png)
        print(f"wrote {args.png}")
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    # lazy: numpy and scipy (~300 ms) only for this command
    from memqual.host.balloon import model as transfer_model

    if args.record:
        record = load(args.record)
        pred = record.extra.get("model")
        if not isinstance(pred, dict) or "predictions" not in pred:
            raise BadInput(
                f"{args.record}: no model in this record: give a balloon.inflate record of the 1 GiB scenario"
            )
        cal = pred["calibration"]
        print(
            f"calibration: {cal['n']} inflates, {1e6 * cal['combined_per_page_s']:.2f} us/page, "
            f"fixed {1000 * cal['fixed_s']:.0f} ms; {cal['reason']}"
        )
    else:
        # nan fails every comparison and inf is no cost: both refused here.
        if not (0 < args.per_page_us < math.inf and 0 <= args.fixed_ms < math.inf):
            raise BadInput("--per-page-us must be > 0 and --fixed-ms >= 0")
        pred = transfer_model.predict_seed(
            transfer_model.Calibration(
                fixed_s=args.fixed_ms / 1000,
                combined_per_page_s=args.per_page_us / 1e6,
                per_request_s=None,
                per_page_s=None,
                identifiable=False,
                reason="given on the command line",
                residual_rms_s=0.0,
                n=0,
            )
        )
    print(f"seed 003: 15 GiB of a 16 GiB guest; layout: {pred['pfn_layout']}")
    for scheme, t in pred["transfers"].items():
        print(f"  {scheme:>13}: {t['requests']:>6} requests, {t['bytes']:>9} bytes")
    print(f"seed's implied cost per bitmap request: {pred['seed_implied_per_request_ms']:.1f} ms")
    print(f"{'scheme':>13} | {'seed ms':>7} | predicted ms | speedup over 32 KB")
    for row in transfer_model.side_by_side(pred):
        print(f"{row[0]:>13} | {row[1]:>7} | {row[2]} | {row[3]}")
    return 0


def _add_measure(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("measure", help="boot a guest and time its balloon: inflate to --target MiB and back")
    parser.add_argument("--memory", type=cliargs.count, default=1024, metavar="MIB", help="guest RAM (default 1024)")
    parser.add_argument(
        "--target", type=cliargs.count, required=True, metavar="MIB", help="MiB the guest keeps when inflated"
    )
    parser.add_argument("--repeats", type=cliargs.count, default=5, help="inflate/deflate cycles (default 5)")
    parser.add_argument("--machine", choices=("pc", "microvm"), default="pc")
    warm = parser.add_mutually_exclusive_group()
    warm.add_argument("--warm", dest="warm", action="store_true", default=True, help="restore a snapshot (default)")
    warm.add_argument("--cold", dest="warm", action="store_false", help="always boot the kernel")
    parser.add_argument(
        "--no-guest-timing",
        dest="guest_timed",
        action="store_false",
        help="time by the host's QMP polls only (no agent in the guest)",
    )
    parser.add_argument(
        "--pfns-per-request",
        metavar="N[,N...]",
        help="load the balloon driver variant at each size in turn (docs/balloon.md) and "
        "report each: median time, GB/s, requests sent",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_cmd_measure)


def _cmd_measure(args: argparse.Namespace) -> int:
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import build

    config = measure.MeasureConfig(
        memory_mib=args.memory,
        target_mib=args.target,
        repeats=args.repeats,
        machine=args.machine,
        warm=args.warm,
        guest_timed=args.guest_timed,
    )
    config.check()  # before anything is built or booted
    sizes = None
    if getattr(args, "pfns_per_request", None) is not None:
        sizes = measure.parse_sizes(args.pfns_per_request)
    qemu_binary()
    console = printable.console(stderr=True)
    if sizes is not None:
        by_size = measure.measure_sizes(config, sizes, build(), console=None if args.json else console)
        if args.json:
            print(json.dumps(by_size, indent=2))
        else:
            measure.print_sizes(by_size, printable.console())
        return 0 if by_size["reached"] else 1
    result = measure.measure(config, build(), console=None if args.json else console)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        measure.print_result(result, printable.console())
    return 0 if result["reached"] else 1


COMMAND = Command(
    "balloon",
    help="virtio-balloon: time a real guest's balloon; the transfer-cost model against seed 003",
    configure=configure,
    run=dispatch,
)

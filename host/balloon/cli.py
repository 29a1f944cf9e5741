"""``memqual balloon model|measure``."""

from __future__ import annotations

from typing import Any

from host.errors import BadInput


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "balloon", help="virtio-balloon: time a real guest's balloon; the transfer-cost model against seed 003"
    )
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
    from host.balloon import measure

    measure.add_parser(sub)


def _cmd_model(args: Any) -> int:
    from host.balloon import model as bm

    if args.record:
        from host.record import load

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
        if not args.per_page_us > 0 or args.fixed_ms < 0:
            raise BadInput("--per-page-us must be > 0 and --fixed-ms >= 0")
        pred = bm.predict_seed(
            bm.Calibration(
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
    for row in bm.side_by_side(pred):
        print(f"{row[0]:>13} | {row[1]:>7} | {row[2]} | {row[3]}")
    return 0

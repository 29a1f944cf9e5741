"""``python -m memqual.host.cli.calibrate [--quick]``: every figure of
docs/ab-calibration.md's "Decisions outside the happy path" from its
seeds, through the real decision code (host/run/calibrate.py), each rate
with its events, trials, seed and binomial 95 % interval."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from memqual.host.run import calibrate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memqual.host.cli.calibrate", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tenth of the trials (some 6 minutes at load 18)")
    parser.add_argument(
        "--only",
        action="append",
        choices=calibrate.SECTIONS,
        help="this section only (repeatable): the drift alarm, unblocked compare, history, the controls' power, "
        "looks on few blocks, the one-look table",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    for rate in calibrate.table(0.1 if args.quick else 1.0, args.only or calibrate.SECTIONS):
        print(rate.line(), flush=True)
    print(f"({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

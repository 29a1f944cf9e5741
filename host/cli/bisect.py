"""``memqual bisect``: in a series of kernels, find where a metric moved.

    memqual bisect --kernels K1 K2 ... Kn --metric NAME [--threshold PCT]
                   [--budget MINUTES] [--only TAG] [--output DIR | --resume DIR]
    memqual bisect --kernel-source DIR --good REV --bad REV --metric NAME ...

Why it is built so: docs/architecture.md, "Module notes", host/cli/bisect.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.cli import args as cliargs
from memqual.host.cli import run as run_command
from memqual.host.cli.args import percent
from memqual.host.cli.command import Command
from memqual.host.core import printable
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.trust import check_output_dir
from memqual.host.run import config as run_config
from memqual.host.run import signals as run_signals
from memqual.host.run.bisect import jobs

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_BUDGET_MIN = 30.0
DEFAULT_MAX_ROUNDS = 10

if TYPE_CHECKING:  # the type alone: the bisect brings numpy and scipy
    from memqual.host.run.bisect.run import Settings


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kernels",
        nargs="+",
        metavar="K",
        help="the series: Debian kernel versions, each optionally VERSION:extra command line",
    )
    parser.add_argument(
        "--kernel-source",
        metavar="DIR",
        help="bisect the revisions of a kernel git repository instead of --kernels: GOOD, then each commit on "
        "BAD's first-parent line up to BAD, each built with memqual's guest config when probed (cached)",
    )
    parser.add_argument("--good", metavar="REV", help="with --kernel-source: the good revision (K1)")
    parser.add_argument("--bad", metavar="REV", help="with --kernel-source: the bad revision (Kn)")
    parser.add_argument("--metric", help="the metric: NAME, 'SCENARIO NAME' or SCENARIO/NAME, optionally ' [variant]'")
    parser.add_argument(
        "--threshold",
        type=percent,
        metavar="PCT",
        help=f"smallest change of B/A that counts as slower or faster, and the band equivalent must lie in, "
        f"in percent (default {DEFAULT_THRESHOLD_PCT:g})",
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="MINUTES",
        help=f"wall time a probe may take before it is skipped undecided (default {DEFAULT_BUDGET_MIN:g})",
    )
    parser.add_argument(
        "--max-rounds",
        type=cliargs.count,
        metavar="N",
        help=f"blocks (looks) a probe may take before it is skipped undecided; alpha is spent over them "
        f"(default {DEFAULT_MAX_ROUNDS})",
    )
    parser.add_argument(
        "--reference",
        choices=("paired", "start"),
        help="paired (default): K1 runs beside the probe in every block (ABBA), a paired t-test; start: K1 "
        "only while the last kernel is checked, the other probes then unpaired (Welch against K1 pooled)",
    )
    parser.add_argument(
        "--test",
        metavar="REFERENCE",
        help="run only this avocado test reference each round, e.g. "
        "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g (a round then takes minutes less)",
    )
    parser.add_argument(
        "--resume",
        type=cliargs.directory,
        metavar="DIR",
        help="go on with an interrupted bisect in DIR (a --budget or --max-rounds given replaces the stored one)",
    )
    run_command.add_job_arguments(
        parser, "memqual-bisect", "default wall; a --resume keeps the bisect's clock (DIR/qemu.json)"
    )
    cliargs.add_qemu(
        parser,
        "; one QEMU runs every kernel of the series (kept in DIR/qemu.json: a --resume runs the same one)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    # lazy: numpy and scipy (~300 ms) only for this command
    from memqual.host.run.bisect import run, series

    kernels = series.parse_series(kernel_names(args))
    if not args.metric:
        raise BadInput("give --metric NAME (a metric of the run's results.json, such as deflate_s)")
    metric = series.parse_metric(args.metric)
    tests = tests_reference(args)
    file_part = Path(tests.split(":", 1)[0])
    series.check_metric_known(metric, file_part if file_part.is_dir() else file_part.parent)
    only = run_command.job_tags(args)
    max_rounds = DEFAULT_MAX_ROUNDS if args.max_rounds is None else args.max_rounds
    if max_rounds < 1:
        raise BadInput("--max-rounds must be at least 1")
    return run.Settings(
        kernels=tuple(kernels),
        metric=metric.text,
        threshold=(DEFAULT_THRESHOLD_PCT if args.threshold is None else args.threshold) / 100.0,
        budget_min=run_command.check_budget(DEFAULT_BUDGET_MIN if args.budget is None else args.budget),
        max_rounds=max_rounds,
        reference=args.reference or run.PAIRED,
        only=only,
        profile=run_config.job_profile(args.profile, 1),  # a bisect may read a metric of any test: quick sizes
        tests=tests,
    )


def kernel_names(args: argparse.Namespace) -> list[str]:
    """--kernels as given, or the revisions --kernel-source --good --bad name."""
    source = getattr(args, "kernel_source", None)
    good, bad = getattr(args, "good", None), getattr(args, "bad", None)
    if source or good or bad:
        if args.kernels:
            raise BadInput("give --kernels, or --kernel-source DIR --good REV --bad REV, not both")
        if not (source and good and bad):
            raise BadInput("a bisect over revisions needs all three: --kernel-source DIR --good REV --bad REV")
        # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
        from memqual.images.kernel_sources import revisions

        return revisions(source, good, bad)
    if not args.kernels:
        raise BadInput(
            "a bisect needs at least 2 kernels (the good K1 and the bad Kn): --kernels K1 K2 ... Kn, "
            "or --kernel-source DIR --good REV --bad REV"
        )
    return list(args.kernels)


def tests_reference(args: argparse.Namespace) -> str:
    """--test (checked: its file must exist), else the scenarios directory."""
    if not args.test:
        return str(args.tests)
    file_part = args.test.split(":", 1)[0]
    for base in (Path.cwd(), REPO_ROOT):
        if (base / file_part).exists():
            return str((base / file_part).resolve()) + args.test[len(file_part) :]
    raise BadInput(f"--test {args.test}: no such file {file_part} (give e2e/FILE.py or e2e/FILE.py:Class.test)")


def main(args: argparse.Namespace) -> int:
    # lazy: numpy and scipy (~300 ms) only for this command
    from memqual.host.run.bisect import run

    console = printable.console(width=None if sys.stdout.isatty() else 120)

    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False, soft_wrap=True)

    qemu_spec = cliargs.one_qemu(args.qemu)
    if args.resume:
        # Absolute: avocado runs in the repository, not in the caller's directory.
        directory = Path(args.resume).resolve()
        check_output_dir(directory, "--resume folder")
        bisector = run.Bisector.resume(directory, runner=lambda *a: ([], "", 0, None), say=say)
        if args.kernels and tuple(args.kernels) != tuple(k.name for k in bisector.settings.kernels):
            raise BadInput(
                f"--resume {directory}: its kernels are {' '.join(k.name for k in bisector.settings.kernels)}; "
                "leave --kernels out or start a new bisect"
            )
        if args.metric and " ".join(args.metric.split()) != bisector.settings.metric:
            raise BadInput(f"--resume {directory}: its metric is {bisector.settings.metric!r}; leave --metric out")
        # A resumed bisect may be given more time: its decisions are
        # recomputed from the stored rounds, so a probe skipped for its
        # budget goes on where it stopped.
        extend: dict[str, Any] = {}
        if args.budget is not None:
            extend["budget_min"] = run_command.check_budget(args.budget)
        if args.max_rounds is not None:
            if args.max_rounds < 1:
                raise BadInput("--max-rounds must be at least 1")
            extend["max_rounds"] = args.max_rounds
        if extend:
            bisector.settings = dataclasses.replace(bisector.settings, **extend)
            bisector._log("# resumed with " + ", ".join(f"{k} {v:g}" for k, v in extend.items()))
        jobs.bisect_clock(getattr(args, "clock", None), directory, resuming=True)
        qemu = jobs.bisect_qemu(qemu_spec, directory, resuming=True)
        bisector.runner = jobs.avocado_runner(bisector.settings, console, qemu)
    else:
        settings = settings_from_args(args)
        # Resolved: avocado runs in the repository, not in the caller's directory.
        directory = run_command.output_directory(args, "memqual-bisect").resolve()
        if (directory / "bisect.json").exists():
            raise BadInput(f"{directory} holds a bisect already: --resume {directory}, or another --output")
        # A QEMU that is none fails here, before the folder is made.
        jobs.bisect_clock(getattr(args, "clock", None), directory, resuming=False)
        qemu = jobs.bisect_qemu(qemu_spec, directory, resuming=False)
        runner = jobs.avocado_runner(settings, console, qemu)  # unknown kernels fail here, before any job
        bisector = run.Bisector(settings, directory, runner, say=say)
    if qemu is not None:
        say(f"QEMU {qemu.version} ({qemu.origin})")
    with run_signals.terminate_as_exception():
        bisector.run()
    say(f"wrote {directory / 'bisect.log'}, {directory / 'bisect.json'} and {directory / 'bisect.html'}")
    return 0


# What `memqual bisect --help` says of the search.
DESCRIPTION = """K1 is good, Kn bad.  Each probe runs blocks (K1 and the probe interleaved
in one avocado job a step, host/run/blocks.py) and is decided as memqual compare
decides a metric: a paired t-test on the blocks' log(B/A) gives slower or
faster (significant and beyond --threshold), TOST gives equivalent (B/A
within the threshold), a look after every block, with alpha 5 % spent
as alpha (k/K)^2 by look k of K = --max-rounds.  Equivalent is good, a
change as Kn changed is bad; the search moves on decided probes only, and a
probe still undecided when its budget ends is skipped (git bisect skip),
with the blocks it would need.  Kn is probed first: equivalent to K1 means
no step, and the bisect stops.  A kernel is a Debian kernel (as
--debian-kernel takes it) or "VERSION:extra kernel command line", so a
series with a known step can be made from one kernel
(6.1.0-57-amd64:init_on_free=1).  With --kernel-source DIR --good REV --bad
REV the series is the repository's revisions (GOOD, then BAD's first-parent
line up to BAD), each built by memqual kernel build when a probe needs it."""

COMMAND = Command(
    "bisect",
    help="find the kernel of a series where a metric moved (K1 good, Kn bad), probing as git bisect does",
    configure=configure,
    run=main,
    description=DESCRIPTION,
)

"""``memqual bisect``: in a series of kernels, find where a metric moved.

    memqual bisect --kernels K1 K2 ... Kn --metric NAME [--threshold PCT]
                   [--budget MINUTES] [--only TAG] [--output DIR | --resume DIR]
    memqual bisect --kernel-source DIR --good REV --bad REV --metric NAME ...
    memqual bisect --host-kernels K1 K2 ... Kn --metric NAME [--host-kernel-param MOD.P=V ...] ...
    memqual bisect --host-kernel-source DIR --good REV --bad REV --metric NAME ...
    memqual bisect --kernels K1 ... Kn --host-kernel K --metric NAME ...

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
from memqual.host.core import clock, nested, printable
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.trust import check_output_dir
from memqual.host.run import config as run_config
from memqual.host.run import host_checks
from memqual.host.run import signals as run_signals
from memqual.host.run.bisect import axis, jobs
from memqual.host.run.bisect.axis import Axis, FixedGuest

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
    parser.add_argument(
        "--host-kernels",
        nargs="+",
        type=cliargs.debian_kernel_arm,
        metavar="K",
        help="a series of HOST kernels instead: each probe's guests run on its host kernel, booted as L1 under TCG "
        "with emulated SVM (anything --host-kernel takes: a Debian kernel, KERNEL:CMDLINE with words for L1's "
        "command line, a 'memqual kernel build' name); the guest is one kernel for all (docs/host-under-test.md)",
    )
    parser.add_argument(
        "--host-kernel-source",
        metavar="DIR",
        help="bisect the revisions of a kernel git repository as HOST kernels: GOOD, then BAD's first-parent "
        "line up to BAD, each built with images/host.config on top of memqual's config when probed (cached)",
    )
    parser.add_argument(
        "--good", metavar="REV", help="with --kernel-source or --host-kernel-source: the good revision (K1)"
    )
    parser.add_argument(
        "--bad", metavar="REV", help="with --kernel-source or --host-kernel-source: the bad revision (Kn)"
    )
    cliargs.add_host_kernel(
        parser,
        "; with --kernels or --kernel-source: every guest of the bisect on this one host. --host-kernel-param: "
        "of every host under test, the series' too",
    )
    parser.add_argument(
        "--debian-kernel",
        type=cliargs.debian_kernel_arm,
        action="append",
        metavar="VERSION[:CMDLINE]",
        help="with a series of host kernels: the one guest kernel of every probe (default: the guest image's)",
    )
    parser.add_argument(
        "--guest-kernel",
        action="append",
        metavar="BZIMAGE",
        help="with a series of host kernels: the one guest kernel of every probe, with --guest-modules",
    )
    parser.add_argument(
        "--guest-modules", action="append", metavar="DIR", help="the modules directory of --guest-kernel"
    )
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
        parser,
        "memqual-bisect",
        "default wall, and icount at the shift L1 runs when the guests run on hosts under test "
        "(L1's instructions: the host's work counts); a --resume keeps the bisect's clock (DIR/qemu.json)",
    )
    cliargs.add_qemu(
        parser,
        "; one QEMU runs every kernel of the series (kept in DIR/qemu.json: a --resume runs the same one)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    # lazy: numpy and scipy (~300 ms) only for this command
    from memqual.host.run.bisect import run, series

    names, the_axis = series_and_axis(args)
    kernels = series.parse_series(names, "--host-kernels" if the_axis.kind == axis.HOST else "--kernels")
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
        axis=the_axis,
    )


def series_and_axis(args: argparse.Namespace) -> tuple[list[str], Axis]:
    """The series' names and its axis: host kernels (--host-kernels,
    --host-kernel-source) with one guest, or guest kernels (--kernels,
    --kernel-source) on one host; the options that do not go together
    refused in one line, before anything is read."""
    params = tuple(getattr(args, "host_kernel_param", None) or ())
    if refuse_mixed_axes(args):
        guest = fixed_guest(args)
        return host_kernel_names(args), axis.Axis(axis.HOST, host_params=params, guest=guest)
    if getattr(args, "debian_kernel", None) or getattr(args, "guest_kernel", None):
        raise BadInput(
            "--debian-kernel and --guest-kernel name the one guest of a series of host kernels: a series of guest "
            "kernels is --kernels K1 ... Kn"
        )
    host = axis.fixed_host_text(getattr(args, "host_kernel", None))
    if params and not host:
        raise BadInput(
            "--host-kernel-param sets the host under test's KVM: give --host-kernels K1 ... Kn, or --host-kernel "
            "KERNEL with a series of guest kernels"
        )
    return kernel_names(args), axis.Axis(axis.GUEST, host=host, host_params=params)


def refuse_mixed_axes(args: argparse.Namespace) -> bool:
    """Is the series of host kernels?  One axis a bisect: --host-kernels or
    --host-kernel-source with --kernels, --kernel-source or --host-kernel
    is refused, and so are the two host series' options together."""
    hosts, source = getattr(args, "host_kernels", None), getattr(args, "host_kernel_source", None)
    if not (hosts or source):
        return False
    given = "--host-kernels" if hosts else "--host-kernel-source"
    if hosts and source:
        raise BadInput("give --host-kernels K1 ... Kn or --host-kernel-source DIR --good REV --bad REV, not both")
    if args.kernels or getattr(args, "kernel_source", None):
        raise BadInput(
            f"give {given} (a series of host kernels) or --kernels/--kernel-source (of guest kernels), not both: "
            "a bisect moves along one axis"
        )
    if getattr(args, "host_kernel", None):
        raise BadInput(
            f"give {given} or --host-kernel, not both: --host-kernel is the one host of a series of guest kernels"
        )
    return True


def host_kernel_names(args: argparse.Namespace) -> list[str]:
    """--host-kernels as given, or the revisions --host-kernel-source --good --bad name."""
    if not args.host_kernel_source:
        if args.good or args.bad:
            raise BadInput("--good and --bad name revisions of --host-kernel-source DIR (or --kernel-source DIR)")
        return list(args.host_kernels)
    if not (args.good and args.bad):
        raise BadInput("a bisect over host revisions needs all three: --host-kernel-source DIR --good REV --bad REV")
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_sources import revisions

    return revisions(args.host_kernel_source, args.good, args.bad)


def fixed_guest(args: argparse.Namespace) -> FixedGuest | None:
    """A host series' one guest kernel (--debian-kernel or --guest-kernel
    with --guest-modules, once), its files checked as memqual run checks
    them; None: the guest image's."""
    debian, bzimages = args.debian_kernel or [], args.guest_kernel or []
    if len(debian) + len(bzimages) > 1:
        raise BadInput("a series of host kernels runs one guest kernel: give --debian-kernel or --guest-kernel once")
    if not (debian or bzimages or args.guest_modules):
        return None
    given = argparse.Namespace(
        guest_kernel=bzimages, guest_modules=args.guest_modules or [], kernel_build=[], debian_kernel=debian
    )
    (kernel,) = run_command.guest_kernels(given)
    run_command.check_guest_files(run_config.RunConfig(output=Path(), kernels=(kernel,)))
    return FixedGuest(
        debian[0] if debian else str(kernel.bzimage),
        str(kernel.bzimage),
        str(kernel.modules or ""),
        kernel.sha256,
        kernel.cmdline_extra,
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
        check_resumed(args, bisector.settings, directory)
        extend = resume_extension(args)
        if extend:
            bisector.settings = dataclasses.replace(bisector.settings, **extend)
            bisector._log("# resumed with " + ", ".join(f"{k} {v:g}" for k, v in extend.items()))
        on_hosts = bisector.settings.axis.on_hosts
        the_clock = jobs.bisect_clock(getattr(args, "clock", None), directory, resuming=True, on_hosts=on_hosts)
        qemu = jobs.bisect_qemu(qemu_spec, directory, resuming=True, vcpus=guest_vcpus(on_hosts, the_clock))
        bisector.runner = jobs.avocado_runner(bisector.settings, console, qemu)
    else:
        settings = settings_from_args(args)
        # Resolved: avocado runs in the repository, not in the caller's directory.
        directory = run_command.output_directory(args, "memqual-bisect").resolve()
        if (directory / "bisect.json").exists():
            raise BadInput(f"{directory} holds a bisect already: --resume {directory}, or another --output")
        # Every host under test known, with kvm_amd and its parameters, before
        # any job (a revision's when it is built).
        host_checks.check_hosts(settings.axis.hosts(k for k in settings.kernels if not revision(k.version)))
        # A QEMU that is none fails here, before the folder is made.
        on_hosts = settings.axis.on_hosts
        the_clock = jobs.bisect_clock(getattr(args, "clock", None), directory, resuming=False, on_hosts=on_hosts)
        qemu = jobs.bisect_qemu(qemu_spec, directory, resuming=False, vcpus=guest_vcpus(on_hosts, the_clock))
        runner = jobs.avocado_runner(settings, console, qemu)  # unknown kernels fail here, before any job
        bisector = run.Bisector(settings, directory, runner, say=say)
    if qemu is not None:
        say(f"QEMU {qemu.version} ({qemu.origin})")
    with run_signals.terminate_as_exception():
        bisector.run()
    say(f"wrote {directory / 'bisect.log'}, {directory / 'bisect.json'} and {directory / 'bisect.html'}")
    return 0


def revision(version: str) -> bool:
    """A kernel of the series named ``DIR@commit`` (built when probed)."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_sources import is_source_revision

    return is_source_revision(version)


def guest_vcpus(on_hosts: bool, the_clock: clock.Clock) -> int:
    """The vCPUs the bisect's guests run (the QEMU must run them): a host
    under test runs one on icount (nested.host_vcpus)."""
    vcpus = run_command.SCENARIO_VCPUS
    return nested.host_vcpus(vcpus, the_clock.strictest()) if on_hosts else vcpus


def check_resumed(args: argparse.Namespace, settings: Settings, directory: Path) -> None:
    """A --resume keeps its series, its axis, its hosts and guest and its
    metric: any of them given and different is one line."""
    given = args.kernels or getattr(args, "host_kernels", None)
    option = "--host-kernels" if settings.axis.kind == axis.HOST else "--kernels"
    names = tuple(k.name for k in settings.kernels)
    if given and (tuple(given) != names or bool(args.kernels) == (settings.axis.kind == axis.HOST)):
        raise BadInput(
            f"--resume {directory}: its kernels are {' '.join(names)} ({settings.axis.kind} kernels); "
            f"leave {option} out or start a new bisect"
        )
    kept = settings.axis
    hosts = getattr(args, "host_kernel", None) or []
    params = getattr(args, "host_kernel_param", None) or []
    if (hosts and hosts != [kept.host]) or (params and tuple(params) != kept.host_params):
        raise BadInput(f"--resume {directory}: it keeps its hosts under test ({kept.describe()}); leave them out")
    if getattr(args, "debian_kernel", None) or getattr(args, "guest_kernel", None):
        raise BadInput(f"--resume {directory}: it keeps its guest ({kept.describe()}); leave the guest kernel out")
    if args.metric and " ".join(args.metric.split()) != settings.metric:
        raise BadInput(f"--resume {directory}: its metric is {settings.metric!r}; leave --metric out")


def resume_extension(args: argparse.Namespace) -> dict[str, Any]:
    """What a resumed bisect is given more of: a budget, rounds.  Its
    decisions are recomputed from the stored rounds, so a probe skipped
    for its budget goes on where it stopped."""
    extend: dict[str, Any] = {}
    if args.budget is not None:
        extend["budget_min"] = run_command.check_budget(args.budget)
    if args.max_rounds is not None:
        if args.max_rounds < 1:
            raise BadInput("--max-rounds must be at least 1")
        extend["max_rounds"] = args.max_rounds
    return extend


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
line up to BAD), each built by memqual kernel build when a probe needs it.  With --host-kernels K1 .. Kn
(or --host-kernel-source DIR --good REV --bad REV, each revision built
with images/host.config) the series is of HOST kernels: each probe's
guests run on its host kernel, booted as L1 under TCG with emulated SVM,
one guest kernel for all, on icount (L1's clock) unless told; with
--host-kernel K a series of guest kernels runs on that one host."""

COMMAND = Command(
    "bisect",
    help="find the kernel of a series where a metric moved (K1 good, Kn bad), probing as git bisect does",
    configure=configure,
    run=main,
    description=DESCRIPTION,
)

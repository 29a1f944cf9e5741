"""``memqual run``: the command's options and their checks, turned into a
RunConfig for memqual.host.run.job.  The only place that parses them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command
from memqual.host.core import clock, nested
from memqual.host.core.clock import Clock
from memqual.host.core.errors import BadInput
from memqual.host.core.kernelspec import parse_kernel
from memqual.host.core.nested import parse_host
from memqual.host.core.paths import REPO_ROOT, cache_dir
from memqual.host.core.profiles import PROFILES
from memqual.host.core.qemu_binary import choose_for_clock, resolve
from memqual.host.core.trust import check_loaded, check_output_dir
from memqual.host.judge.verdicts import DEFAULT_ALPHA
from memqual.host.run import budget, host_checks, job
from memqual.host.run.avocado import list_tests
from memqual.host.run.config import UNTIL_DECIDED_BUDGET_MIN, GuestKernel, RunConfig, arm_pairing, job_profile
from memqual.images.kernel import read_release

if TYPE_CHECKING:  # imported where used: a run loads the reporting only at its end
    from memqual.host.core.qemu_binary import QemuChoice

# ------------------------------------------------------------------ CLI


DESCRIPTION = """Run the qualification (avocado run e2e/), judge every claim of
claims/claims.json, write OUTPUT/results.json and OUTPUT/report.html and
print the tables."""


def job_tags(args: argparse.Namespace) -> tuple[str, ...]:
    """--only's tags, checked: each goes into avocado's command line."""
    for tag in args.only or []:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", tag):
            raise BadInput(f"--only {tag!r}: a tag is letters, digits and _ . : - (one tag per --only)")
    return tuple(args.only or ())


def output_directory(args: argparse.Namespace, parent: str) -> Path:
    """--output, else PARENT/<timestamp> below the working directory; in
    either case a folder no other user owns or may write."""
    path = Path(args.output) if args.output else Path(parent) / _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    check_output_dir(path, "output folder")
    return path


def check_budget(minutes: float) -> float:
    """A --budget in minutes: more than 0 and at most a day (nan is neither)."""
    if not 0 < minutes <= 24 * 60:
        raise BadInput(f"--budget {minutes:g}: give minutes, more than 0 and at most a day")
    return minutes


def config_from_args(args: argparse.Namespace) -> RunConfig:
    kernels = guest_kernels(args)
    tests = tests_path(args)
    if not 1 <= args.parallel <= cliargs.COUNT_LIMIT:
        raise BadInput(f"--parallel must be at least 1 and at most {cliargs.COUNT_LIMIT}")

    # Which kernel and QEMU each arm has; bad combinations end here.
    host_params = getattr(args, "host_kernel_param", None) or []
    hosts = tuple(parse_host(k, host_params) for k in getattr(args, "host_kernel", None) or [])
    if host_params and not hosts:
        raise BadInput("--host-kernel-param sets the host under test's KVM: give --host-kernel KERNEL with it")
    pairing = arm_pairing(len(kernels), len(getattr(args, "qemu", None) or []), len(hosts))
    two_arms = len(pairing) == 2
    # Two arms: two blocks (A B, then B A) unless told; one arm: one round.
    rounds = args.rounds if args.rounds is not None else (2 if two_arms else 1)
    if not 1 <= rounds <= cliargs.COUNT_LIMIT:
        raise BadInput(f"--rounds must be at least 1 and at most {cliargs.COUNT_LIMIT}")
    only = job_tags(args)
    budget = ab_budget(args, two_arms)
    return RunConfig(
        output=output_directory(args, "memqual-results"),
        profile=job_profile(args.profile, 2 if two_arms else 1),  # two kernels or two QEMUs
        only=only,
        tests=tests,
        kernels=kernels,
        hosts=hosts,
        parallel=args.parallel,
        rounds=rounds,
        until_decided=bool(args.until_decided),
        budget_min=budget,
        clock=run_clock(getattr(args, "clock", None)),
        threshold=args.threshold,
        alpha=args.alpha,
        pairing=pairing,
        scope=getattr(args, "test_scope", None),  # memqual run --patch's or --host-patch's
        patch=getattr(args, "patch_run", None),
        host_patch=getattr(args, "host_patch_run", None),  # memqual run --host-patch's (host/cli/host_patch.py)
    )


def guest_kernels(args: argparse.Namespace) -> tuple[GuestKernel, ...]:
    """Each arm's guest kernel from --guest-kernel, --guest-modules and
    --kernel-build, or --debian-kernel, checked; labelled A and B when
    there are two."""
    kernels_in = [Path(k) for k in args.guest_kernel or []]
    modules_in = [Path(m) for m in args.guest_modules or []]
    builds_in = [Path(b) for b in args.kernel_build or []]
    if builds_in and len(builds_in) != len(kernels_in):
        raise BadInput("give --kernel-build DIR once per --guest-kernel, in the same order (or not at all)")
    cmdlines = ["", ""]
    if args.debian_kernel:
        if kernels_in or modules_in:
            raise BadInput("give --debian-kernel or --guest-kernel/--guest-modules, not both")
        kernels_in, modules_in, cmdlines = debian_kernels(args.debian_kernel)
    if len(kernels_in) > 2:
        raise BadInput("give --guest-kernel at most twice (A and B)")
    if len(modules_in) != len(kernels_in):
        # The image builder needs both: a kernel and its lib/modules/RELEASE.
        raise BadInput("give --guest-modules DIR (lib/modules/RELEASE) once per --guest-kernel, in the same order")
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import sha256_file

    kernels = []
    for index, bzimage in enumerate(kernels_in):
        if not bzimage.is_file():
            what = "not a regular file" if bzimage.exists() else "no such file"
            raise BadInput(f"--guest-kernel {bzimage}: {what}: give a bzImage (arch/x86/boot/bzImage)")
        modules = modules_in[index] if modules_in else None
        if modules is not None and not modules.is_dir():
            raise BadInput(f"--guest-modules {modules}: no such directory")
        label = "AB"[index] if len(kernels_in) == 2 else ""
        kernels.append(
            GuestKernel(
                label,
                bzimage.resolve(),
                modules.resolve() if modules else None,
                sha256_file(bzimage),
                kernel_build=builds_in[index] if builds_in else None,
                cmdline_extra=cmdlines[index],
            )
        )
    return tuple(kernels)


def debian_kernels(texts: list[str]) -> tuple[list[Path], list[Path], list[str]]:
    """Each --debian-kernel's bzImage, modules folder and the words it adds
    to its arm's guest command line."""
    if len(texts) > 2:
        raise BadInput("give --debian-kernel at most twice (A and B)")
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import debian_kernel_files

    bzimages, modules_dirs, cmdlines = [], [], []
    for text in texts:
        spec = parse_kernel(text)
        bzimage, modules_dir = debian_kernel_files(spec.version)
        bzimages.append(bzimage)
        modules_dirs.append(modules_dir)
        cmdlines.append(spec.cmdline_extra)
    return bzimages, modules_dirs, cmdlines


def tests_path(args: argparse.Namespace) -> Path:
    """--tests, checked: a directory of tests, or a test file
    (file.py:Class.test names one test)."""
    tests = Path(args.tests)
    test_file = Path(str(tests).split(":", 1)[0])
    if not (tests.is_dir() or (test_file.is_file() and test_file.suffix == ".py")):
        raise BadInput(f"--tests {tests}: no directory of tests or .py test file")
    check_loaded(tests if tests.is_dir() else test_file, "--tests")  # Avocado imports them as root
    return tests


def ab_budget(args: argparse.Namespace, two_arms: bool) -> float:
    """--until-decided's --budget in minutes (its default when not given),
    with the options that decide an A/B checked against the arms."""
    if args.budget is not None and not args.until_decided:
        raise BadInput("--budget applies to --until-decided only")
    if args.until_decided and not two_arms:
        raise BadInput(
            "--until-decided compares two arms: give a kernel (--debian-kernel, --guest-kernel), --qemu or "
            "--host-kernel twice"
        )
    budget = check_budget(UNTIL_DECIDED_BUDGET_MIN if args.budget is None else args.budget)
    if not two_arms and (args.threshold is not None or args.alpha is not None):
        raise BadInput("--threshold and --alpha decide an A/B: give two kernels or two QEMUs, or leave them out")
    if args.alpha is not None and args.alpha <= 0:
        raise BadInput(f"--alpha {args.alpha:g}: give an error level above 0 ({DEFAULT_ALPHA:g} is the default)")
    return budget


def run_clock(asked: str | None) -> Clock:
    """--clock as asked, else the wall clock until ``choose_clock`` gives
    the run its default (it needs the accelerator, which ``main`` probes)."""
    return clock.parse(asked) if asked else clock.WALL_CLOCK


def run_accel(config: RunConfig) -> tuple[str, str]:
    """What the run's guests run under, and why: TCG under a host under
    test (L1 is a TCG guest) or on an icount clock; else the KVM probe's
    answer (its cached one, else one boot under KVM, as the first guest
    would make)."""
    if config.hosts:
        return "tcg", "the host under test runs under TCG"
    if config.clock.icount or config.clock.auto:
        return "tcg", f"--clock {config.clock.label} needs TCG"
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.core import probe

    return probe.cached_accel() or probe.resolve_accel("auto")


def choose_clock(asked: str | None, arms: int, accel: tuple[str, str]) -> clock.Default:
    """The run's clock and why: --clock when given (it always wins), else
    the default of ``arms`` arms on ``accel`` (accelerator, why), which is
    auto for two arms under TCG (memqual.host.core.clock.default)."""
    if asked:
        found = clock.parse(asked)
        return clock.Default(found, f"--clock {found.label} given")
    chosen = clock.default(arms, accel[0])
    return chosen if arms != 2 else clock.Default(chosen.clock, f"{chosen.why} ({accel[1]})")


def clock_lines(config: RunConfig, chosen: clock.Default) -> list[str]:
    """The run's header about its clock: what it reads, why it is this
    one, and which clock each scenario gets."""
    if config.hosts and config.clock.icount:
        # imported here, not at the top: the plan reads the judge's primaries
        from memqual.host.core import scenario
        from memqual.host.judge import clock_plan
        from memqual.host.run import host_scope

        lines = [
            f"clock: {config.clock.label}: guest-timed figures are the host under test's instructions x "
            f"{2 ** (config.clock.shift or 0)} ns: its work for the guest (KVM, mm, the guest's QEMU) is in them",
            *clock_plan.describe_host_under_test(
                {row.name for row in scenario.table() if host_scope.selected(row, config.profile, config.only)}
            ),
        ]
    else:
        lines = [f"clock: {config.clock.describe()}"]
    lines.append(f"  why {config.clock.label}: {chosen.why}")
    if not config.clock.auto:
        return [*lines, f"  every scenario on {config.clock.label}"]
    # imported here, not at the top: the plan reads the judge's primaries, which only a plan needs
    from memqual.host.judge import clock_plan

    return [
        *lines,
        "  the plan: each primary on the clock whose measured block spread (its scenario row) decides it "
        "in fewer blocks",
        *clock_plan.describe(config.clock),
        "  the once-per-arm checks: wall (they decide nothing)",
    ]


RUN_CLOCK_DEFAULT = (
    "default: auto for two arms under TCG (a host under test included), wall under KVM and for one arm; "
    "icount counts guest instructions, so guest-timed figures no host load moves "
    "(TCG only; see docs/ab-runs.md, 'The clock')"
)


def add_job_arguments(
    parser: argparse.ArgumentParser, output_parent: str, clock_default: str = RUN_CLOCK_DEFAULT
) -> None:
    """What the avocado job runs (--profile, --only, the hidden --tests) and
    where the output goes: the options of ``memqual run`` that every
    command running the scenarios through this module takes."""
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="quick (the default with one kernel, ~12 min under TCG here), full (the lab's sizes) or ab (the "
        "default with two kernels: one fresh guest per arm and block, only the tests that record a primary or a "
        "negative control in the blocks, the boot checks once per arm; host/core/profiles.py)",
    )
    parser.add_argument(
        "--only", action="append", metavar="TAG", help="only tests with this avocado tag (repeatable: any of them)"
    )
    parser.add_argument(
        "--output",
        type=cliargs.output_directory,
        metavar="DIR",
        help=f"output directory (default {output_parent}/<timestamp>)",
    )
    parser.add_argument("--tests", default=str(REPO_ROOT / "e2e"), help=argparse.SUPPRESS)
    cliargs.add_clock(parser, clock_default, plan=True)


def configure(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser, "memqual-results")
    parser.add_argument(
        "--guest-kernel",
        action="append",
        metavar="BZIMAGE",
        help="guest kernel instead of Debian's; twice to compare two kernels (A, B)",
    )
    parser.add_argument(
        "--guest-modules", action="append", metavar="DIR", help="modules directory of each --guest-kernel"
    )
    parser.add_argument(
        "--kernel-build",
        action="append",
        type=cliargs.kernel_build,
        metavar="DIR",
        help="the tree each --guest-kernel was built in, in the same order: the balloon driver variant is "
        "built from it (without it the scenarios that need the variant skip)",
    )
    parser.add_argument(
        "--debian-kernel",
        type=cliargs.debian_kernel_arm,
        action="append",
        metavar="VERSION[:CMDLINE]",
        help="a Debian kernel by release or package name instead of --guest-kernel/--guest-modules; "
        "twice to compare two (memqual image kernels lists them); words after a colon are added to that "
        "arm's guest command line (6.1.0-57-amd64 against 6.1.0-57-amd64:init_on_free=1)",
    )
    cliargs.add_host_kernel(
        parser,
        "; once: every guest of the run on it, both arms; twice: A's host and B's (an A/B of host kernels). "
        "The KSM scenarios drive L1's ksmd; the tests that turn or read this machine's host (the huge page pool, "
        "QEMU's RSS, /dev/kvm) are skipped with their reason",
    )
    cliargs.add_qemu(
        parser,
        "; twice to compare two QEMUs (A, B). With kernels: two kernels and one QEMU (or none) compare the "
        "kernels on that QEMU; one kernel (or none) and two QEMUs compare the QEMUs on that kernel; two of "
        "each pair in order (A = first kernel + first QEMU, B = second + second); other counts are refused",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="one arm: run the scenarios N times and pool the samples; two arms (kernels or QEMUs): N blocks, "
        "each test running A and B inside one job, A B then B A ... (tests tagged boot or hosts run once per arm; "
        "default 2 with two arms, else 1)",
    )
    parser.add_argument(
        "--until-decided",
        action="store_true",
        help="two arms: after the --rounds blocks, add blocks only for the tests whose scenarios have an "
        "undecided primary, until every primary is decided or the budget is spent; OUTPUT/until-decided.json, "
        "comparison.json and each arm's results.json are written at every look, so a run ended keeps them",
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="MINUTES",
        help=f"wall time of a run with --until-decided (default {UNTIL_DECIDED_BUDGET_MIN:g}), a promise: a budget "
        "its once-per-arm checks and first blocks cannot fit is refused before anything starts (their measured "
        "cost, and the --budget or --only that would fit); no block starts that cannot end inside it, and checks "
        "that no longer fit are not run (said, with why)",
    )
    parser.add_argument(
        "--threshold",
        type=cliargs.fraction_below_one,
        metavar="FRACTION",
        help="two arms: smallest relative change of a metric that counts, as on compare (default 0.05); "
        "each primary is judged against its own margin (its scenario row)",
    )
    parser.add_argument(
        "--alpha",
        type=cliargs.fraction_below_one,
        metavar="FRACTION",
        help="two arms: family-wise error level of the primaries' decisions, Holm-corrected, as on compare "
        f"(default {DEFAULT_ALPHA:g})",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="tests avocado runs at once (default 1: benchmarks must not share the CPUs)",
    )


# The scenarios' guests have 2 vCPUs (MachineConfig's default).
SCENARIO_VCPUS = 2


def resolve_qemus(
    specs: list[str] | None, the_clock: Clock | None = None, vcpus: int = SCENARIO_VCPUS
) -> tuple[QemuChoice, ...]:
    """``--qemu`` once: this process's QEMU, which the scenarios inherit
    through $MEMQUAL_QEMU; twice: both fetched (or checked) before any job,
    each named by its arm's variants.  On the icount clock each must run
    2-vCPU guests: with no --qemu a system QEMU too old gives way to
    Debian's (memqual.host.core.qemu_binary.choose_for_clock), and one
    asked for is refused in one line.  ``vcpus``: what the guests need (a
    host under test runs one, host/core/nested.py)."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built

    the_clock = the_clock or clock.WALL_CLOCK
    fix = f"pass --qemu {clock.ICOUNT_SMP_QEMU} or --clock wall"
    if not specs:
        if not the_clock.strictest().icount:
            return ()
        choice, note = choose_for_clock(None, the_clock, vcpus, fix)
        if note:
            print(note, file=sys.stderr)
        return ()  # the scenarios inherit it through $MEMQUAL_QEMU
    if len(specs) == 1:
        return (choose_for_clock(specs[0], the_clock, vcpus, fix)[0],)
    choices = tuple(resolve(spec, cache_dir()) for spec in specs)
    for choice in choices:
        clock.check_vcpus(the_clock, vcpus, choice.version, fix)
    return choices


def planned(args: argparse.Namespace, config: RunConfig) -> tuple[RunConfig, clock.Default]:
    """The run on its clock (asked, else its default), refused in one line
    when --until-decided's budget cannot hold its checks and first blocks
    (host/run/budget.py): all before anything is built or written."""
    arms, asked = len(config.pairing), getattr(args, "clock", None)
    # Only a two-arm run's default or its budget's estimate reads the accelerator.
    accel = run_accel(config) if arms == 2 and (not asked or config.until_decided) else ("", "")
    chosen = choose_clock(asked, arms, accel)
    config = dataclasses.replace(config, clock=chosen.clock)
    budget.refuse_unfit(config, accel[0], list_tests)
    return config, chosen


def main(args: argparse.Namespace) -> int:
    config, chosen = planned(args, config_from_args(args))
    config = run_host(config)
    # Under auto the host under test's icount guests run one vCPU, its wall ones two.
    vcpus = nested.host_vcpus(SCENARIO_VCPUS, config.clock.strictest()) if config.hosts else SCENARIO_VCPUS
    config = dataclasses.replace(config, qemus=resolve_qemus(getattr(args, "qemu", None), config.clock, vcpus))
    # The scenarios (and a lab host's tasks) read the clock from here.
    clock.put(config.clock)
    # What the kernel files hold is read here, at the command, rather than
    # in config_from_args: a RunConfig may name any file (the unit tests run
    # fake jobs with stand-in kernels), a user's command line may not.
    check_guest_files(config)
    # After the checks: bad input is one line and nothing else.
    for line in clock_lines(config, chosen):
        print(line, file=sys.stderr)
    for index, host in enumerate(config.hosts):
        which = "every guest of both arms" if len(config.hosts) == 1 else f"arm {'AB'[index]}'s guests"
        print(f"host: {host.label('tcg')}, {which} (docs/host-under-test.md)", file=sys.stderr)
    return job.run(config)


def run_host(config: RunConfig) -> RunConfig:
    """The run's hosts under test, checked (their parameters against their
    kernels' modules), and the run on the clock they run on (icount no
    coarser than nested.MAX_SHIFT, said on stderr); one host for both arms
    is made the jobs' ($MEMQUAL_HOST_KERNEL), two are each arm's (the
    variants')."""
    if not config.hosts:
        return config
    config = dataclasses.replace(config, clock=host_checks.host_run_clock(config.clock))
    host_checks.check_hosts(config.hosts)
    if len(config.hosts) == 1:
        nested.put_environment(config.hosts[0])
    return config


def check_guest_files(config: RunConfig) -> None:
    """Refuse before the job starts what the image build in every scenario
    would refuse after it: a --guest-kernel without a bzImage's setup
    header (a text file, a vmlinux or another ELF) and a --guest-modules
    that is no modules tree.  The same checks as that build's."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import check_modules_tree

    for kernel in config.kernels:
        try:
            release = read_release(kernel.bzimage)
        except BadInput as exc:
            raise BadInput(f"--guest-kernel {exc}") from None
        if kernel.modules is not None:
            try:
                check_modules_tree(kernel.modules, release)
            except BadInput as exc:
                raise BadInput(f"--guest-modules {exc}") from None


COMMAND = Command(
    "run",
    help="the main job: run the scenarios, judge every claim, write results.json and report.html",
    configure=configure,
    run=main,
    description=DESCRIPTION,
)

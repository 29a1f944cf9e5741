"""Argument types shared by the subcommands: a bad value is argparse's one
line and exit status 2, with what a good value looks like."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from pathlib import Path

from memqual.host.core import clock
from memqual.host.core.clock import parse
from memqual.host.core.errors import BadInput
from memqual.host.core.kernelspec import parse_kernel
from memqual.host.core.nested import host_clock, host_vcpus, parse_host, parse_param
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.qemu_binary import choose_for_clock, is_path
from memqual.host.core.trust import check_output_dir
from memqual.images.balloon_driver import check_kernel_build
from memqual.images.kernel_import import kernel_of
from memqual.images.packages import check_kernel_name
from memqual.images.qemu import check_version_form


def percent(text: str) -> float:
    """A percentage strictly between 0 and 100 ("5" or "5%"), as given."""
    try:
        value = float(text.rstrip("%"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from exc
    if not 0.0 < value < 100.0:
        raise argparse.ArgumentTypeError(f"{text} must be a percentage between 0 and 100 (5 means 5%)")
    return value


def percent_as_fraction(text: str) -> float:
    """The same percentage as a fraction (5 -> 0.05)."""
    return percent(text) / 100.0


def fraction_below_one(text: str) -> float:
    """A fraction in [0, 1) (--threshold, --alpha): 0 counts every change."""
    value = non_negative(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction in [0, 1)")
    return value


def kernel_build(text: str) -> str:
    """``--kernel-build DIR``: a kernel build tree (Makefile, .config and
    Module.symvers), resolved; anything else is one line and exit 2."""
    try:
        return str(check_kernel_build(text))
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not math.isfinite(value):
        # nan compares false with every bound, and inf (also what 1e309
        # parses to) never ends a wait: neither is a usable figure.
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive(text: str) -> float:
    """A finite number above 0 (seconds, a cost)."""
    value = _number(text)
    if value <= 0.0:
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def non_negative(text: str) -> float:
    """A finite number of 0 or more."""
    value = _number(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"{text} must be a number of 0 or more")
    return value


def fraction(text: str) -> float:
    """A number strictly between 0 and 1 (an alpha, a relative threshold)."""
    value = _number(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be between 0 and 1 (0.05 means 5%)")
    return value


# Far above any count memqual uses (slots, repeats, MiB of guest memory),
# far below what would make a loop or an allocation run away.
COUNT_LIMIT = 1 << 24


def count(text: str) -> int:
    """A whole number from 1 to COUNT_LIMIT."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from exc
    if not 1 <= value <= COUNT_LIMIT:
        raise argparse.ArgumentTypeError(f"{text} must be a whole number, at least 1 and at most {COUNT_LIMIT}")
    return value


def seed(text: str) -> int:
    """A random seed: a whole number from 0 to 2**32 - 1 (numpy's range)."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from exc
    if not 0 <= value < 1 << 32:
        raise argparse.ArgumentTypeError(f"{text} must be a whole number from 0 to {(1 << 32) - 1}")
    return value


class Parser(argparse.ArgumentParser):
    """Usage errors are bad input too: one line, exit status 2 (argparse
    would print the whole usage first).  Subparsers inherit this class."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"memqual: error: {message} (see '{self.prog} --help')\n")


def count_or_zero(text: str) -> int:
    """A whole number from 0 to COUNT_LIMIT."""
    return 0 if text.strip() == "0" else count(text)


def kernel_name(text: str) -> str:
    """A kernel as a name: a Debian kernel's or a ``memqual kernel build``
    name as given, or a bzImage memqual built or imported, as that
    kernel's name (the name records and pages carry)."""
    if "/" not in text:
        return check_kernel_name(text)
    return kernel_of(Path(text)).name


def debian_kernel(text: str) -> str:
    """``--debian-kernel VERSION``: the form of a Debian kernel's name
    (checked before the archive is asked), or a built kernel's bzImage."""
    try:
        return kernel_name(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def debian_kernel_arm(text: str) -> str:
    """``memqual run --debian-kernel VERSION[:CMDLINE]``: a Debian kernel
    and, after the first colon, words added to its guest's command line (an
    A/B of one kernel with and without ``init_on_free=1``), both checked
    before the archive is asked."""
    try:
        spec = parse_kernel(text)
        return dataclasses.replace(spec, version=kernel_name(spec.version)).name
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def directory(text: str) -> str:
    """A directory that exists (to read from)."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {'not a directory' if path.exists() else 'no such directory'}")
    return text


def _trusted_output(path: Path, text: str) -> None:
    """The folder written into is no one else's (trust.check_output_dir)."""
    try:
        check_output_dir(path, "output folder")
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def directory_to_make(text: str) -> str:
    """A directory that exists, or one that can be made (what is already
    there on its way is a directory)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a directory; give a directory")
    if not _nearest_existing(path).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {_nearest_existing(path)} on its way is not a directory")
    return text


def output_directory(text: str) -> str:
    """A directory to write into (``directory_to_make``) that no other user
    owns or may write."""
    directory_to_make(text)
    _trusted_output(Path(text), text)
    return text


def output_file(text: str) -> str:
    """A file to write: never a directory, whatever already exists on its
    way is a directory (the writer makes the missing ones), and its folder
    is one no other user owns or may write."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory; give a file name")
    if not _nearest_existing(path.parent).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {_nearest_existing(path.parent)} on its way is not a directory")
    _trusted_output(path.parent, text)
    return text


def output_file_or_stdout(text: str) -> str:
    """``output_file``, or '-' for standard output."""
    return text if text == "-" else output_file(text)


def add_guest_kernel(parser: argparse.ArgumentParser) -> None:
    """The guest kernel as memqual boot and memqual image build take it:
    your own (--kernel, --modules, --kernel-build) or Debian's by name."""
    parser.add_argument("--kernel", type=Path, help="your own bzImage (with --modules)")
    parser.add_argument("--modules", type=Path, help="its lib/modules/RELEASE directory")
    parser.add_argument(
        "--kernel-build",
        type=kernel_build,
        metavar="DIR",
        help="the directory --kernel was built in: the balloon driver variant is built from it",
    )
    parser.add_argument(
        "--debian-kernel",
        type=debian_kernel,
        metavar="VERSION",
        help="a Debian kernel by release or package name (memqual image kernels lists them)",
    )


def host_param(text: str) -> str:
    """``--host-kernel-param module.param=value``, checked for form."""
    try:
        return parse_param(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_host_kernel(parser: argparse.ArgumentParser, more: str = "") -> None:
    """The host under test: a host kernel memqual boots under TCG with
    emulated SVM, whose KVM runs the guest (host/core/nested.py)."""
    parser.add_argument(
        "--host-kernel",
        action="append",
        type=debian_kernel_arm,
        metavar="KERNEL[:CMDLINE]",
        help="run the guest under the KVM of this host kernel (a Debian kernel by name, or a 'memqual kernel "
        "build' name or its bzImage), booted under TCG with emulated SVM (docs/host-under-test.md)" + more,
    )
    parser.add_argument(
        "--host-kernel-param",
        action="append",
        type=host_param,
        default=[],
        metavar="MODULE.PARAM=VALUE",
        help="a parameter of the host under test's kvm or kvm_amd (kvm.mmio_caching=0, kvm_amd.npt=0); repeatable",
    )


def one_host(args: argparse.Namespace) -> typing.Any:
    """The one host under test of a command that boots one guest, or None
    (this machine); a parameter without a host kernel is refused."""
    kernels = args.host_kernel or []
    if len(kernels) > 1:
        raise BadInput("--host-kernel given twice: this command runs one host; give --host-kernel once")
    if args.host_kernel_param and not kernels:
        raise BadInput("--host-kernel-param sets the host under test's KVM: give --host-kernel KERNEL with it")
    return parse_host(kernels[0], args.host_kernel_param) if kernels else None


def qemu_spec(text: str) -> str:
    """``--qemu VERSION|PATH``: a path, or the form of a version (checked
    before the archive is asked)."""
    if is_path(text):
        return text
    try:
        return check_version_form(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_qemu(parser: argparse.ArgumentParser, more: str = "") -> None:
    """``--qemu VERSION|PATH``: which QEMU runs the guests.  Collected as a
    list: a QEMU is part of what an arm of an A/B comparison is (``more``
    says how a command that takes two uses them)."""
    parser.add_argument(
        "--qemu",
        action="append",
        type=qemu_spec,
        metavar="VERSION|PATH",
        help="a QEMU of Debian's archive by version (memqual qemu list), fetched into the cache, "
        "a QEMU built here by name (memqual qemu build), or your own qemu-system-x86_64; "
        "default: $MEMQUAL_QEMU, else the system's" + more,
    )


def one_qemu(specs: list[str] | None) -> str | None:
    """The one ``--qemu`` of a command that runs a single QEMU."""
    if specs and len(specs) > 1:
        raise BadInput("--qemu given twice: this command runs one QEMU; give --qemu once")
    return specs[0] if specs else None


def clock_spec(text: str) -> str:
    """``--clock wall|icount[:SHIFT]``, checked, as its label."""
    try:
        found = parse(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if found.auto:
        raise argparse.ArgumentTypeError(
            f"--clock {text}: auto is a plan for the scenarios of a run (memqual run, bisect); one guest runs on "
            f"wall or icount:{found.shift}"
        )
    return found.label


def plan_spec(text: str) -> str:
    """``--clock wall|icount[:SHIFT]|auto[:SHIFT]``, checked, as its label."""
    try:
        return parse(text).label
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


CLOCK_HELP = (
    "wall: guests as fast as the host lets them (multi-threaded TCG or KVM), guest timings in real time; "
    "icount[:SHIFT] (default shift 4): single-threaded TCG with -icount shift=SHIFT,sleep=off, so a guest "
    "timing counts guest instructions (2^SHIFT ns each) and host load cannot move it; needs TCG, and "
    "QEMU 10 for 2-vCPU guests (fetched from Debian's archive when the system's is older)"
)


def add_clock(parser: argparse.ArgumentParser, default_says: str, plan: bool = False) -> None:
    """``--clock``: the clock the guests' timings are read with
    (memqual.host.core.clock); ``default_says`` what the command does
    without it.  ``plan``: a command that runs scenarios, which may also
    take ``auto`` (each scenario on the clock that decides its primaries,
    host/judge/clock_plan.py)."""
    parser.add_argument(
        "--clock",
        type=plan_spec if plan else clock_spec,
        metavar="wall|icount[:SHIFT]" + ("|auto[:SHIFT]" if plan else ""),
        help=CLOCK_HELP
        + (
            "; auto[:SHIFT]: each scenario's test on the clock its primaries' measured block spreads decide "
            "them on in fewer blocks (icount at SHIFT, or wall), every record naming its own"
            if plan
            else ""
        )
        + "; "
        + default_says,
    )


def guest_on_clock(args: argparse.Namespace, host: typing.Any = None) -> tuple[typing.Any, typing.Any, str]:
    """The one guest of ``boot`` and the lab's ``bench_boot`` from their shared
    options: its MachineConfig on the asked clock (else ``$MEMQUAL_CLOCK``,
    else wall), the QEMU that can run it there, and a note when a QEMU was
    swapped in.  KVM under icount and a QEMU too old for the vCPUs are one
    line each, before any image is built or guest booted.  Under a host
    under test (``host``) the clock and the vCPUs are the ones L1 can run
    (host/core/nested.py), and the note says what changed."""
    the_clock = clock.parse(args.clock) if args.clock else clock.current()
    clock.resolve_accel(the_clock, args.accel)
    cpus, notes = args.cpus, []
    if host is not None:
        asked = the_clock
        the_clock = host_clock(asked)
        cpus = host_vcpus(args.cpus, the_clock)
        if the_clock != asked:
            notes.append(
                f"the host under test runs on {the_clock.label}, not {asked.label}: its figures were measured "
                "there, and at shift 4 its guest stalls"
            )
        if cpus != args.cpus:
            notes.append(f"on icount the host under test and its guest run {cpus} vCPU each, not {args.cpus}")
    config = MachineConfig(
        memory_mib=args.memory,
        cpus=cpus,
        machine=args.machine,
        accel=args.accel,
        warm=args.warm,
        clock=the_clock.label,
    )
    qemu, note = choose_for_clock(
        one_qemu(args.qemu),
        the_clock,
        cpus,
        f"pass --qemu {clock.ICOUNT_SMP_QEMU}, or --cpus 1, or --clock wall",
    )
    return config, qemu, "; ".join(n for n in (note, *notes) if n)

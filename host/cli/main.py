"""The ``memqual`` entry point: the parser from the command table
(host/cli/commands.py), and every MemqualError turned into one line on
stderr and its exit status (2 for bad input), never a traceback
(MEMQUAL_DEBUG=1 shows one).  Knows no command by name.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import warnings

from memqual.host.cli.args import Parser
from memqual.host.cli.command import add_commands, run_command
from memqual.host.cli.commands import COMMANDS, OPTIONS
from memqual.host.core import knobs, leftovers, scenario, settings
from memqual.host.core.errors import LaunchError, MemqualError
from memqual.host.core.printable import printable


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="memqual",
        description="End-to-end qualification of memory virtualization on QEMU/KVM.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True), COMMANDS, OPTIONS)
    return parser


def _restore_stale_host_state(command: str) -> None:
    """A memqual run killed with SIGKILL leaves host knobs changed; the next
    memqual start puts them back (``memqual ksm restore`` reports it itself).
    Quiet when there is nothing to do or when not root.  Every knob set a
    scenario row names (host/core/scenario.py)."""
    sets = tuple(s for s in scenario.knob_sets() if not (command == "ksm" and s.name == "ksm"))
    for restored in knobs.restore_every_stale(sets):
        logging.getLogger("memqual").warning("%s", restored)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _command(argv)
        finally:
            # Flushed here, after argparse's --help too: a reader that went
            # away shows now, not as Python's "Exception ignored" at exit.
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        return _end_on_closed_stdout()
    except SystemExit as exc:
        # rich's Console meets a closed stdout this way: it points stdout at
        # /dev/null and exits 1 while handling the BrokenPipeError.
        if exc.code == 1 and isinstance(exc.__context__, BrokenPipeError):
            return _end_on_closed_stdout()
        raise


def _stdout_closed() -> bool:
    """Whether standard output is a pipe or socket nobody reads any more
    (poll says POLLERR), as opposed to a broken pipe of some other file."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _end_on_closed_stdout() -> int:
    """``memqual ... | head -1``: the reader has what it wanted, which is no
    error of memqual's, so no message.  The status is 141 (128 + SIGPIPE):
    what the shell shows for a Unix tool killed by the closed pipe (``yes |
    head -1``), and how memqual reports the other signals that end it
    (128 + the signal), so a ``set -o pipefail`` script sees the cut-off
    as it sees any other tool's.  Dying of SIGPIPE itself is no option: it
    would also end memqual on a closed SSH or QMP socket, without restoring
    the host's knobs or ending the job."""
    # Python flushes stdout once more at exit: let that go to /dev/null.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _command(argv: list[str] | None) -> int:
    # Avocado 113 imports pkg_resources, whose deprecation warning would be
    # a second line under every error of a command that loads Avocado.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # qemu.qmp logs its connection failures itself; memqual reports them
        # as one LaunchError line, so its own lines would only repeat it.
        logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)
        # paramiko logs a traceback for each connect that finds no banner
        # yet (an L1 still booting its SSH server): memqual retries those
        # and says itself when the last one failed.
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    try:
        _restore_stale_host_state(args.command)
        leftovers.sweep_process_dirs()  # of runs that were killed
        return run_command(args)
    except MemqualError as exc:
        if settings.debug():
            raise
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # The message may quote a file, a test or a host: no escape sequence of theirs.
        print(f"memqual: error: {printable(message)}", file=sys.stderr)
        if isinstance(exc, LaunchError) and args.verbose:
            print(exc.details(), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)  # memqual.host.run.signals turns SIGTERM/SIGHUP into this too
        print(f"memqual: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + int(signum)
    except MemoryError:
        # an input no bound here caught: what to do is give a smaller one
        if settings.debug():
            raise
        print(f"memqual: error: out of memory: is an input file too large? {DEBUG_HINT}", file=sys.stderr)
        return 2
    except Exception as exc:  # the last line of defence: one line, not a traceback
        if isinstance(exc, BrokenPipeError) and _stdout_closed():
            raise  # the reader went away: main ends quietly
        if settings.debug():
            raise
        print(f"memqual: error: {printable(_unexpected(exc))}", file=sys.stderr)
        return 1


DEBUG_HINT = "(MEMQUAL_DEBUG=1 shows the traceback)"


def _unexpected(exc: BaseException) -> str:
    """One line for an error memqual did not foresee: what happened, and
    what to do.  Operational (exit 1): the disk, a tool, the system."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        what = f"{exc.strerror or exc}{where}"
        hint = "free some space and run it again" if exc.errno == 28 else "check that path and run it again"
        return f"{what}: {hint} {DEBUG_HINT}"
    if isinstance(exc, subprocess.CalledProcessError):
        cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        return f"{cmd[:120]} exited {exc.returncode}: run it by hand to see why {DEBUG_HINT}"
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"{exc.cmd} took longer than {exc.timeout:.0f} s: is the host overloaded? {DEBUG_HINT}"
    first = str(exc).splitlines()[0] if str(exc) else ""
    return (
        f"unexpected {type(exc).__name__}{': ' + first if first else ''}; "
        "run again with MEMQUAL_DEBUG=1 for the traceback and report it"
    )


if __name__ == "__main__":
    sys.exit(main())

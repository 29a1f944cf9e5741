"""The one shape of a memqual command, and the parser built from a table of
them (host/cli/commands.py).  A command module fills its own parser and
runs; an option one feature adds to another command (the lab hosts'
``--hosts`` on ``run``) is an ``Option`` in the table, never an edit of a
parser already built.  Only host/cli/ uses argparse.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence

from memqual.host.cli.args import Parser

Run = Callable[[argparse.Namespace], int]


@dataclasses.dataclass(frozen=True)
class Command:
    """``memqual NAME``: its one line in ``memqual --help``, how it fills
    its parser, and what it runs (the exit status).  A command with
    subcommands sets ``handler`` on each in ``configure`` and runs
    ``dispatch``."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Run
    description: str | None = None


@dataclasses.dataclass(frozen=True)
class Option:
    """Options a feature adds to another command: ``configure`` adds them
    to that command's parser, and ``run`` is given the parsed arguments and
    the command's own run, to call or to stand in for."""

    command: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Run], int]


def dispatch(args: argparse.Namespace) -> int:
    """The run of a command with subcommands: the chosen one's handler."""
    return int(args.handler(args))


def with_option(option: Option, inner: Run) -> Run:
    def run(args: argparse.Namespace) -> int:
        return option.run(args, inner)

    return run


def add_commands(
    subparsers: argparse._SubParsersAction, commands: Sequence[Command], options: Sequence[Option] = ()
) -> None:
    """One parser a command, in the table's order, each with the options
    other features add to it; ``args.command_run`` is what ``memqual``
    runs."""
    known = {c.name for c in commands}
    for option in options:
        if option.command not in known:
            raise ValueError(f"an option for {option.command!r}, which is no command")
    for command in commands:
        parser = subparsers.add_parser(command.name, help=command.help, description=command.description)
        command.configure(parser)
        run = command.run
        for option in options:
            if option.command == command.name:
                option.configure(parser)
                run = with_option(option, run)
        parser.set_defaults(command_run=run)


def parser_for(*commands: Command, options: Sequence[Option] = ()) -> argparse.ArgumentParser:
    """A parser of only these commands (what a test of one command needs)."""
    parser = Parser(prog="memqual")
    add_commands(parser.add_subparsers(dest="command", required=True), commands, options)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run what the parsed command line chose."""
    return int(args.command_run(args))

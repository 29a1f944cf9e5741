"""``python -m memqual.host.cli.supervisor [--grace S] -- avocado run ...``:
the process ``memqual run`` starts its Avocado job under
(memqual.host.run.supervisor does the work).  A tiny entry point.
"""

from __future__ import annotations

import argparse

from memqual.host.run import supervisor


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m memqual.host.cli.supervisor", description=supervisor.__doc__)
    parser.add_argument("--grace", type=float, default=supervisor.GRACE_S, help="seconds between SIGINT and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- avocado run ...")
    parsed = parser.parse_args(args)
    command = parsed.command[1:] if parsed.command[:1] == ["--"] else parsed.command
    if not command:
        parser.error("give the command to supervise after --")
    supervisor.exit_like(supervisor.supervise(command, parsed.grace))


if __name__ == "__main__":
    main()

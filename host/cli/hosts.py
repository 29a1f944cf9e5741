"""``memqual hosts check FILE`` and ``memqual hosts probe`` (what the
controller runs on each lab host over SSH)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command, Option, Run, dispatch
from memqual.host.cli.run import config_from_args
from memqual.host.core import clock
from memqual.host.run.hosts import check
from memqual.host.run.hosts.config import load
from memqual.host.run.hosts.probe import probe


def configure(parser: argparse.ArgumentParser) -> None:
    hosts = parser.add_subparsers(dest="hosts_command", metavar="SUBCOMMAND", required=True)
    check = hosts.add_parser(
        "check",
        help="for each host: reachable over SSH, same memqual, QEMU and KVM (its own doctor), free",
        description="For each [[host]] of FILE: reachable (key-based SSH, host key in its known_hosts), "
        "memqual there in this version, QEMU and a KVM that boots Linux (memqual doctor there), and free "
        "(no other memqual holding its measurement lock).  Exit 0 when every host is ready, 1 otherwise.",
    )
    check.add_argument("file", metavar="FILE", help="hosts file (TOML, one [[host]] table a host)")
    check.add_argument("--json", action="store_true", help="one JSON object")
    check.add_argument(
        "--qemu",
        type=cliargs.qemu_spec,
        metavar="VERSION|PATH",
        help="check this QEMU on every host (its doctor fetches an archive version into that host's cache; a "
        "path is a path there) instead of the host's own; each host's QEMU is reported either way",
    )
    check.set_defaults(handler=_check)
    probe = hosts.add_parser("probe", help="this host's answer to a controller (JSON); ends QEMUs left behind")
    probe.add_argument(
        "--qemu",
        type=cliargs.qemu_spec,
        metavar="VERSION|PATH",
        help="make this QEMU this host's first (a version is fetched from this host's archive into its cache) "
        "and answer its binary, or why this host cannot have it",
    )
    probe.set_defaults(handler=_probe)


def configure_run(parser: argparse.ArgumentParser) -> None:
    """``memqual run --hosts FILE``: an option of the run command that
    belongs to the fleet, so that the job knows nothing of lab hosts."""
    parser.add_argument(
        "--hosts",
        metavar="FILE",
        help="run over the lab hosts of FILE (TOML, one [[host]] table a host; docs/hosts.md): one Avocado job, "
        "results per host under OUTPUT/hosts/ and the fleet page OUTPUT/fleet.html; exit 3 when a host was left "
        "out or lost",
    )


def run_on_hosts(args: argparse.Namespace, plain: Run) -> int:
    """``memqual run`` as it is without --hosts; with it, the fleet's run."""
    if not args.hosts:
        return plain(args)
    # lazy: numpy and scipy (~300 ms) only for this command
    from memqual.host.run.hosts import fleet

    config = config_from_args(args)
    # The clock reaches every host's tasks through $MEMQUAL_CLOCK (forwarded).
    clock.put(config.clock)
    # --qemu is not resolved here: each host fetches it for itself.
    return fleet.main(config, args.hosts, getattr(args, "qemu", None))


def _check(args: argparse.Namespace) -> int:
    hosts = load(Path(args.file))
    results = check.for_each(hosts, lambda host: check.check_host(host, qemu=args.qemu))
    if args.json:
        print(json.dumps({"hosts": [r.to_json() for r in results]}, indent=2))
    else:
        for line in check.lines(results):
            print(line)
    return 0 if all(r.usable for r in results) else 1


def _probe(args: argparse.Namespace) -> int:
    print(json.dumps(probe(args.qemu).to_json()))
    return 0


COMMAND = Command(
    "hosts",
    help="lab hosts: check the hosts of a hosts file (memqual run --hosts FILE)",
    configure=configure,
    run=dispatch,
)
RUN_ON_HOSTS = Option("run", configure=configure_run, run=run_on_hosts)

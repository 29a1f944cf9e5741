"""``memqual run --hosts FILE``: one Avocado job over every lab host.

1. Every host of FILE is probed over SSH (``memqual hosts probe`` there: its
   memqual version, kernel, lock; QEMUs left behind by a lost connection are
   ended).  A host that cannot be reached or runs another memqual is
   reported and left out.
2. The hosts become the configuration of Avocado's remote spawner: one JSON
   slot file per slot (aexpect's ssh login, with the options of
   memqual.host.hosts.ssh), and an Avocado config file that selects memqual's
   subclass of the spawner (memqual.host.hosts.spawner).  Tasks report to Avocado's
   status server on 127.0.0.1 here, through a reverse SSH forward to the
   same port on each host's loopback: nothing listens on another address.
3. ``avocado run`` with one variant per host (``run.dict_variants``,
   ``lab_host``): every test becomes one task per host, and Avocado's
   state machine starts them (its scheduler, not memqual's); the spawner
   hands each to a slot of its own host.
4. Each task's ``fleet-place.json`` says where it ran and how it ended.
   The records of the tasks that ran to their end on a host make that
   host's results (OUTPUT/hosts/NAME/results.json and report.html, each
   record's environment naming the host as ``lab_host``); the fleet page
   (OUTPUT/fleet.html, OUTPUT/fleet.json) sets every claim's verdict on
   every host side by side.

Exit status: 0 when every host completed and every test passed; 1 when
tests failed; 3 when a host was left out or lost (the fleet did not
complete); 2 for bad input.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shlex
import shutil
import socket
from pathlib import Path
from typing import Any

from memqual.host.errors import BadInput
from memqual.host.hosts import check as checks
from memqual.host.hosts import page, ssh
from memqual.host.hosts.config import LabHost
from memqual.host.hosts.config import load as load_hosts
from memqual.host.hosts.spawner import (
    LOGIN_TIMEOUT_S,
    LOST_FILE,
    NOT_RUN,
    RAN,
    VARIANT_KEY,
    FleetSpec,
    Place,
    read_place,
)
from memqual.host.runjob import JobOutcome, RunConfig, TestOutcome, run_avocado, terminate_as_exception, write_outputs

EXIT_INCOMPLETE = 3
SPAWNER = "memqual-remote"
SCRATCH = "tmp"  # the job's $TMPDIR under fleet/: aexpect's session files, never in /tmp
# The parameters of a run that reach every task (the local job inherits
# the whole environment; a remote task gets these).
FORWARDED_ENV = ("MEMQUAL_WARM", "MEMQUAL_KSM_PAGES_TO_SCAN")
# Matches the shell prompt of the remote login shell (aexpect waits for it).
PROMPT = r"[\#\$]\s*$"
# The remote spawner's own limit for one task: the longest scenario's
# timeout (e2e/base.py) and some.
TASK_TIMEOUT_S = 1200
JOB_TIMEOUT_S = 12 * 3600  # a full profile takes about an hour on one machine


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """One test of the job, with where it ran."""

    id: str
    status: str  # Avocado's
    reason: str
    time: float | None
    logdir: Path | None
    place: Place | None

    @property
    def host(self) -> str:
        return self.place.host if self.place else ""

    @property
    def outcome(self) -> str:
        if self.place is None:
            return NOT_RUN
        return self.place.outcome


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def slot_login(host: LabHost, status_port: int, forward: bool) -> dict[str, Any]:
    """aexpect.remote.remote_login's arguments for one slot on ``host``.
    aexpect runs its ssh command through a shell: every word is quoted."""
    extra = ssh.options(host) + ["-o", "ExitOnForwardFailure=yes"]
    if forward:
        # The host's tasks post their status to 127.0.0.1:PORT there,
        # which is this machine's status server on 127.0.0.1:PORT.
        extra += ["-R", f"127.0.0.1:{status_port}:127.0.0.1:{status_port}"]
    return {
        "client": "ssh",
        "host": host.address,
        "port": host.port,
        "username": host.user,
        "password": "",
        "prompt": PROMPT,
        "identity_file": shlex.quote(str(host.key)),
        "user_known_hosts_file": shlex.quote(str(host.known_hosts)),
        "preferred_authentication": "publickey",
        "extra_cmdline": shlex.join(extra),
        "timeout": LOGIN_TIMEOUT_S,
    }


def write_spawner_config(fleet_dir: Path, hosts: list[LabHost], status_port: int, profile: str) -> Path:
    """The slot files, memqual's fleet file and Avocado's config file that
    names them; returns the config file."""
    fleet_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    slot_files: dict[str, LabHost] = {}
    for host in hosts:
        for index in range(host.slots):
            path = fleet_dir / f"slot-{host.name}-{index + 1}.json"
            # Only one session per host can hold the reverse forward.
            _write_private(path, json.dumps(slot_login(host, status_port, forward=index == 0), indent=2))
            slot_files[str(path)] = host
    environment = {"MEMQUAL_PROFILE": profile}
    environment.update({k: os.environ[k] for k in FORWARDED_ENV if k in os.environ})
    spec = FleetSpec(slots=slot_files, environment=environment)
    spec_path = fleet_dir / "fleet-spec.json"
    _write_private(spec_path, json.dumps(spec.to_json(), indent=2))
    config = fleet_dir / "avocado.conf"
    listen = f"127.0.0.1:{status_port}"
    _write_private(
        config,
        "\n".join(
            [
                "[run]",
                f"spawner = {SPAWNER}",
                "status_server_auto = False",
                f"status_server_listen = {listen}",
                f"status_server_uri = {listen}",
                # One variant per host: every test becomes one task per host.
                f"dict_variants = {[{VARIANT_KEY: h.name} for h in hosts]!r}",
                # Every wait has a deadline: Avocado waits for a finished
                # task's last status message without one of its own.
                "[job.run]",
                f"timeout = {JOB_TIMEOUT_S}",
                "[run.dict_variants]",
                f"variant_id_keys = {[VARIANT_KEY]!r}",
                "[spawner.remote]",
                f"slots = {sorted(slot_files)!r}",
                f"test_timeout = {TASK_TIMEOUT_S}",
                "[spawner.memqual]",
                f"fleet = {spec_path}",
                "",
            ]
        ),
    )
    return config


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + ("" if text.endswith("\n") else "\n"))


def task_results(job: JobOutcome) -> list[TaskResult]:
    """Every task of the job, with its place (the spawner's
    fleet-place.json in its directory) and Avocado's status where Avocado
    has one (a task that never started is in no results.json)."""
    if job.job_dir is None:
        return []
    statuses: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError, ValueError):
        for t in json.loads((job.job_dir / "results.json").read_text()).get("tests", []):
            if t.get("logdir"):
                statuses[str(Path(t["logdir"]).resolve())] = t
    out = []
    for logdir in sorted((job.job_dir / "test-results").glob("*/"), key=_task_order):
        if not logdir.name[:1].isdigit():  # by-status/ and the like: links, not tasks
            continue
        place = read_place(logdir)
        t = statuses.get(str(logdir.resolve()), {})
        reason = str(t.get("fail_reason") or "")
        out.append(
            TaskResult(
                id=str(t.get("name") or (place.task if place else "") or logdir.name),
                status=str(t.get("status") or ("SKIP" if place is None or place.outcome != RAN else "?")),
                reason="" if reason == "<unknown>" else reason,
                time=t.get("time_elapsed"),
                logdir=logdir,
                place=place,
            )
        )
    return out


def _task_order(path: Path) -> tuple[int, str]:
    head = path.name.split("-", 1)[0]
    return (int(head) if head.isdigit() else 0, path.name)


def read_lost(fleet_dir: Path) -> dict[str, str]:
    """The hosts the spawner lost during the job: name -> why."""
    try:
        data = json.loads((fleet_dir / LOST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def host_records(tasks: list[TaskResult], host: str, into: Path) -> int:
    """Copy the records of the tasks that ran to their end on ``host`` into
    ``into``, each naming the host in its environment; returns how many.
    A task that was interrupted contributes nothing."""
    from memqual.host import record

    into.mkdir(parents=True, exist_ok=True)
    count = 0
    for task in tasks:
        if task.host != host or task.outcome != RAN or task.logdir is None:
            continue
        for path in sorted(task.logdir.rglob(record.RECORD_GLOB)):
            data = json.loads(path.read_text())
            data.setdefault("environment", {})["lab_host"] = host
            # Still a record's name (memqual-*.json), made unique by the task.
            target = into / f"{path.stem}-task{task.logdir.name.split('-', 1)[0]}{path.suffix}"
            target.write_text(json.dumps(data, indent=2) + "\n")
            count += 1
    return count


def run(config: RunConfig, hosts_file: Path, console: Any = None) -> int:
    from rich.console import Console

    console = console or Console(width=120)
    hosts = load_hosts(hosts_file)
    # Absolute: avocado runs from the repository, and the spawner's config
    # and the job's TMPDIR are paths under the output.
    config = dataclasses.replace(config, output=config.output.resolve())
    config.output.mkdir(parents=True, exist_ok=True)
    probed = checks.for_each(hosts, checks.probe_host)
    for line in checks.lines(probed):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    usable = [c.host for c in probed if c.usable]
    left_out = {c.host.name: c.problem for c in probed if not c.usable}
    fleet_dir = config.output / "fleet"
    tasks: list[TaskResult] = []
    job: JobOutcome | None = None
    if usable:
        status_port = free_loopback_port()
        avocado_config = write_spawner_config(fleet_dir, usable, status_port, config.profile)
        # aexpect keeps each SSH session's fifos and logs under $TMPDIR and
        # removes them only when the session closes: a killed memqual would
        # leave them in /tmp.  Here they stay inside the run's own output,
        # cleared when the job ends and before the next run into it.
        scratch = fleet_dir / SCRATCH
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(mode=0o700, parents=True)
        job_config = dataclasses.replace(
            config,
            parallel=sum(h.slots for h in usable),
            avocado_global_args=("--config", str(avocado_config)),
            environment=(("TMPDIR", str(scratch)),),
        )
        try:
            with terminate_as_exception():
                job = run_avocado(job_config, config.output / "avocado", None, console)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        console.print(
            f"avocado: {job.summary or 'no summary'} (exit {job.exit_status}); job directory {job.job_dir}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        tasks = task_results(job)
    lost = read_lost(fleet_dir)
    columns = []
    for check in probed:
        name = check.host.name
        status = "left out" if name in left_out else "lost" if name in lost else "completed"
        results = None
        if name not in left_out:
            results = _host_results(config, name, tasks, job, console)
        columns.append(
            page.HostColumn(
                name=name,
                status=status,
                reason=left_out.get(name) or lost.get(name, ""),
                boot_id=check.probe.boot_id if check.probe else "",
                environment=check.probe.environment if check.probe else {},
                results=results,
                report=f"hosts/{name}/report.html" if results is not None else "",
                results_path=f"hosts/{name}/results.json" if results is not None else "",
                tasks=tuple(_task_line(t) for t in tasks if t.host == name),
            )
        )
    unplaced = tuple(_task_line(t) for t in tasks if not t.host)
    fleet = page.Fleet(columns=tuple(columns), not_run=unplaced, avocado=job.to_json() if job else None)
    page.write(fleet, config.output)
    console.print(f"wrote {config.output / 'fleet.html'} and {config.output / 'fleet.json'}", highlight=False)
    for line in page.summary_lines(fleet):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if left_out or lost or unplaced or not usable:
        return EXIT_INCOMPLETE
    if job is not None and not job.completed:
        return 1
    return 0


def _task_line(t: TaskResult) -> page.TaskLine:
    reason = t.place.reason if t.place and t.place.reason else t.reason
    return page.TaskLine(t.id, t.host, t.outcome, reason)


def _host_results(config: RunConfig, name: str, tasks: list[TaskResult], job: JobOutcome | None, console: Any) -> Any:
    """results.json and report.html of one host, from the tasks that ran
    there to their end."""
    from rich.console import Console

    out_dir = config.output / "hosts" / name
    records_dir = out_dir / "records"
    mine = [t for t in tasks if t.host == name]
    count = host_records(tasks, name, records_dir)
    counts: dict[str, int] = {}
    for t in mine:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1
    host_job = JobOutcome(
        command=job.command if job else [],
        exit_status=job.exit_status if job else 0,
        job_dir=records_dir,
        summary=f"lab host {name}: " + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) + f"; {count} records",
        # A task that did not run to its end is no evidence: the claims
        # say "not measurable" with its reason.
        tests=[
            TestOutcome(t.id, t.status, t.reason, t.time)
            if t.outcome == RAN
            else TestOutcome(t.id, "INTERRUPTED", _task_line(t).reason, t.time)
            for t in mine
        ],
        counts=counts,
    )
    # Each host's tables are in its report; the terminal gets the fleet's summary.
    quiet = Console(file=io.StringIO(), width=120)
    results = write_outputs(out_dir, [host_job], config, None, quiet)
    console.print(f"lab host {name}: wrote {out_dir / 'results.json'} and {out_dir / 'report.html'}", highlight=False)
    return results


def main(config: RunConfig, hosts_file: str) -> int:
    path = Path(hosts_file)
    if config.kernels or config.rounds != 1 or config.until_decided:
        raise BadInput(
            "--hosts runs one round with each host's own image: leave out --guest-kernel, --debian-kernel and --rounds"
        )
    return run(config, path)

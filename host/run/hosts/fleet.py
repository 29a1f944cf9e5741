"""``memqual run --hosts FILE``: one Avocado job over every lab host.

Each host probed over SSH, the reachable ones made slots of Avocado's
remote spawner (status through a reverse-forwarded UNIX socket in a fresh
0700 directory), one variant per host, then each host's results and the
fleet page.  Exit status 0, 1 (tests failed), 3 (a host left out or lost)
or 2 (bad input).  The steps in full: docs/hosts.md, "How
host/run/hosts/fleet.py runs the fleet".
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core import record, settings
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.printable import console as printable_console
from memqual.host.core.printable import printable
from memqual.host.core.qemu_binary import ENV_QEMU
from memqual.host.report import fleet_page as page
from memqual.host.run.avocado import run_avocado
from memqual.host.run.config import JobOutcome, RunConfig, TestOutcome
from memqual.host.run.hosts import check as checks
from memqual.host.run.hosts import ssh
from memqual.host.run.hosts.config import LabHost
from memqual.host.run.hosts.config import load as load_hosts
from memqual.host.run.hosts.spawner import (
    LOGIN_TIMEOUT_S,
    LOST_FILE,
    NOT_RUN,
    RAN,
    VARIANT_KEY,
    FleetSpec,
    Place,
    read_place,
    read_regular_file,
)
from memqual.host.run.hosts.status_relay import StatusRelay
from memqual.host.run.outputs import write_outputs
from memqual.host.run.signals import terminate_as_exception

if TYPE_CHECKING:
    from rich.console import Console

    from memqual.host.judge.results import Results

EXIT_INCOMPLETE = 3
SPAWNER = "memqual-remote"
SCRATCH = "tmp"  # the job's $TMPDIR under fleet/: aexpect's session files, never in /tmp
# The parameters of a run that reach every task (the local job inherits
# the whole environment; a remote task gets these).
FORWARDED_ENV = settings.FORWARDED_TO_LAB_HOSTS
# Matches the shell prompt of the remote login shell (aexpect waits for it).
PROMPT = r"[\#\$]\s*$"
# The remote spawner's own limit for one task: the longest scenario's
# timeout (e2e/base.py) and some.
TASK_TIMEOUT_S = 1200
JOB_TIMEOUT_S = 12 * 3600  # a full profile takes about an hour on one machine
STATUS_SOCKET = "status.sock"
# The status channel's directory on a lab host, as its mktemp makes it
# (memqual.host.run.hosts.probe removes those a killed run left).
REMOTE_STATUS_DIR = re.compile(r"/tmp/memqual-status\.[A-Za-z0-9]{10}")
# A UNIX socket path holds at most 107 bytes; ssh reads ":" in -R as a
# separator and expands "%" tokens in socket paths; Avocado reads a status
# URI with ":" as host:port.
_SOCKET_PATH = re.compile(r"/[A-Za-z0-9_./-]{1,99}")
REMOTE_COMMAND_S = 20.0
MAX_RECORD_BYTES = 64 * 2**20
MAX_HOSTS = 999  # relay sockets are numbered: the longest name decides where they go


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


def local_status_socket(fleet_dir: Path) -> tuple[str, Path | None]:
    """Where Avocado's status server listens: ``fleet/status.sock`` (the
    run's private directory) when that path can be a UNIX socket for
    Avocado and ssh, else in a fresh private directory under /tmp, which
    is returned to be removed after the job.  Each host's relay socket
    (``relay_sockets``) goes beside it."""
    path = str(fleet_dir / STATUS_SOCKET)
    if _SOCKET_PATH.fullmatch(path.replace(STATUS_SOCKET, f"relay-{MAX_HOSTS}.sock")):
        return path, None
    private = Path(tempfile.mkdtemp(prefix="memqual-status.", dir="/tmp"))
    return str(private / STATUS_SOCKET), private


def relay_sockets(local_socket: str, hosts: list[LabHost]) -> dict[str, str]:
    """Each host's own socket here, which its reverse forward ends at
    (host/run/hosts/status_relay.py): beside the status server's."""
    folder = os.path.dirname(local_socket)
    return {h.name: f"{folder}/relay-{index}.sock" for index, h in enumerate(hosts, 1)}


def remote_status_dir(host: LabHost) -> tuple[str, str]:
    """A fresh 0700 directory on ``host`` for its end of the status channel:
    (its path, "") or ("", the problem)."""
    try:
        result = ssh.run(host, ["mktemp", "-d", "/tmp/memqual-status.XXXXXXXXXX"], REMOTE_COMMAND_S)
    except subprocess.TimeoutExpired:
        return "", f"no answer within {REMOTE_COMMAND_S:.0f} s to mktemp"
    if result.returncode != 0:
        return "", f"could not make the status channel's directory: {ssh.ssh_error(result)}"
    path = result.stdout.strip()
    if not REMOTE_STATUS_DIR.fullmatch(path):  # the host's answer goes on an ssh command line
        return "", f"mktemp there answered {path[:80]!r}, not a /tmp/memqual-status.* directory"
    return path, ""


def remove_remote_dir(host: LabHost, path: str) -> None:
    """Best effort: a lost host cannot be reached; its next probe removes
    the directory once it is stale."""
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        ssh.run(host, ["rm", "-rf", "--", path], REMOTE_COMMAND_S)


def slot_login(host: LabHost, local_socket: str, remote_socket: str, forward: bool) -> dict[str, Any]:
    """aexpect.remote.remote_login's arguments for one slot on ``host``.
    aexpect runs its ssh command through a shell: every word is quoted."""
    extra = ssh.options(host) + ["-o", "ExitOnForwardFailure=yes"]
    if forward:
        # The host's tasks post their status to the socket there, which is
        # the status server's socket here.
        extra += ["-R", f"{remote_socket}:{local_socket}"]
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


def conf_value(text: str) -> str:
    """``text`` as a value of avocado.conf: Avocado reads it with
    configparser's interpolation, where "%" starts a reference; a line
    break would start another key."""
    if "\n" in text or "\r" in text:
        raise BadInput(f"{text!r}: a path with a line break cannot go into Avocado's config: choose another --output")
    return text.replace("%", "%%")


def write_spawner_config(
    fleet_dir: Path,
    hosts: list[LabHost],
    local_socket: str,
    remote_dirs: dict[str, str],
    profile: str,
    host_environment: dict[str, dict[str, str]] | None = None,
) -> Path:
    """The slot files, memqual's fleet file and Avocado's config file that
    names them; returns the config file.  ``remote_dirs``: each host's
    status channel directory (remote_status_dir); ``host_environment``:
    what each host's tasks get beside the run's environment."""
    fleet_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    slot_files: dict[str, LabHost] = {}
    sockets = {h.name: f"{remote_dirs[h.name]}/{STATUS_SOCKET}" for h in hosts}
    relays = relay_sockets(local_socket, hosts)
    for host in hosts:
        for index in range(host.slots):
            path = fleet_dir / f"slot-{host.name}-{index + 1}.json"
            # Only one session per host can hold the reverse forward; it
            # ends at the host's own relay, not at the status server.
            login = slot_login(host, relays[host.name], sockets[host.name], forward=index == 0)
            _write_private(path, json.dumps(login, indent=2))
            slot_files[str(path)] = host
    environment = {settings.PROFILE: profile}
    environment.update(settings.forwarded_to_lab_hosts())
    spec = FleetSpec(
        slots=slot_files,
        environment=environment,
        status_sockets=sockets,
        host_environment={h.name: dict((host_environment or {}).get(h.name, {})) for h in hosts},
    )
    spec_path = fleet_dir / "fleet-spec.json"
    _write_private(spec_path, json.dumps(spec.to_json(), indent=2))
    config = fleet_dir / "avocado.conf"
    _write_private(
        config,
        "\n".join(
            [
                "[run]",
                f"spawner = {SPAWNER}",
                "status_server_auto = False",
                f"status_server_listen = {conf_value(local_socket)}",
                f"status_server_uri = {conf_value(local_socket)}",
                # One variant per host: every test becomes one task per host.
                f"dict_variants = {conf_value(repr([{VARIANT_KEY: h.name} for h in hosts]))}",
                # Every wait has a deadline: Avocado waits for a finished
                # task's last status message without one of its own.
                "[job.run]",
                f"timeout = {JOB_TIMEOUT_S}",
                "[run.dict_variants]",
                f"variant_id_keys = {[VARIANT_KEY]!r}",
                "[spawner.remote]",
                f"slots = {conf_value(repr(sorted(slot_files)))}",
                f"test_timeout = {TASK_TIMEOUT_S}",
                "[spawner.memqual]",
                f"fleet = {conf_value(str(spec_path))}",
                "",
            ]
        ),
    )
    return config


def _write_private(path: Path, text: str) -> None:
    write_private_atomic(path, (text + ("" if text.endswith("\n") else "\n")).encode())


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
        data = json.loads(read_regular_file(fleet_dir / LOST_FILE, MAX_RECORD_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def host_records(tasks: list[TaskResult], host: str, into: Path) -> tuple[int, list[page.BadRecord]]:
    """Copy the records of the tasks that ran to their end on ``host`` into
    ``into``, each naming the host in its environment; returns how many,
    and the records that could not be read (truncated, not a record, a link
    or not a regular file: what a lab host sent is not trusted), which are
    left out.  A task that was interrupted contributes nothing."""
    shutil.rmtree(into, ignore_errors=True)  # a previous run into this output
    into.mkdir(parents=True, exist_ok=True)
    count = 0
    bad = []
    for task in tasks:
        if task.host != host or task.outcome != RAN or task.logdir is None:
            continue
        # Only what memqual fetched into data/ (spawner.unpack_data): the
        # rest of a task's folder holds what Avocado's status messages wrote.
        data = task.logdir / "data"
        if not stat.S_ISDIR(os.lstat(data).st_mode if os.path.lexists(data) else 0):
            continue
        for path in sorted(data.rglob(record.RECORD_GLOB)):
            where = str(path.relative_to(task.logdir))
            try:
                data = json.loads(read_regular_file(path, MAX_RECORD_BYTES))
                record.Measurement.from_json(data, source=where)
            except (OSError, ValueError, TypeError, RecursionError, BadInput) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                bad.append(page.BadRecord(task=task.id, host=host, file=where, reason=reason.splitlines()[0][:300]))
                continue
            data.setdefault("environment", {})["lab_host"] = host
            # Still a record's name (memqual-*.json), made unique by the task.
            target = into / f"{path.stem}-task{task.logdir.name.split('-', 1)[0]}{path.suffix}"
            write_private_atomic(target, (json.dumps(data, indent=2) + "\n").encode())
            count += 1
    return count, bad


def qemu_environment(probed: list[checks.HostCheck]) -> dict[str, dict[str, str]]:
    """Each usable host's tasks run the QEMU that host answered for
    ``--qemu`` (its own path there); nothing for a host asked for none."""
    out: dict[str, dict[str, str]] = {}
    for check in probed:
        if check.usable and check.probe is not None and check.probe.qemu_binary:
            out[check.host.name] = {ENV_QEMU: check.probe.qemu_binary}
    return out


def run(config: RunConfig, hosts_file: Path, console: Console | None = None, qemu: str | None = None) -> int:
    """The fleet run.  ``qemu`` (a version of Debian's archive, or a path
    on every host): each host fetches that version from its own apt mirror
    into its own cache, checked against its own signed lists, during its
    probe, and its tasks run it; a host that cannot have it is left out with
    the reason.  Each host's records name the QEMU it ran."""

    console = console or printable_console(width=120)
    hosts = load_hosts(hosts_file)
    # Absolute: avocado runs from the repository, and the spawner's config
    # and the job's TMPDIR are paths under the output.
    config = dataclasses.replace(config, output=config.output.resolve())
    conf_value(str(config.output))  # bad input before anything is made
    config.output.mkdir(parents=True, exist_ok=True)
    probed = checks.for_each(hosts, lambda h: checks.probe_host(h, qemu=qemu) if qemu else checks.probe_host(h))
    for line in checks.lines(probed):
        console.print(printable(line), highlight=False, markup=False, soft_wrap=True)
    left_out = {c.host.name: c.problem for c in probed if not c.usable}
    remote_dirs: dict[str, str] = {}
    reachable = [c.host for c in probed if c.usable]
    for host, (path, problem) in zip(reachable, checks.for_each(reachable, remote_status_dir), strict=True):
        if problem:
            left_out[host.name] = problem
            console.print(
                printable(f"{host.name}: NOT READY: {problem}"), highlight=False, markup=False, soft_wrap=True
            )
        else:
            remote_dirs[host.name] = path
    usable = [c.host for c in probed if c.host.name in remote_dirs]
    fleet_dir = config.output / "fleet"
    tasks: list[TaskResult] = []
    job: JobOutcome | None = None
    try:
        if usable:
            job = _run_job(config, fleet_dir, usable, remote_dirs, console, qemu_environment(probed))
            tasks = task_results(job)
    finally:
        checks.for_each(usable, lambda h: remove_remote_dir(h, remote_dirs[h.name]))
    lost = read_lost(fleet_dir)
    columns = []
    for check in probed:
        name = check.host.name
        status = "left out" if name in left_out else "lost" if name in lost else "completed"
        reason = left_out.get(name) or lost.get(name, "")
        results: Results | None = None
        bad: list[page.BadRecord] = []
        if name not in left_out:
            results, bad, problem = _host_results(config, name, tasks, job, console)
            if (bad or problem) and status == "completed":
                # Part of its evidence is missing: its verdicts are shown,
                # but it is no voter in the fleet's majority.
                status = "incomplete"
                reason = problem or f"records from the host that could not be read, left out: {len(bad)}"
        columns.append(
            page.HostColumn(
                name=name,
                status=status,
                reason=reason,
                boot_id=check.probe.boot_id if check.probe else "",
                environment=check.probe.environment if check.probe else {},
                results=results,
                report=f"hosts/{name}/report.html" if results is not None else "",
                results_path=f"hosts/{name}/results.json" if results is not None else "",
                tasks=tuple(_task_line(t) for t in tasks if t.host == name),
                bad_records=tuple(bad),
            )
        )
    unplaced = tuple(_task_line(t) for t in tasks if not t.host)
    fleet = page.Fleet(columns=tuple(columns), not_run=unplaced, avocado=job.to_json() if job else None)
    page.write(fleet, config.output)
    console.print(f"wrote {config.output / 'fleet.html'} and {config.output / 'fleet.json'}", highlight=False)
    for line in page.summary_lines(fleet):
        console.print(printable(line), highlight=False, markup=False, soft_wrap=True)
    if any(c.status != "completed" for c in columns) or unplaced or not usable:
        return EXIT_INCOMPLETE
    if job is not None and not job.completed:
        return 1
    return 0


def _run_job(
    config: RunConfig,
    fleet_dir: Path,
    usable: list[LabHost],
    remote_dirs: dict[str, str],
    console: Console,
    host_environment: dict[str, dict[str, str]] | None = None,
) -> JobOutcome:
    """The one Avocado job over the usable hosts."""
    fleet_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        (fleet_dir / STATUS_SOCKET).unlink()  # a killed run's
    local_socket, private = local_status_socket(fleet_dir)
    # aexpect keeps each SSH session's fifos and logs under $TMPDIR and
    # removes them only when the session closes: a killed memqual would
    # leave them in /tmp.  Here they stay inside the run's own output,
    # cleared when the job ends and before the next run into it.
    scratch = fleet_dir / SCRATCH
    try:
        avocado_config = write_spawner_config(
            fleet_dir, usable, local_socket, remote_dirs, config.profile, host_environment
        )
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(mode=0o700, parents=True)
        job_config = dataclasses.replace(
            config,
            parallel=sum(h.slots for h in usable),
            avocado_global_args=("--config", str(avocado_config)),
            environment=(("TMPDIR", str(scratch)),),
        )
        with terminate_as_exception(), StatusRelay(local_socket, relay_sockets(local_socket, usable)) as relay:
            job = run_avocado(job_config, config.output / "avocado", None, console)
        for name, dropped in relay.refusals().items():
            console.print(
                printable(f"lab host {name}: {dropped['dropped']} status messages dropped ({dropped['first']})"),
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
    console.print(
        printable(f"avocado: {job.summary or 'no summary'} (exit {job.exit_status}); job directory {job.job_dir}"),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return job


def _task_line(t: TaskResult) -> page.TaskLine:
    reason = t.place.reason if t.place and t.place.reason else t.reason
    return page.TaskLine(t.id, t.host, t.outcome, reason)


def _host_results(
    config: RunConfig, name: str, tasks: list[TaskResult], job: JobOutcome | None, console: Console
) -> tuple[Results | None, list[page.BadRecord], str]:
    """results.json and report.html of one host, from the tasks that ran
    there to their end; the records left out as unreadable; and the
    problem, when no results could be made of them."""
    # lazy: rich (~70 ms) only for this output, not at every memqual start
    from rich.console import Console

    out_dir = config.output / "hosts" / name
    records_dir = out_dir / "records"
    mine = [t for t in tasks if t.host == name]
    count, bad = host_records(tasks, name, records_dir)
    unreadable = {b.task: b for b in bad}
    counts: dict[str, int] = {}
    for t in mine:
        counts[t.outcome] = counts.get(t.outcome, 0) + 1

    def outcome(t: TaskResult) -> TestOutcome:
        # A task that did not run to its end is no evidence: the claims
        # say "not measurable" with its reason.  Nor is a task whose
        # record could not be read, as far as that record goes.
        if t.outcome != RAN:
            return TestOutcome(t.id, "INTERRUPTED", _task_line(t).reason, t.time)
        if t.id in unreadable:
            b = unreadable[t.id]
            return TestOutcome(t.id, "ERROR", f"its record {b.file} could not be read: {b.reason}", t.time)
        return TestOutcome(t.id, t.status, t.reason, t.time)

    summary = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
    host_job = JobOutcome(
        command=job.command if job else [],
        exit_status=job.exit_status if job else 0,
        job_dir=records_dir,
        summary=f"lab host {name}: {summary}; {count} records" + (f", {len(bad)} unreadable" if bad else ""),
        tests=[outcome(t) for t in mine],
        counts=counts,
    )
    # Each host's tables are in its report; the terminal gets the fleet's summary.
    quiet = Console(file=io.StringIO(), width=120)
    try:
        results = write_outputs(out_dir, [host_job], config, None, quiet)
    except BadInput as exc:
        return None, bad, f"no results could be made of its records: {exc}"
    console.print(f"lab host {name}: wrote {out_dir / 'results.json'} and {out_dir / 'report.html'}", highlight=False)
    return results, bad, ""


def main(config: RunConfig, hosts_file: str, qemus: list[str] | None = None) -> int:
    path = Path(hosts_file)
    # Before the rounds: two QEMUs make two arms, and two rounds by default.
    if qemus and len(qemus) > 1:
        raise BadInput("--hosts runs one QEMU on every host: give --qemu once (an A/B of QEMUs runs on one host)")
    if config.kernels or config.rounds != 1 or config.until_decided:
        raise BadInput(
            "--hosts runs one round with each host's own image: leave out --guest-kernel, --debian-kernel and --rounds"
        )
    return run(config, path, qemu=qemus[0] if qemus else None)

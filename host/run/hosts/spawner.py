"""Avocado's remote spawner (avocado-framework-plugin-spawner-remote), made fit
for a fleet of lab hosts: Avocado still schedules, one slot an aexpect SSH
session.  This subclass gives each task a fresh directory on its host and
copies back its data/ only when it ended normally, writes fleet-place.json,
keeps every task on a slot of its own host, takes a host whose session
died out of the fleet, and runs the host's own checkout and venv.  Why
each: docs/hosts.md, "What host/run/hosts/spawner.py changes in Avocado's
remote spawner".
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import logging
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import IO, Any

from aexpect import ShellError, remote
from avocado.core.plugin_interfaces import Init
from avocado.core.settings import settings
from avocado_spawner_remote import RemoteSpawner

from memqual.host.core import settings as memqual_settings
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.polling import poll_async
from memqual.host.run.hosts import ssh
from memqual.host.run.hosts.config import LabHost

LOG = logging.getLogger("avocado.job." + __name__)

SECTION = "spawner.memqual"
PLACE_FILE = "fleet-place.json"  # not memqual-*.json: that is what records are named
LOST_FILE = "lost.json"  # beside the fleet spec: the hosts lost during the job, and why
PLACE_SCHEMA = "memqual.place/1"
VARIANT_KEY = "lab_host"
LOGIN_TIMEOUT_S = 20.0
FETCH_TIMEOUT_S = 120.0
SMALL_COMMAND_S = 30.0
# What one task's data/ may bring back: its records are a few kB each.
MAX_FETCH_BYTES = 256 * 2**20
MAX_FETCH_MEMBERS = 10_000
MAX_PLACE_BYTES = 64 * 2**10

# How a task ended, as memqual reports it.
RAN = "ran"
INTERRUPTED = "interrupted"  # its host was lost while it ran: nothing of it is kept
FAILED = "failed"  # its host could not start it (or its records could not be copied back)
NOT_RUN = "not run"  # no host was left to run it


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a task ran and how it ended (``fleet-place.json``)."""

    task: str  # Avocado's task identifier: "1-e2e/test_boot.py:Boot.test_..."
    host: str
    outcome: str
    reason: str = ""
    started: float | None = None
    ended: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema": PLACE_SCHEMA, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Place:
        if data.get("schema") != PLACE_SCHEMA:
            raise ValueError(f"not a {PLACE_SCHEMA} file")
        return cls(
            task=str(data.get("task") or ""),
            host=str(data.get("host") or ""),
            outcome=str(data["outcome"]),
            reason=str(data.get("reason") or ""),
            started=data.get("started"),
            ended=data.get("ended"),
        )


def write_place(directory: Path, place: Place) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    # Through a fresh O_EXCL name: never through a link planted beside it.
    write_private_atomic(directory / PLACE_FILE, (json.dumps(place.to_json(), indent=2) + "\n").encode())


def read_place(directory: Path) -> Place | None:
    try:
        return Place.from_json(json.loads(read_regular_file(directory / PLACE_FILE, MAX_PLACE_BYTES)))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def read_regular_file(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, opened without following a link (ELOOP) and
    only if it is a regular file of at most ``limit`` bytes (else OSError or
    ValueError).  O_NONBLOCK: a FIFO planted in its place must not hang."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than {limit}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"more than {limit} bytes")
        return data
    finally:
        os.close(fd)


@dataclasses.dataclass
class Slot:
    host: LabHost
    login: dict[str, Any]  # aexpect remote_login's arguments (the slot file)
    session: Any = None
    busy: bool = False


@dataclasses.dataclass(frozen=True)
class FleetSpec:
    """What memqual tells the spawner (``spawner.memqual.fleet``, a JSON
    file): each slot file's host, and the environment every task gets."""

    slots: dict[str, LabHost]  # slot file -> host
    environment: dict[str, str]
    # host name -> the UNIX socket its tasks post their status to, there:
    # the reverse forward of its first session to the status server here.
    status_sockets: dict[str, str] = dataclasses.field(default_factory=dict)
    # host name -> what its tasks get on top of ``environment`` (the QEMU
    # binary that host answered for ``--qemu``: a path there).
    host_environment: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def task_environment(self, host: str) -> dict[str, str]:
        """The environment of a task on ``host``."""
        return {**self.environment, **self.host_environment.get(host, {}), memqual_settings.LAB_HOST: host}

    def to_json(self) -> dict[str, Any]:
        return {
            "slots": {k: h.to_json() for k, h in self.slots.items()},
            "environment": self.environment,
            "status_sockets": self.status_sockets,
            "host_environment": self.host_environment,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FleetSpec:
        slots = {}
        for slot_file, h in data["slots"].items():
            slots[slot_file] = LabHost(
                name=h["name"],
                address=h["address"],
                port=int(h["port"]),
                user=h["user"],
                key=Path(h["key"]),
                known_hosts=Path(h["known_hosts"]),
                slots=int(h["slots"]),
                checkout=h["checkout"],
            )
        return cls(
            slots=slots,
            environment=dict(data.get("environment") or {}),
            status_sockets={str(k): str(v) for k, v in (data.get("status_sockets") or {}).items()},
            host_environment={
                str(h): {str(k): str(v) for k, v in env.items()}
                for h, env in (data.get("host_environment") or {}).items()
            },
        )


class FleetSpawnerInit(Init):
    description = "memqual fleet spawner initialization"

    def initialize(self) -> None:
        settings.register_option(
            section=SECTION,
            key="fleet",
            help_msg="memqual's fleet file: the host of every slot file and the tasks' environment",
            default="",
        )


class FleetSpawner(RemoteSpawner):
    description = "memqual: Avocado's remote spawner over the lab hosts of a hosts file"

    _slots: list[Slot] | None = None
    _lost: dict[str, str] = {}  # host -> why; shared by the job's workers, like the stock slots_cache
    _ready: asyncio.Lock | None = None
    _spec: FleetSpec | None = None
    _status_sockets: dict[str, str] = {}
    _lost_file: Path | None = None

    # -- slots ------------------------------------------------------------
    async def _ensure_slots(self) -> list[Slot]:
        cls = FleetSpawner
        if cls._ready is None:
            cls._ready = asyncio.Lock()
        async with cls._ready:
            if cls._slots is None:
                spec_path = Path(self.config.get(f"{SECTION}.fleet"))
                spec = FleetSpec.from_json(json.loads(spec_path.read_text()))
                cls._spec = spec
                cls._status_sockets = spec.status_sockets
                cls._lost_file = spec_path.parent / LOST_FILE
                # aexpect starts its helper by name: the one installed beside
                # this Python, in memqual's venv.
                bindir = str(Path(sys.executable).parent)
                if bindir not in os.environ.get("PATH", "").split(os.pathsep):
                    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
                slots = []
                for slot_file in self.config.get("spawner.remote.slots"):
                    if slot_file:
                        login = json.loads(Path(slot_file).read_text())
                        slots.append(Slot(host=spec.slots[slot_file], login=login))
                loop = asyncio.get_event_loop()
                await asyncio.gather(*(loop.run_in_executor(None, self._login, slot) for slot in slots))
                cls._slots = slots
                atexit.register(_close_sessions, slots)
        return cls._slots

    @staticmethod
    def _login(slot: Slot) -> None:
        if slot.host.name in FleetSpawner._lost:
            return
        try:
            slot.session = remote.remote_login(**slot.login)
        except Exception as exc:  # aexpect raises many kinds; each one means "not reachable"
            reason = f"could not log in: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            FleetSpawner._record_lost(slot.host.name, reason)
            LOG.error("lab host %s: %s", slot.host.name, reason)

    async def _reserve(self, host: str, deadline_s: float) -> Slot | None:
        """A free slot of ``host``, waiting for one while the host is there;
        None when it is lost (or was never in the fleet)."""
        slots = await self._ensure_slots()
        gone = False

        def reserved() -> Slot | None:
            nonlocal gone
            live = [s for s in slots if s.host.name == host and s.session is not None]
            if not live or host in FleetSpawner._lost:
                gone = True
                return None
            for slot in live:
                if not slot.busy:
                    slot.busy = True
                    return slot
            return None

        polled = await poll_async(
            reserved,
            deadline_s,
            0.1,
            what=f"a free slot of {host}",
            until=lambda slot: slot is not None or gone,
            raise_on_timeout=False,
        )
        return polled.value

    @staticmethod
    def _record_lost(name: str, reason: str) -> None:
        """Note a host as lost, here and in the fleet directory's lost.json
        (what memqual reads after the job)."""
        FleetSpawner._lost.setdefault(name, reason)
        if FleetSpawner._lost_file is not None:
            text = json.dumps(FleetSpawner._lost, indent=2) + "\n"
            write_private_atomic(FleetSpawner._lost_file, text.encode())

    def _lose(self, host: LabHost, reason: str) -> None:
        if host.name not in FleetSpawner._lost:
            FleetSpawner._record_lost(host.name, reason)
            LOG.error("lab host %s lost: %s; its queued tasks are not run", host.name, reason)

    # -- tasks ------------------------------------------------------------
    async def spawn_task(self, runtime_task: Any) -> bool:
        local = Path(self.task_output_dir(runtime_task))
        local.mkdir(parents=True, exist_ok=True)
        task_id = str(runtime_task.task.identifier)
        host = assigned_host(runtime_task.task.runnable.variant)
        timeout = float(self.config.get("spawner.remote.test_timeout"))
        slot = await self._reserve(host, timeout)
        if slot is None:
            # Every scenario measures the host it runs on: a task meant for
            # a lost host is not moved to another, it is reported.
            why = FleetSpawner._lost.get(host, "not in the fleet")
            reason = f"lab host {host or '?'} was lost before the task started ({why})"
            write_place(local, Place(task_id, host, NOT_RUN, reason))
            return False
        runtime_task.spawner_handle = slot.session
        try:
            return await self._run_on(slot, runtime_task, local, timeout)
        finally:
            slot.busy = False

    async def _run_on(self, slot: Slot, runtime_task: Any, local: Path, timeout: float) -> bool:
        host, session = slot.host, slot.session
        started = time.time()
        task_id = str(runtime_task.task.identifier)
        write_place(local, Place(task_id, host.name, "running", started=started))
        LOG.info("task %s on lab host %s", runtime_task.task.identifier, host.name)
        try:
            status, output = await self.run_remote_cmd_async(
                session, "mktemp -d /tmp/memqual-task.XXXXXXXXXX", SMALL_COMMAND_S
            )
        except ShellError as exc:
            # A host lost while this command was under way leaves aexpect
            # without an exit status: lost, not a crash of the whole job.
            return self._failed(slot, task_id, local, started, f"could not make a task directory: {exc}")
        remote_dir = output.strip().splitlines()[-1] if status == 0 and output.strip() else ""
        if not remote_dir.startswith("/tmp/memqual-task."):
            return self._failed(slot, task_id, local, started, f"could not make a task directory: {output[-200:]}")
        task = runtime_task.task
        module = task.runnable.pick_runner_module_from_entry_point_kind(task.runnable.kind)
        if module is None:
            return self._failed(slot, task_id, local, started, f"no runner for kind {task.runnable.kind}")
        status_socket = FleetSpawner._status_sockets.get(host.name, "")
        if not status_socket:
            return self._failed(slot, task_id, local, started, f"no status channel to lab host {host.name}")
        args = remote_args(task.get_command_args(), str(task.runnable.output_dir), remote_dir, status_socket)
        spec = FleetSpawner._spec
        env = spec.task_environment(host.name) if spec else {memqual_settings.LAB_HOST: host.name}
        command = (
            f"cd {shlex.quote(host.checkout)} && env {shlex.join(f'{k}={v}' for k, v in sorted(env.items()))} "
            f"{shlex.quote(host.checkout + '/.venv/bin/python3')} -m {shlex.quote(module)} task-run "
            f"{shlex.join(args)} > /dev/null"
        )
        try:
            status, output = await self.run_remote_cmd_async(session, command, timeout)
        except ShellError as exc:
            status, output = -1, str(exc)
        if status != 0:
            if not session.is_alive():
                self._lose(host, f"the SSH session ended after {time.time() - started:.1f} s of a task")
                reason = f"lab host {host.name} was lost while the task ran; nothing of it was kept"
                write_place(local, Place(task_id, host.name, INTERRUPTED, reason, started, time.time()))
                return False
            self._remove(session, remote_dir)
            return self._failed(slot, task_id, local, started, f"the runner exited {status}: {output.strip()[-300:]}")
        loop = asyncio.get_event_loop()
        problem = await loop.run_in_executor(None, fetch_data, host, remote_dir, local)
        self._remove(session, remote_dir)
        if problem:
            if not session.is_alive():
                self._lose(host, "the SSH session ended while the records were copied back")
                outcome = INTERRUPTED
            else:
                outcome = FAILED
            write_place(local, Place(task_id, host.name, outcome, problem, started, time.time()))
            return False
        write_place(local, Place(task_id, host.name, RAN, started=started, ended=time.time()))
        return True

    def _failed(self, slot: Slot, task_id: str, local: Path, started: float, reason: str) -> bool:
        """The task did not run to its end: its host was lost (interrupted),
        or it could not be started there (failed)."""
        outcome = FAILED
        if not slot.session.is_alive():
            self._lose(slot.host, "the SSH session ended")
            outcome = INTERRUPTED
            reason = f"lab host {slot.host.name} was lost while the task ran; nothing of it was kept"
        write_place(local, Place(task_id, slot.host.name, outcome, reason, started, time.time()))
        return False

    @staticmethod
    def _remove(session: Any, remote_dir: str) -> None:
        try:
            session.cmd_status_output(f"rm -rf -- {shlex.quote(remote_dir)}", timeout=SMALL_COMMAND_S)
        except Exception:  # the host may be gone: its /tmp is its own affair then
            pass

    @staticmethod
    def is_task_alive(runtime_task: Any) -> bool:
        # spawn_task returns only once the remote task has ended.
        return False

    async def terminate_task(self, runtime_task: Any) -> bool:
        session = runtime_task.spawner_handle
        if session is None or not session.is_alive():
            return True
        return bool(await super().terminate_task(runtime_task))


def assigned_host(variant: Any) -> str:
    """The ``lab_host`` parameter of a task's variant (memqual gives Avocado
    one variant per host, ``run.dict_variants``, so every test becomes one
    task per host)."""
    for entry in (variant or {}).get("variant") or []:
        if isinstance(entry, list | tuple) and len(entry) == 2:
            for item in entry[1] or []:
                if isinstance(item, list | tuple) and len(item) == 3 and item[1] == VARIANT_KEY:
                    return str(item[2])
    return ""


def remote_args(args: list[str], local_output: str, remote_dir: str, status_socket: str) -> list[str]:
    """A task's ``task-run`` arguments for its host: its output in the
    task directory there, and its status (``-s URI``) posted to the host's
    end of the status channel, never to the controller's own socket path
    (that path means nothing there, and a TCP port there would be open to
    every local user)."""
    out = []
    for index, arg in enumerate(args):
        if index > 0 and args[index - 1] == "-s":
            out.append(status_socket)
        elif arg == f"output_dir={local_output}":
            out.append(f"output_dir={remote_dir}")
        else:
            out.append(arg)
    return out


class UnsafeArchive(Exception):
    """A lab host's tar stream holds something memqual does not unpack."""


def unpack_data(stream: IO[bytes], local: Path) -> None:
    """Unpack a task's ``data/`` from the tar ``stream`` its host sent into
    ``local/data``.  A lab host is trusted less than this controller, where
    this runs as root: only regular files and directories below ``data/``
    are taken (no links, devices or FIFOs, no absolute or ``..`` names, no
    name twice, at most MAX_FETCH_BYTES), each checked by tarfile's
    ``data`` filter too, and written with O_EXCL|O_NOFOLLOW into a fresh
    private directory that is renamed into place only when all of it was
    good (UnsafeArchive or tarfile.TarError otherwise, and nothing kept)."""
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=local))
    try:
        total = 0
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for count, member in enumerate(archive, 1):
                if count > MAX_FETCH_MEMBERS:
                    raise UnsafeArchive(f"more than {MAX_FETCH_MEMBERS} entries")
                if not (member.isreg() or member.isdir()):
                    raise UnsafeArchive(f"{member.name!r} is a link or a special file: only files are taken")
                parts = PurePosixPath(member.name).parts
                if member.name.startswith("/") or ".." in parts or not parts or parts[0] != "data":
                    raise UnsafeArchive(f"{member.name!r} is not a name below data/")
                tarfile.data_filter(member, str(staging))
                total += member.size
                if total > MAX_FETCH_BYTES:
                    raise UnsafeArchive(f"more than {MAX_FETCH_BYTES} bytes")
                target = staging.joinpath(*parts)
                if member.isdir():
                    target.mkdir(mode=0o700, parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None  # a regular member always has a body
                try:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                except FileExistsError:
                    raise UnsafeArchive(f"{member.name!r} comes twice") from None
                with os.fdopen(fd, "wb") as handle:
                    shutil.copyfileobj(source, handle)
        if (staging / "data").is_dir():
            os.rename(staging / "data", local / "data")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_data(host: LabHost, remote_dir: str, local: Path) -> str:
    """Copy ``remote_dir/data`` (the task's records) into ``local/data`` over
    SSH (tar through the channel: no scp, no remote path in a local shell);
    the problem, or "" when copied."""
    with tempfile.TemporaryFile() as send_err:
        sender = subprocess.Popen(
            ssh.command(host, ["tar", "-C", remote_dir, "-cf", "-", "--ignore-failed-read", "data"]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=send_err,
        )
        assert sender.stdout is not None
        # The deadline holds also for a host that sends slowly: the sender
        # is killed, the stream ends and the unpacking fails.
        timer = threading.Timer(FETCH_TIMEOUT_S, sender.kill)
        timer.start()
        problem = ""
        try:
            unpack_data(sender.stdout, local)
            # tar pads its stream past the end marker: read that too, so
            # that the sender is not cut off (and exits 0).
            drained = 0
            while drained < MAX_FETCH_BYTES and (chunk := sender.stdout.read(65536)):
                drained += len(chunk)
        except (UnsafeArchive, tarfile.TarError, OSError) as exc:
            problem = f"unpacking the records failed: {exc}"
        finally:
            sender.stdout.close()
            try:
                sender.wait(timeout=SMALL_COMMAND_S)
            except subprocess.TimeoutExpired:
                sender.kill()
                sender.wait()
            expired = not timer.is_alive()
            timer.cancel()
        if expired:
            return f"copying the records back took longer than {FETCH_TIMEOUT_S:.0f} s"
        if sender.returncode != 0 and not problem:
            send_err.seek(0)
            text = send_err.read()[-4096:].decode(errors="replace").strip()
            return f"copying the records back failed: {text[-200:]}"
        return problem


def _close_sessions(slots: list[Slot]) -> None:
    for slot in slots:
        if slot.session is not None:
            try:
                slot.session.close()
            except Exception:  # at exit: what is left dies with the job's process group
                pass

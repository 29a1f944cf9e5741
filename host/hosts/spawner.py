"""Avocado's remote spawner (avocado-framework-plugin-spawner-remote), made fit
for a fleet of lab hosts.  Avocado still schedules: its task state machine
hands each task to a free slot, a slot being one aexpect SSH session to a
host, described by a JSON file in ``spawner.remote.slots``.  What this
subclass changes, and why:

- Each task writes its output to a fresh directory on its host (the stock
  spawner gives every remote task the controller's local path), and its
  ``data/`` (the measurement records) is copied back over SSH into the
  task's local directory once the task has ended normally.  A task whose
  host was lost is not copied: no half-run result reaches a report.
- Each task's local directory gets ``fleet-place.json``: the host it ran
  on and how it ended (ran, interrupted, failed to start, not run).  That
  is memqual's bookkeeping of faults; Avocado only sees a task that failed
  to start.
- Every test runs on every host: memqual gives Avocado one variant per
  host (``lab_host``), and a task waits for a slot of its own host (the
  stock spawner takes any free slot, so a host would run an arbitrary
  share of the scenarios and no claim could be set side by side).
- A session that died (host down, sshd killed, network gone) takes its
  host out: its slots are never handed out again, its running task is
  reported interrupted and its queued tasks not run (they measure that
  host; another host runs its own copy anyway).  The stock spawner would
  hand the dead session out again.
- The task runs with the host's own memqual checkout and venv (``cd``
  there and its ``.venv/bin/python3``), with the run's parameters
  (``MEMQUAL_PROFILE``...) and ``MEMQUAL_LAB_HOST`` in its environment.

The sessions' ssh options come from memqual.host.hosts.ssh through each slot's
``extra_cmdline`` (OpenSSH keeps the first value of an option, so the
pinned host key checking wins over aexpect's StrictHostKeyChecking=no).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aexpect import remote
from avocado.core.plugin_interfaces import Init
from avocado.core.settings import settings
from avocado_spawner_remote import RemoteSpawner

from memqual.host.hosts import ssh
from memqual.host.hosts.config import LabHost

LOG = logging.getLogger("avocado.job." + __name__)

SECTION = "spawner.memqual"
PLACE_FILE = "fleet-place.json"  # not memqual-*.json: that is what records are named
LOST_FILE = "lost.json"  # beside the fleet spec: the hosts lost during the job, and why
PLACE_SCHEMA = "memqual.place/1"
VARIANT_KEY = "lab_host"
LOGIN_TIMEOUT_S = 20.0
FETCH_TIMEOUT_S = 120.0
SMALL_COMMAND_S = 30.0

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
    tmp = directory / (PLACE_FILE + ".tmp")
    tmp.write_text(json.dumps(place.to_json(), indent=2) + "\n")
    tmp.replace(directory / PLACE_FILE)


def read_place(directory: Path) -> Place | None:
    try:
        return Place.from_json(json.loads((directory / PLACE_FILE).read_text()))
    except (OSError, ValueError, KeyError):
        return None


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

    def to_json(self) -> dict[str, Any]:
        return {"slots": {k: h.to_json() for k, h in self.slots.items()}, "environment": self.environment}

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
        return cls(slots=slots, environment=dict(data.get("environment") or {}))


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
    _environment: dict[str, str] = {}
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
                cls._environment = spec.environment
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
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            live = [s for s in slots if s.host.name == host and s.session is not None]
            if not live or host in FleetSpawner._lost:
                return None
            for slot in live:
                if not slot.busy:
                    slot.busy = True
                    return slot
            await asyncio.sleep(0.1)
        return None

    @staticmethod
    def _record_lost(name: str, reason: str) -> None:
        """Note a host as lost, here and in the fleet directory's lost.json
        (what memqual reads after the job)."""
        FleetSpawner._lost.setdefault(name, reason)
        if FleetSpawner._lost_file is not None:
            tmp = FleetSpawner._lost_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(FleetSpawner._lost, indent=2) + "\n")
            tmp.replace(FleetSpawner._lost_file)

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
        status, output = await self.run_remote_cmd_async(
            session, "mktemp -d /tmp/memqual-task.XXXXXXXXXX", SMALL_COMMAND_S
        )
        remote_dir = output.strip().splitlines()[-1] if status == 0 and output.strip() else ""
        if not remote_dir.startswith("/tmp/memqual-task."):
            return self._failed(slot, task_id, local, started, f"could not make a task directory: {output[-200:]}")
        task = runtime_task.task
        module = task.runnable.pick_runner_module_from_entry_point_kind(task.runnable.kind)
        if module is None:
            return self._failed(slot, task_id, local, started, f"no runner for kind {task.runnable.kind}")
        local_arg = f"output_dir={task.runnable.output_dir}"
        args = [f"output_dir={remote_dir}" if a == local_arg else a for a in task.get_command_args()]
        env = {**FleetSpawner._environment, "MEMQUAL_LAB_HOST": host.name}
        command = (
            f"cd {shlex.quote(host.checkout)} && env {shlex.join(f'{k}={v}' for k, v in sorted(env.items()))} "
            f"{shlex.quote(host.checkout + '/.venv/bin/python3')} -m {shlex.quote(module)} task-run "
            f"{shlex.join(args)} > /dev/null"
        )
        status, output = await self.run_remote_cmd_async(session, command, timeout)
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


def fetch_data(host: LabHost, remote_dir: str, local: Path) -> str:
    """Copy ``remote_dir/data`` (the task's records) into ``local/data`` over
    SSH (tar through the channel: no scp, no remote path in a local shell);
    the problem, or "" when copied."""
    sender = subprocess.Popen(
        ssh.command(host, ["tar", "-C", remote_dir, "-cf", "-", "--ignore-failed-read", "data"]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    receiver = subprocess.Popen(
        ["tar", "-C", str(local), "-xf", "-", "--no-same-owner", "--no-same-permissions"],
        stdin=sender.stdout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert sender.stdout is not None
    sender.stdout.close()  # the receiver holds it now
    try:
        _, receive_err = receiver.communicate(timeout=FETCH_TIMEOUT_S)
        _, send_err = sender.communicate(timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sender.kill()
        receiver.kill()
        sender.wait()
        receiver.wait()
        return f"copying the records back took longer than {FETCH_TIMEOUT_S:.0f} s"
    if sender.returncode != 0:
        return f"copying the records back failed: {send_err.decode(errors='replace').strip()[-200:]}"
    if receiver.returncode != 0:
        return f"unpacking the records failed: {receive_err.decode(errors='replace').strip()[-200:]}"
    return ""


def _close_sessions(slots: list[Slot]) -> None:
    for slot in slots:
        if slot.session is not None:
            try:
                slot.session.close()
            except Exception:  # at exit: what is left dies with the job's process group
                pass

"""Warm starts: a booted guest saved once, restored into every later QEMU.

One snapshot per (image, QEMU version, accelerator, machine configuration),
saved once SSH answers and restored with ``-incoming``; one lock file per
snapshot (restorers shared, the saver exclusive, written then renamed); a
snapshot QEMU cannot load is deleted and the guest boots cold; snapshots
live in the checked cache, keyed on the image's SSH keys too.  Under a host
under test the snapshot is of L1 with its guest booted, keyed on the host
too.
docs/architecture.md, "host/core/snapshot.py", has the rules in full."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import os
import shlex
import shutil
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from memqual.host.core import leftovers, qemu, settings
from memqual.host.core.clock import Clock
from memqual.host.core.errors import GuestError, LaunchError, MemqualError, Timeout
from memqual.host.core.locks import file_lock
from memqual.host.core.nested import HostUnderTest
from memqual.host.core.paths import cache_dir
from memqual.host.core.polling import poll
from memqual.host.core.ssh import HostKeyMismatch
from memqual.host.core.trust import trusted_dir


class Launchable(Protocol):
    """The launch steps of a machine (memqual.host.core.machine.Machine) a warm
    start drives.  The machine is given this module's ``start`` as its start
    strategy; this module does not import it."""

    config: qemu.MachineConfig
    accel: str
    clock: Clock
    started_warm: bool
    boot_to_ssh_s: float
    # The host under test (None: this machine), L1's image and accelerator.
    host: HostUnderTest | None
    host_image: Any
    host_accel: str

    @property
    def image(self) -> Any: ...

    @property
    def ssh_ready(self) -> bool: ...

    def boot_cold(self) -> None: ...

    def start_qemu(self, incoming: str | None = None) -> None: ...

    def wait_ssh(self, started: float, first_command: list[str] | None = None, probe_banner: bool = True) -> None: ...

    def close_ssh(self) -> None: ...

    def kill_qemu(self) -> None: ...

    def qemu_exited(self) -> bool: ...

    def qemu_output(self) -> str: ...

    def qmp(self, command: str, **arguments: Any) -> Any: ...

    def pause_nested_guest(self) -> None: ...

    def resume_nested_guest(self) -> None: ...


log = logging.getLogger("memqual.snapshot")

FORMAT_VERSION = "1"
CACHE_CAP_BYTES = 4 << 30  # snapshots beyond this, least recently used first, are removed
RESTORE_DEADLINE_S = 60.0
LOCK_DEADLINE_S = 300.0  # another run may be saving the same snapshot
_warned_unwritable = False


def snapshot_root() -> Path:
    """The snapshots' directory: private (0700), since a saved state holds
    guest RAM with its keys."""
    root = trusted_dir(cache_dir() / "snapshots", "snapshot directory")
    if os.stat(root).st_mode & 0o077:
        os.chmod(root, 0o700)  # made 0755 by earlier versions
    return root


def usable() -> bool:
    """False when MEMQUAL_WARM=0, or (with one warning per process) when the
    snapshot directory cannot be written: warm starts turn off, cold boots
    go on."""
    global _warned_unwritable
    if not settings.warm_starts():
        return False
    root = cache_dir() / "snapshots"
    try:
        root = snapshot_root()
        probe = root / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        return True
    except (OSError, MemqualError) as exc:
        if not _warned_unwritable:
            log.warning("warm starts off: snapshot directory %s is not writable (%s); booting cold", root, exc)
            _warned_unwritable = True
        return False


def qemu_identity(binary: str) -> dict[str, object]:
    """Which QEMU saved a state: its version and the binary itself (its
    resolved path, size and change time).  A state saved by one QEMU need
    not load in another -- another version's device state, or a build of
    the same version with other patches -- so two binaries never share a
    snapshot, even when they print the same version."""
    path = Path(binary).resolve()
    try:
        st = path.stat()
        stamp: list[int] = [st.st_size, st.st_mtime_ns, st.st_ino]
    except OSError:
        stamp = []
    return {"version": qemu.qemu_version(binary), "binary": str(path), "stat": stamp}


def snapshot_key(machine: Launchable) -> str:
    config = dataclasses.asdict(machine.config)
    config.pop("warm")
    material = {
        "format": FORMAT_VERSION,
        "qemu": qemu_identity(qemu.qemu_binary()),
        "accel": machine.accel,
        # A state saved under icount carries the instruction counter's
        # state, and a wall-clock guest's does not: never shared.
        "clock": machine.clock.label,
        "image": str(machine.image.directory),
        "kernel": machine.image.kernel_sha256,
        "initramfs": machine.image.initramfs_sha256,
        # initramfs_sha256 is of the reproducible part: the keys differ per build.
        "keys": _keys_fingerprint(machine.image),
        "cmdline": qemu.kernel_cmdline(machine.config, machine.accel, machine.clock),
        "config": config,
    }
    if machine.host is not None:
        # Only then: this machine's guests keep the keys they had.
        material["host"] = _host_material(machine)
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def _host_material(machine: Launchable) -> dict[str, object]:
    """What a saved L1 is besides its guest: the host kernel with its
    command line (its own words, its KVM's parameters, the boot knobs),
    L1's image with its SSH keys, and the accelerator it ran on."""
    assert machine.host is not None
    return {
        "kernel": machine.host.kernel.name,
        "cmdline": machine.host.cmdline(),
        "image": str(machine.host_image.directory),
        "initrd": machine.host_image.initrd_sha256,
        "keys": _keys_fingerprint(machine.host_image),
        "accel": machine.host_accel,
    }


def _saved_image(machine: Launchable) -> str:
    """The image a snapshot dies with (the cache cap drops it once gone):
    L1's under a host under test, else the guest's."""
    return str((machine.host_image if machine.host is not None else machine.image).directory)


def _keys_fingerprint(image: object) -> str:
    """sha256 of the image's client key and guest host key: they change
    with every build of the image, even when its inputs do not."""
    key = getattr(image, "key", None)
    if key is None:
        return ""
    digest = hashlib.sha256()
    for path in (Path(key), Path(key).parent / "host_key.pub"):
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"-")
    return digest.hexdigest()


def _locked(path: Path, exclusive: bool) -> AbstractContextManager[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(path, exclusive=exclusive, deadline_s=LOCK_DEADLINE_S, held=f"snapshot lock {path} still held")


def snapshot_dir(machine: Launchable) -> Path:
    """Where the snapshot for ``machine``'s configuration lives (whether or
    not it exists yet).  The machine's accelerator must be resolved."""
    return snapshot_root() / snapshot_key(machine)


def start(machine: Launchable) -> None:
    """Start ``machine`` warm when a snapshot exists, else boot it cold and
    save one.  A machine's start strategy for configs with warm=True; uses
    only the machine's public launch steps."""
    key = snapshot_key(machine)
    directory = snapshot_root() / key
    state, meta, lock = directory / "state", directory / "meta.json", snapshot_root() / f"{key}.lock"

    with _locked(lock, exclusive=False):
        if _valid(state, meta):
            outcome = _restore(machine, state)
            if outcome is Restore.OK:
                _touch(meta)
                return
            if outcome is Restore.SLOW:
                # The snapshot is fine; the host is busy.  Keep it for the
                # next start and boot this one cold.
                machine.boot_cold()
                return
    with _locked(lock, exclusive=True):
        if _valid(state, meta):
            outcome = _restore(machine, state)  # saved meanwhile by another run, or the corrupt one again
            if outcome is Restore.OK:
                return
            if outcome is Restore.CORRUPT:
                _discard(directory, "it did not restore")
            else:
                machine.boot_cold()
                return
        machine.boot_cold()
        try:
            _save(machine, directory)
        except MemqualError as exc:
            if not machine.ssh_ready:
                # Not even resumed: this guest is unusable; launch() shuts it down.
                raise GuestError(f"the guest did not resume after a failed snapshot save: {exc}") from exc
            log.warning("could not save a warm-start snapshot (%s); this start stays cold", exc)
    _enforce_cap()


def _valid(state: Path, meta: Path) -> bool:
    try:
        info = json.loads(meta.read_text())
        return state.stat().st_size == info["bytes"]
    except (OSError, ValueError, KeyError):
        return False


def _touch(meta: Path) -> None:
    try:
        os.utime(meta)
    except OSError:
        pass


def _discard(directory: Path, why: str) -> None:
    log.warning("deleting warm-start snapshot %s: %s; booting cold", directory.name, why)
    shutil.rmtree(directory, ignore_errors=True)


class Restore(enum.Enum):
    OK = "restored"
    CORRUPT = "the snapshot cannot be used"  # delete it
    SLOW = "the restore missed a deadline"  # keep it


class Unloadable(GuestError):
    """QEMU refused the saved state, or a restored host under test's guest
    did not answer its monitor: the snapshot is bad, not the host."""


def _restore(machine: Launchable, state: Path) -> Restore:
    started = time.monotonic()
    try:
        # exec: runs through /bin/sh: the path is ours, and quoted anyway.
        machine.start_qemu(incoming="exec:cat " + shlex.quote(str(state)))
        _wait_running(machine, started + RESTORE_DEADLINE_S)
        machine.resume_nested_guest()
        # The first command sets the guest's clock: it stands at the time
        # of the save.
        machine.wait_ssh(started, first_command=_clock_command(), probe_banner=False)
    except (Unloadable, HostKeyMismatch) as exc:
        log.warning("warm start from %s failed: %s", state.parent.name, str(exc).splitlines()[0])
        machine.kill_qemu()
        return Restore.CORRUPT
    except (LaunchError, GuestError) as exc:
        # A QEMU that exits while loading says why on its stderr; a load
        # error there is a bad snapshot, anything else (a deadline) is not.
        output = machine.qemu_output()
        log.warning("warm start from %s failed: %s", state.parent.name, str(exc).splitlines()[0])
        machine.kill_qemu()
        if "load of migration failed" in output or "Unknown savevm section" in output:
            return Restore.CORRUPT
        return Restore.SLOW
    machine.started_warm = True
    machine.boot_to_ssh_s = time.monotonic() - started
    return Restore.OK


def _wait_running(machine: Launchable, deadline: float) -> None:
    """Wait for the incoming stream to be loaded, then run the guest.  It
    was saved stopped, and QEMU keeps the saved run state, so it is
    continued here rather than by QEMU."""

    def running() -> bool:
        status = machine.qmp("query-status")
        if status.get("running"):
            return True
        migration = machine.qmp("query-migrate").get("status")
        if migration == "completed":
            machine.qmp("cont")
            return False
        if migration in ("failed", "cancelled"):
            raise Unloadable(f"loading the snapshot {migration}")
        if status.get("status") not in ("inmigrate", "prelaunch", "paused", "restore-vm", "postmigrate"):
            raise Unloadable(f"incoming migration ended in state {status.get('status')}")
        if machine.qemu_exited():
            raise GuestError("QEMU exited while loading the snapshot")
        return False

    # 5 ms: the poll period of query-status
    poll(
        running,
        max(0.0, deadline - time.monotonic()),
        0.005,
        what="the snapshot loaded",
        on_timeout=lambda _: Timeout("the snapshot did not load before the deadline"),
    )


def _clock_command() -> list[str]:
    # Taken when the command is built; SSH readiness follows within a
    # second, so the guest clock is right to about that much, then NTP-free
    # tests compare against it with that tolerance.
    return ["date", "-u", "-s", time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())]


SAVE_DEADLINE_S = 120.0


def _save(machine: Launchable, directory: Path) -> None:
    """Migrate the running guest into ``directory``/state, then resume it.
    SSH is closed first so the snapshot holds no half-open session.

    Whatever fails, the guest is resumed and its SSH awaited again, and the
    temporary directory (an unpredictable name, 0700) is removed; only a
    guest that cannot be resumed is an error for the caller."""
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp", dir=directory.parent))
    boot_to_ssh_s = machine.boot_to_ssh_s  # of the cold boot, which is what this start was
    machine.close_ssh()
    size = 0
    try:
        machine.pause_nested_guest()
        machine.qmp("migrate-set-parameters", **{"max-bandwidth": 64 << 30, "downtime-limit": 100000})
        machine.qmp("stop")
        machine.qmp("migrate", uri="exec:cat > " + shlex.quote(str(tmp / "state")))
        last: dict[str, Any] = {}

        def saved() -> bool:
            last.clear()
            last.update(machine.qmp("query-migrate"))
            if last.get("status") in ("failed", "cancelled"):
                raise failed()
            return last.get("status") == "completed"

        def failed() -> GuestError:
            return GuestError(f"saving the guest state ended {last.get('status')}: {last.get('error-desc', '')}")

        # 10 ms: the poll period of query-migrate
        poll(saved, SAVE_DEADLINE_S, 0.01, what="the guest state saved", on_timeout=lambda _: failed())
        size = (tmp / "state").stat().st_size
        os.chmod(tmp / "state", 0o600)
        (tmp / "meta.json").write_text(
            json.dumps(
                {
                    "bytes": size,
                    "saved": time.time(),
                    "config": dataclasses.asdict(machine.config),
                    "image": _saved_image(machine),
                    "accel": machine.accel,
                },
                default=str,
            )
        )
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)
    except (MemqualError, OSError) as exc:
        _resume(machine, boot_to_ssh_s)
        raise GuestError(f"saving the snapshot failed: {str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _resume(machine, boot_to_ssh_s)
    log.info("saved warm-start snapshot %s (%d MiB) in %.2f s", directory.name, size >> 20, time.monotonic() - started)


def _resume(machine: Launchable, boot_to_ssh_s: float) -> None:
    """Run the guest again after a save (or a failed one) and wait for SSH."""
    try:
        if machine.qmp("query-migrate").get("status") in ("active", "setup", "pre-switchover", "device"):
            machine.qmp("migrate_cancel")
    except MemqualError:
        pass  # cont below says whether QEMU still answers
    machine.qmp("cont")
    machine.resume_nested_guest()
    machine.wait_ssh(time.monotonic())
    machine.boot_to_ssh_s = boot_to_ssh_s


def _enforce_cap() -> None:
    """Keep the cache bounded: drop snapshots of images that no longer exist,
    then the least recently used ones beyond the size cap."""
    root = snapshot_root()
    leftovers.sweep_snapshots(root)  # half-written saves of killed runs
    entries = []
    for meta in root.glob("*/meta.json"):
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if not Path(info.get("image", "")).exists():
            _discard(meta.parent, "its image is gone")
            continue
        entries.append((meta.stat().st_mtime, int(info.get("bytes", 0)), meta.parent))
    # Saves under way (their writers hold the lock) take room too.
    total = sum(size for _, size, _ in entries) + sum(leftovers.tree_size(p) for p in root.glob(".*.tmp*"))
    for _, size, directory in sorted(entries):
        if total <= CACHE_CAP_BYTES:
            break
        _discard(directory, "the snapshot cache is over its cap")
        total -= size

"""Which QEMU runs the guests, and where it came from: the system's,
Debian's by version (images/qemu.py) or a user's build by path.

``choose`` puts a ``QemuChoice``'s binary in ``$MEMQUAL_QEMU`` for a command
and what it starts; ``current`` reads it back.  An archive QEMU runs with
its own module folder and firmware.  docs/ab-runs.md,
"host/core/qemu_binary.py"."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from memqual.host.core import clock, settings, trust
from memqual.host.core.errors import BadInput, CapabilityMissing, MemqualError
from memqual.images import built_qemus, packages
from memqual.images import qemu as archive

ENV_QEMU = settings.QEMU


@dataclasses.dataclass(frozen=True)
class QemuChoice:
    """One QEMU: its binary, its version as it says it, where it came
    from, and what it needs to run as its own build."""

    binary: Path
    version: str  # what ``--version`` says: "10.0.2", "7.2.22"
    origin: str  # "Debian bookworm-backports 1:10.0.2+ds-...", "system (...)", "your build ..."
    module_dir: Path | None = None  # QEMU_MODULE_DIR
    firmware_dirs: tuple[Path, ...] = ()  # -L, in order

    def env(self) -> dict[str, str]:
        """The environment QEMU runs in: this one, with its module folder."""
        env = dict(os.environ)
        if self.module_dir is not None:
            env["QEMU_MODULE_DIR"] = str(self.module_dir)
        return env

    def firmware_args(self) -> list[str]:
        out: list[str] = []
        for directory in self.firmware_dirs:
            out += ["-L", str(directory)]
        return out


def version_of(binary: Path, env: dict[str, str] | None = None) -> str:
    """The version ``binary --version`` prints; BadInput when it is no QEMU."""
    return _version_of(str(binary), tuple(sorted((env or {}).items())))


@functools.lru_cache(maxsize=16)
def _version_of(binary: str, env_items: tuple[tuple[str, str], ...]) -> str:
    env = dict(env_items) or None
    try:
        proc = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BadInput(f"{binary} does not run ({exc}): give a qemu-system-x86_64") from exc
    match = re.search(r"QEMU emulator version (\S+)", proc.stdout)
    if proc.returncode != 0 or not match:
        raise BadInput(
            f"{binary} is no QEMU (its --version says no 'QEMU emulator version'): give a qemu-system-x86_64"
        )
    return match.group(1)


@functools.lru_cache(maxsize=1)
def _system_package_version() -> str:
    return packages.installed_field("qemu-system-x86", "Version")


def describe(binary: Path, system: bool = False) -> QemuChoice:
    """``binary`` as a QemuChoice: an archive QEMU memqual unpacked, the
    system's, or a build of the user's."""
    unpacked = archive.owning(binary)
    built = _built(binary)
    if built is not None:
        choice = QemuChoice(binary=built.binary, version="", origin=built.describe())
    elif unpacked is not None:
        choice = QemuChoice(
            binary=unpacked.binary,
            version="",
            origin=f"Debian {unpacked.archive.suite} {unpacked.archive.package_version} (cache {unpacked.root})",
            module_dir=unpacked.module_dir,
            firmware_dirs=(unpacked.firmware_dir,),
        )
    elif system:
        package = _system_package_version()
        origin = f"system {binary}" + (f" (qemu-system-x86 {package})" if package else "")
        choice = QemuChoice(binary=binary, version="", origin=origin)
    else:
        choice = QemuChoice(binary=binary, version="", origin=f"your build {binary}")
    module_env = {"QEMU_MODULE_DIR": str(choice.module_dir)} if choice.module_dir else {}
    return dataclasses.replace(choice, version=version_of(choice.binary, {**os.environ, **module_env}))


def binary() -> Path:
    """The QEMU binary this process runs: ``$MEMQUAL_QEMU`` if set, else
    qemu-system-x86_64 on PATH.  The one place either is read, and checked
    there (``trust.program``: the file and its folders up to /; for a QEMU
    given by path, also what lies beside it, which a build loads), so
    nothing runs an unchecked QEMU as root: boot, doctor, the balloon's
    measure, the probes and the hosts' probe all come through here."""
    override = settings.qemu()
    if override:
        missing = f"{ENV_QEMU}={override} is not an executable file: point it at qemu-system-x86_64"
        return trust.program(override, ENV_QEMU, missing)
    found = shutil.which(archive.BINARY)
    if found is None:
        raise CapabilityMissing("qemu-system-x86_64 not found: run ./setup (installs qemu-system-x86)")
    return trust.program(
        found, archive.BINARY, f"{found} is not an executable file: reinstall qemu-system-x86", beside=False
    )


def current() -> QemuChoice:
    """The QEMU this process runs (``binary``), described."""
    return describe(binary(), system=settings.qemu() is None)


def is_path(spec: str) -> bool:
    return "/" in spec or spec.startswith(".")


def resolve(spec: str, cache: Path) -> QemuChoice:
    """``--qemu VERSION|BUILD|PATH`` as a QemuChoice: a version is fetched
    from the archive (once), a build's name (``memqual qemu build``) is its
    binary in the cache, a path must be a QEMU that runs."""
    if is_path(spec):
        path = Path(spec).expanduser()
        # Run as root: a binary another user could replace is theirs to run.
        missing = f"--qemu {spec}: no executable file there: give a QEMU version or a qemu-system-x86_64"
        return describe(trust.program(path, "--qemu", missing).resolve())
    if built_qemus.BUILT_NAME.fullmatch(spec):
        # a build's name, never an archive version (those have no 12 hex digits at the end)
        built = built_qemus.find(spec, cache)
        binary = trust.program(built.binary, "--qemu", f"--qemu {spec}: the build's binary is gone: build it again")
        return describe(binary)
    unpacked = archive.fetch(spec, cache)
    return describe(unpacked.binary)


def _built(binary: Path) -> built_qemus.BuiltQemu | None:
    """The ``memqual qemu build`` whose binary ``binary`` is, if any."""
    from memqual.host.core.paths import cache_dir

    try:
        return built_qemus.owning(binary, cache_dir())
    except MemqualError:  # a cache memqual refuses: then no build of its
        return None


def choose(spec: str | None) -> QemuChoice:
    """Resolve ``--qemu`` (None: what the environment already says) and make
    it this process's and its children's QEMU."""
    if spec is None:
        return current()
    from memqual.host.core.paths import cache_dir

    choice = resolve(spec, cache_dir())
    settings.put(ENV_QEMU, str(choice.binary))
    return choice


def choose_for_clock(spec: str | None, the_clock: clock.Clock, vcpus: int, fix: str = "") -> tuple[QemuChoice, str]:
    """``choose(spec)``, and a QEMU that runs ``vcpus`` vCPUs on
    ``the_clock``: with icount, more than one vCPU and nothing asked for (no
    --qemu, no $MEMQUAL_QEMU), a system QEMU too old for it gives way to
    Debian's ``clock.ICOUNT_SMP_QEMU`` (fetched once into the cache); a QEMU
    that was asked for and is too old is refused in one line.  Returns the
    choice and a note saying what was swapped ("" when nothing was)."""
    asked = spec is not None or settings.qemu() is not None
    choice = choose(spec)
    note = ""
    if not asked and not clock.runs_vcpus(the_clock, vcpus, choice.version):
        note = (
            f"--clock {the_clock.label}: the system's QEMU {choice.version} cannot run {vcpus} vCPUs under icount; "
            f"using Debian's QEMU {clock.ICOUNT_SMP_QEMU} (pass --qemu to pick another)"
        )
        choice = choose(clock.ICOUNT_SMP_QEMU)
    clock.check_vcpus(the_clock, vcpus, choice.version, fix)
    return choice, note


def device_properties(choice: QemuChoice, device: str) -> frozenset[str]:
    """The properties this QEMU's ``device`` has (``-device DEV,help``);
    empty when it has no such device.  What differs between versions is
    read from the binary, not assumed from its version number."""
    return _device_properties(str(choice.binary), tuple(sorted(choice.env().items())), device)


@functools.lru_cache(maxsize=32)
def _device_properties(binary: str, env_items: tuple[tuple[str, str], ...], device: str) -> frozenset[str]:
    try:
        proc = subprocess.run(
            [binary, "-nodefaults", "-machine", "none", "-device", f"{device},help"],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(env_items),
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(m.group(1) for m in re.finditer(r"^\s+([a-z][a-z0-9-]*)=", proc.stdout, re.MULTILINE))


def runtime_env(binary: str | Path) -> dict[str, str] | None:
    """The environment ``binary`` runs in: None (inherit) unless it is an
    archive QEMU, which gets its own module folder."""
    unpacked = archive.owning(Path(binary))
    if unpacked is None or unpacked.module_dir is None:
        return None
    return {**os.environ, "QEMU_MODULE_DIR": str(unpacked.module_dir)}


def firmware_args(binary: str | Path) -> list[str]:
    """``-L`` for an archive QEMU's own firmware; nothing for the others,
    which find their own."""
    unpacked = archive.owning(Path(binary))
    return [] if unpacked is None else ["-L", str(unpacked.firmware_dir)]


# Where Debian's QEMU finds its firmware without -L.
SYSTEM_FIRMWARE_DIRS = (Path("/usr/share/qemu"), Path("/usr/share/seabios"), Path("/usr/lib/ipxe/qemu"))


def host_firmware_dirs(binary: str | Path) -> tuple[Path, ...]:
    """The folders ``binary`` reads firmware from: an archive QEMU's own
    (its -L) first, then the system's, which it falls back to (its
    bios-microvm.bin is a link into the system's folders)."""
    unpacked = archive.owning(Path(binary))
    return SYSTEM_FIRMWARE_DIRS if unpacked is None else (unpacked.firmware_dir, *SYSTEM_FIRMWARE_DIRS)

"""What this host can do: QEMU, KVM (really booting a Linux guest, not just
opening /dev/kvm), host KSM, THP, KVM_CAP_NR_MEMSLOTS.

``/dev/kvm`` answering KVM_CREATE_VM proves little: on paravirtual KVM
(kvm_pvm) a Linux guest hangs in its decompressor and QMP still says KVM is
enabled.  Only a real boot with a deadline tells, so the probe boots the
guest image under KVM once, watching the console for the init's ready
line, and caches the answer per (host kernel, QEMU version, image).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memqual.host.core.console import ConsoleMarker
from memqual.host.core.environment import KSM_ROOT, THP_ROOT, Environment
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.kvm import DEVICE, Kvm, KvmIoctlError, KvmUnavailable
from memqual.host.core.kvm_uapi import KVM_CAP_NR_MEMSLOTS
from memqual.host.core.paths import cache_dir, release_tempdir, short_tempdir, write_private_atomic
from memqual.host.core.polling import poll
from memqual.host.core.process import die_with_parent

if TYPE_CHECKING:  # memqual.images.build imports host: only the type, for annotations
    from memqual.images.build import Image

KVM_DEVICE = Path(DEVICE)
KSM_DIR = KSM_ROOT
THP_ENABLED = THP_ROOT / "enabled"
PROBE_ANSWERS_KEPT = 8  # earlier probe answers kept beside the last
KVM_BOOT_DEADLINE_S = 15.0  # a KVM guest reaches init in well under 2 s
# The host's KSM knobs an environment shows (read-only).
KSM_KNOBS = ("run", "pages_to_scan", "sleep_millisecs", "smart_scan", "merge_across_nodes", "use_zero_pages")


@dataclasses.dataclass(frozen=True)
class HostCapabilities:
    """What ``memqual doctor`` shows: the host as every record fingerprints
    it (``environment``, its accelerator from a fresh KVM probe) and what
    memqual may do on it."""

    environment: Environment
    kvm_device: bool
    kvm_boots_linux: bool
    kvm_boot_detail: str
    ksm_available: bool
    ksm_writable: bool

    def to_json(self) -> dict[str, Any]:
        """doctor's keys, in its order (a lab host's doctor answer is read by them)."""
        env = self.environment
        return {
            "qemu_version": env.qemu if env.qemu is not None else "missing",
            "qemu_origin": env.qemu_origin if env.qemu_origin is not None else "none",
            "host_kernel": env.host_kernel,
            "kvm_device": self.kvm_device,
            "kvm_boots_linux": self.kvm_boots_linux,
            "kvm_boot_detail": self.kvm_boot_detail,
            "accel": env.accel,
            "accel_reason": env.accel_reason,
            "ksm_available": self.ksm_available,
            "ksm_writable": self.ksm_writable,
            "thp": env.thp,
            "kvm_nr_memslots": env.kvm_nr_memslots,
            "cpu_model": env.cpu,
        }


def host_kernel() -> str:
    return platform.release()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def thp_mode() -> str:
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return "unavailable"
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else text.strip()


def ksm_writable() -> bool:
    return os.access(KSM_DIR / "run", os.W_OK)


def kvm_nr_memslots() -> int | None:
    try:
        with Kvm(str(KVM_DEVICE)) as kvm:
            return kvm.check_extension(KVM_CAP_NR_MEMSLOTS)
    except (KvmUnavailable, KvmIoctlError):
        return None


def ksm_knobs() -> dict[str, str] | None:
    """The host's KSM knobs that exist, or None without KSM."""
    if not KSM_DIR.is_dir():
        return None
    knobs = {}
    for name in KSM_KNOBS:
        try:
            knobs[name] = (KSM_DIR / name).read_text().strip()
        except OSError:
            continue
    return knobs


def kvm_usable_device() -> bool:
    return KVM_DEVICE.exists() and os.access(KVM_DEVICE, os.R_OK | os.W_OK)


def _probe_cache_file() -> Path:
    return cache_dir() / "probe-kvm.json"


def kvm_boots_linux(force: bool = False) -> tuple[bool, str]:
    """Boot the guest image under KVM with a deadline.  Cached."""
    if not kvm_usable_device():
        return False, "/dev/kvm is missing or not accessible"
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.core.qemu import qemu_version
    from memqual.images.build import build

    image = build()
    key = f"{host_kernel()}|{qemu_version()}|{image.kernel_sha256}|{image.initramfs_sha256}"
    cache_file = _probe_cache_file()
    # The last answer at the top; earlier ones (another QEMU, another
    # image) under "others", so switching QEMUs does not probe again.
    others: dict[str, dict[str, object]] = {}
    try:
        cached = json.loads(cache_file.read_text())
        others = {k: v for k, v in dict(cached.get("others") or {}).items() if isinstance(v, dict)}
        if "key" in cached:
            others[str(cached["key"])] = {"boots": cached["boots"], "detail": cached["detail"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        others = {}
    if not force and key in others:
        return bool(others[key]["boots"]), str(others[key]["detail"])
    boots, detail = _boot_under_kvm(image)
    others.pop(key, None)
    kept = dict(list(others.items())[-PROBE_ANSWERS_KEPT:])
    answer = {"key": key, "boots": boots, "detail": detail, "others": kept}
    write_private_atomic(cache_file, json.dumps(answer).encode(), 0o644)
    return boots, detail


def _boot_under_kvm(image: Image) -> tuple[bool, str]:
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.core.qemu import MachineConfig, command_line
    from memqual.host.core.qemu_binary import runtime_env

    workdir = short_tempdir("mqprobe")
    console = workdir / "console.log"
    config = MachineConfig(memory_mib=256, cpus=1, balloon=None, warm=False)
    # No QMP and no network for the probe: only the console matters.
    argv = command_line(config, "kvm", image.kernel, image.initrd, None, console, None)
    ready = ConsoleMarker(console)
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
        env=runtime_env(argv[0]),
    )
    try:
        # polling the console file every 50 ms; the deadline bounds it
        if poll(
            lambda: ready.seen() or proc.poll() is not None,
            KVM_BOOT_DEADLINE_S,
            0.05,
            what="a Linux guest at init under KVM",
            raise_on_timeout=False,
        ).met:
            if ready.seen():
                return True, f"a Linux guest reached init under KVM in {time.monotonic() - started:.1f} s"
            out = (proc.stdout.read() if proc.stdout else b"").decode(errors="replace").strip()
            return False, f"QEMU with KVM exited ({out.splitlines()[-1] if out else proc.returncode})"
        return False, f"a Linux guest did not reach init under KVM within {KVM_BOOT_DEADLINE_S:.0f} s (hangs early)"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
        release_tempdir(workdir)


def cached_accel() -> tuple[str, str] | None:
    """The accelerator 'auto' would choose, from the KVM probe's last answer
    (``kvm_boots_linux``), without booting anything; None when the probe
    never ran here."""
    try:
        cached = json.loads(_probe_cache_file().read_text())
        boots, detail = bool(cached["boots"]), str(cached["detail"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ("kvm", detail) if boots else ("tcg", f"TCG because {detail}")


def environment(*, with_ksm: bool = False) -> Environment:
    """This host's part of the environment: kernel, QEMU (``$MEMQUAL_QEMU``
    when set), CPU, THP, KVM's slot limit, and the accelerator of the KVM
    probe's cached answer.  Read-only and cheap: it boots no guest.
    ``with_ksm`` adds the KSM knobs (left out of scenario records, whose
    KSM settings are their own)."""
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.core.qemu import qemu_version
    from memqual.host.core.qemu_binary import current

    origin: str | None = None
    try:
        qemu: str | None = qemu_version()
        origin = current().origin
    except (BadInput, CapabilityMissing, OSError, subprocess.SubprocessError):
        qemu = None
    accel, reason = cached_accel() or (None, None)
    return Environment(
        host_kernel=host_kernel(),
        qemu=qemu,
        qemu_origin=origin,
        accel=accel,
        accel_reason=reason,
        cpu=cpu_model(),
        ksm=ksm_knobs() if with_ksm else None,
        thp=thp_mode(),
        kvm_nr_memslots=kvm_nr_memslots(),
        python=sys.version.split()[0],
    )


def resolve_accel(requested: str) -> tuple[str, str]:
    """('kvm' or 'tcg', why).  'auto' uses KVM only where it boots Linux."""
    if requested == "tcg":
        return "tcg", "TCG requested"
    boots, detail = kvm_boots_linux()
    if requested == "kvm":
        if not boots:
            raise CapabilityMissing(f"KVM requested but unusable here: {detail}; use --accel tcg or auto")
        return "kvm", detail
    return ("kvm", detail) if boots else ("tcg", f"TCG because {detail}")


def capabilities(force: bool = False) -> HostCapabilities:
    """Everything doctor shows.  Missing pieces are reported, not raised:
    doctor is what a user runs to find out what is missing."""
    # imported here, not at the top: keeps `memqual --help` fast
    from memqual.host.core.qemu import qemu_version

    try:
        qemu_version()  # a QEMU memqual may run, or why the probe does not boot one
        boots, detail = kvm_boots_linux(force=force)
    except (CapabilityMissing, BadInput) as exc:
        boots, detail = False, f"not probed: {exc}"
    accel, reason = ("kvm", detail) if boots else ("tcg", f"TCG because {detail}")
    return HostCapabilities(
        environment=environment().with_accel(accel, reason),
        kvm_device=KVM_DEVICE.exists(),
        kvm_boots_linux=boots,
        kvm_boot_detail=detail,
        ksm_available=(KSM_DIR / "run").exists(),
        ksm_writable=ksm_writable(),
    )

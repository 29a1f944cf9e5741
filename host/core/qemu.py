"""QEMU command lines: a pure function from a machine configuration and an
image to argv, so it can be unit tested without starting anything."""

from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
from pathlib import Path

from memqual.host.core import settings
from memqual.host.core.clock import DEFAULT_BOOT_SEED, ICOUNT_TSC_KHZ, WALL_CLOCK, Clock
from memqual.host.core.clock import parse as parse_clock
from memqual.host.core.errors import BadInput

MACHINE_TYPES = ("microvm", "pc", "q35")
# The port the monitor of a host under test's guest listens on inside L1,
# reached through L1's forward of a free loopback port.
INNER_QMP_PORT = 4444
# A host under test's guest marks a moment of its work for L1 by
# connecting here (host/ksm/agent.py `marked`): L1's QEMU hands the
# connection to MARK_COMMAND, which writes into L1's FIFO, where a
# measurement waiting in L1 reads it (host/ksm/l1_ksm.py).  The channel is all inside L1, so the
# moment L1 sees is the guest's, not one this machine's pace sets.
# guestfwd works under restrict=on: the guest reaches only this.
MARK_ADDRESS = "10.0.2.100"
MARK_PORT = 5555
L1_MARK_FIFO = "/run/memqual-mark"
# What L1's QEMU runs for each connection, its stdin the connection:
# libslirp splits the command into words itself (no shell, so no
# redirection), and tee appends what comes to the FIFO.
MARK_COMMAND = ("tee", "-a", L1_MARK_FIFO)
# A second monitor of a host under test's guest QEMU, human (HMP), on two
# FIFOs in L1 (PIPE.in, PIPE.out; guest/rc.host makes them): L1's own
# schedule sends a command through it at the guest's mark
# (host/balloon/l1_moves.py).  HMP, not QMP: it sends no events, so
# nothing waits unread in the pipe while no one reads it.
L1_MONITOR_PIPE = "/run/memqual-hmp"


@dataclasses.dataclass(frozen=True)
class BalloonDevice:
    """A virtio-balloon device and the properties scenarios vary."""

    free_page_reporting: bool = False
    deflate_on_oom: bool = False
    id: str = "balloon0"


# The guest code that drives the device, as Scenario.kernel_paths name it
# (host/core/scenario.py): the driver, its page migration and free page
# reporting, which the driver starts in every guest that negotiates it.
# Here, with the device, because two subjects' guests run it (the balloon's
# and hugetlbfs' inflates) and neither imports the other.
BALLOON_DRIVER_PATHS = (
    "drivers/virtio/virtio_balloon.c",
    "include/uapi/linux/virtio_balloon.h",
    "include/linux/balloon_compaction.h",
    "mm/balloon_compaction.c",
    "mm/page_reporting.c",
    "mm/page_reporting.h",
    "include/linux/page_reporting.h",
)


@dataclasses.dataclass(frozen=True)
class MachineConfig:
    """Everything that shapes one guest.  Also the warm-start snapshot key:
    two configs that compare equal may share a saved guest state."""

    memory_mib: int = 1024
    cpus: int = 2
    machine: str = "microvm"  # microvm boots fastest; pc/q35 for hotplug
    accel: str = "auto"  # auto | kvm | tcg
    maxmem_mib: int | None = None  # enables pc-dimm hotplug (pc/q35 only)
    mem_slots: int = 0
    mem_merge: bool = True  # QEMU marks guest RAM MADV_MERGEABLE for host KSM
    balloon: BalloonDevice | None = BalloonDevice()
    extra_args: tuple[str, ...] = ()  # raw QEMU arguments, appended last
    cmdline_extra: str = ""
    warm: bool = True  # may restore from a saved snapshot (see memqual.host.core.snapshot)
    # The clock its timings are read with (host/core/clock.py): wall or
    # icount:SHIFT; empty: the process's ($MEMQUAL_CLOCK, else wall).
    clock: str = ""
    # TCG's threading on the wall clock: "" is QEMU's default (one thread a
    # vCPU), "single" takes the vCPUs in turn on one thread as icount does,
    # so a fault that belongs to multi-threaded TCG can be told apart.
    tcg_thread: str = ""

    def __post_init__(self) -> None:
        if self.machine not in MACHINE_TYPES:
            raise BadInput(f"machine type {self.machine!r} unknown: use one of {', '.join(MACHINE_TYPES)}")
        if self.accel not in ("auto", "kvm", "tcg"):
            raise BadInput(f"accelerator {self.accel!r} unknown: use auto, kvm or tcg")
        if self.memory_mib < 128:
            raise BadInput(f"guest memory {self.memory_mib} MiB is too small: give at least 128 MiB")
        if self.cpus < 1:
            raise BadInput("give at least one CPU")
        if self.maxmem_mib is not None:
            if self.machine == "microvm":
                raise BadInput("microvm has no memory hotplug: use machine 'pc' or 'q35' with maxmem")
            if self.maxmem_mib < self.memory_mib or self.mem_slots < 1:
                raise BadInput("maxmem must be at least the memory size, with mem_slots >= 1")
        if self.clock:
            parse_clock(self.clock)
        if self.tcg_thread not in ("", "single", "multi"):
            raise BadInput(f"TCG threading {self.tcg_thread!r} unknown: give single or multi")


ENV_QEMU = settings.QEMU


def qemu_binary() -> str:
    """The QEMU binary: ``$MEMQUAL_QEMU`` if set, else qemu-system-x86_64 on
    PATH, checked before anyone runs it (``qemu_binary.binary``).  Not
    cached, so a changed environment takes effect at once."""
    # lazy: as in command_line, images/'s archive QEMU stays out of memqual's start
    from memqual.host.core.qemu_binary import binary

    return str(binary())


def qemu_version(binary: str | None = None) -> str:
    """What ``binary --version`` says (default: the QEMU of this process)."""
    return _version_of(binary or qemu_binary())


@functools.lru_cache(maxsize=8)
def _version_of(binary: str) -> str:
    from memqual.host.core.qemu_binary import runtime_env

    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, env=runtime_env(binary)
    ).stdout
    match = re.search(r"version (\S+)", out)
    return match.group(1) if match else "unknown"


def _virtio(machine: str, device: str) -> str:
    """virtio devices are virtio-mmio on microvm, virtio-pci elsewhere."""
    return f"virtio-{device}-device" if machine == "microvm" else f"virtio-{device}-pci"


def balloon_notify(machine: str, clock: Clock) -> str:
    """The balloon's PCI property that makes QEMU answer a request in the
    vCPU's own thread on icount (ioeventfd off).  With ioeventfd on, TCG
    signals the kick to QEMU's main loop and the vCPU idles until the host
    gets to it; under sleep=off an idle guest's clock jumps to its next
    timer, so the host's pace would set the guest-timed figure."""
    return ",ioeventfd=off" if clock.icount and machine != "microvm" else ""


_TSC_REFINED = re.compile(r"Refined TSC clocksource calibration: ([0-9.]+) MHz")
_TSC_DETECTED = re.compile(r"tsc: Detected ([0-9.]+) MHz processor")


@functools.lru_cache(maxsize=1)
def host_tsc_khz() -> int | None:
    """The host's TSC frequency, or None when it is not known for sure.

    Under TCG the guest reads the host's TSC but calibrates it against the
    emulated PIT; on a busy host that calibration fails, the guest marks its
    TSC unstable and a 2-CPU boot stalls.  Telling the guest the frequency
    (tsc_early_khz) skips the calibration, but a wrong figure makes the
    guest's clock run fast or slow, and every guest-side timing with it.
    So: the host kernel's own calibration from its log; else /proc/cpuinfo's
    "cpu MHz" only where it is the TSC's (a VM, or a CPU whose TSC
    frequency is known: on bare metal it is the current core clock, which
    moves with frequency scaling); else None, and the guest calibrates."""
    return tsc_khz_from(_kernel_log(), _read("/proc/cpuinfo"))


def tsc_khz_from(kernel_log: str, cpuinfo: str) -> int | None:
    for pattern in (_TSC_REFINED, _TSC_DETECTED):
        found = pattern.findall(kernel_log)
        if found:
            return round(float(found[-1]) * 1000)
    flags: set[str] = set()
    mhz: float | None = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "cpu MHz" and mhz is None:
            try:
                mhz = float(value)
            except ValueError:
                pass
    if mhz and flags & {"hypervisor", "tsc_known_freq"}:
        return round(mhz * 1000)
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _kernel_log() -> str:
    """The host kernel's log (dmesg), or "" where it may not be read."""
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def opt_value(value: object) -> str:
    """A value for a QEMU option string (``key=value,key=value``): a comma
    inside it is written twice, else QEMU would read what follows as
    another option (a path "a,server=on" must not add server=on)."""
    return str(value).replace(",", ",,")


def tcg_accel_option(accel: str, clock: Clock, thread: str) -> str:
    """``-accel``'s value: the clock's (icount is single-threaded TCG), or
    TCG with the threading asked for."""
    if clock.icount or accel != "tcg" or not thread:
        return clock.accel_option(accel)
    return f"tcg,thread={thread}"


def kernel_cmdline(config: MachineConfig, accel: str = "tcg", clock: Clock = WALL_CLOCK) -> str:
    # quiet + lpj skip work that costs seconds under TCG; panic=-1 with
    # -no-reboot turns a guest panic into QEMU exiting at once.
    parts = [
        "console=ttyS0",
        "panic=-1",
        "rdinit=/init",
        "quiet",
        "loglevel=4",
        "tsc=reliable",
        "no_timer_check",
        "cryptomgr.notests",
        "random.trust_cpu=on",
        "8250.nr_uarts=1",
        "mitigations=off",
        "audit=0",
        "memhp_default_state=offline",
        # Boot-time work a test guest does not need, each measured at 50 to
        # 200 ms under TCG (initcall_debug): IPv6, AppArmor, a KDF self-test,
        # encrypted-key type set-up and kprobe trace events.
        "ipv6.disable=1",
        "apparmor=0",
        "initcall_blacklist=crypto_kdf108_init,init_encrypted,init_kprobe_trace",
        # guest/rc.sh loads only this machine's virtio transport.
        f"memqual.transport={'mmio' if config.machine == 'microvm' else 'pci'}",
    ]
    # Under icount the guest's TSC is the virtual clock, one tick a
    # nanosecond whatever the shift: the host's frequency would make every
    # guest timing wrong by their ratio, and a calibration against the PIT
    # would only find the same 1000 MHz less exactly.
    khz = ICOUNT_TSC_KHZ if clock.icount else host_tsc_khz()
    if accel == "tcg" and khz:
        parts.append(f"tsc_early_khz={khz}")
    # A kernel of a series (memqual bisect) may carry its own extra command
    # line, given to the scenarios through the environment like the kernel.
    env_extra = settings.guest_cmdline_extra()
    if env_extra:
        parts.append(env_extra)
    if config.cmdline_extra:
        parts.append(config.cmdline_extra)
    return " ".join(parts)


def command_line(
    config: MachineConfig,
    accel: str,
    kernel: Path,
    initrd: Path,
    qmp_socket: Path | None,
    console_log: Path,
    ssh_port: int | None,
    incoming: str | None = None,
    clock: Clock = WALL_CLOCK,
    forwards: tuple[tuple[int, int], ...] = (),
    inner: bool = False,
) -> list[str]:
    """argv for one guest.  ``accel`` is the resolved accelerator (kvm/tcg);
    ``clock`` the clock its timings are read with (icount: single-threaded
    TCG with a fixed shift, memqual.host.core.clock);
    ``incoming`` restores a saved state instead of booting.  Without a
    ``qmp_socket`` the guest has no monitor, without an ``ssh_port`` no
    network: the probe's guest, which only has to reach init on its
    console."""
    machine = config.machine
    machine_opts = [machine, f"mem-merge={'on' if config.mem_merge else 'off'}"]
    memory = f"{config.memory_mib}M"
    if config.maxmem_mib is not None:
        memory += f",slots={config.mem_slots},maxmem={config.maxmem_mib}M"
    from memqual.host.core.qemu_binary import firmware_args

    binary = qemu_binary()
    argv = [
        binary,
        *firmware_args(binary),
        "-M",
        ",".join(machine_opts),
        "-accel",
        tcg_accel_option(accel, clock, config.tcg_thread),
        *clock.qemu_args(settings.boot_seed(DEFAULT_BOOT_SEED)),
        "-cpu",
        "max" if accel == "tcg" else "host",
        "-m",
        memory,
        "-smp",
        str(config.cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        kernel_cmdline(config, accel, clock),
        "-chardev",
        f"file,id=console,path={opt_value(console_log)}",
        "-serial",
        "chardev:console",
    ]
    if inner:
        argv += [
            "-chardev",
            f"socket,id=qmp,host=0.0.0.0,port={INNER_QMP_PORT},server=on,wait=off",
            "-mon",
            "chardev=qmp,mode=control",
            "-chardev",
            f"pipe,id=schedule,path={L1_MONITOR_PIPE}",
            "-mon",
            "chardev=schedule,mode=readline",
        ]
    elif qmp_socket is not None:
        argv += [
            "-chardev",
            f"socket,id=qmp,path={opt_value(qmp_socket)}",
            "-mon",
            "chardev=qmp,mode=control",
        ]
    if ssh_port is not None:
        argv += [
            # restrict=on: the guest reaches nothing outside (not the host's
            # loopback services, not the network); the inbound SSH forward
            # still works.
            "-netdev",
            f"user,id=net0,restrict=on,hostfwd=tcp:{'' if inner else '127.0.0.1'}:{ssh_port}-:22"
            + "".join(f",hostfwd=tcp:127.0.0.1:{host}-:{guest}" for host, guest in forwards)
            + (f",guestfwd=tcp:{MARK_ADDRESS}:{MARK_PORT}-cmd:{' '.join(MARK_COMMAND)}" if inner else ""),
            "-device",
            _virtio(machine, "net") + ",netdev=net0" + ("" if machine == "microvm" else ",romfile="),
        ]
    if config.balloon is not None:
        b = config.balloon
        argv += [
            "-device",
            f"{_virtio(machine, 'balloon')},id={b.id},"
            f"free-page-reporting={'on' if b.free_page_reporting else 'off'},"
            f"deflate-on-oom={'on' if b.deflate_on_oom else 'off'}" + balloon_notify(machine, clock),
        ]
    if incoming is not None:
        argv += ["-incoming", incoming]
    argv += list(config.extra_args)
    return argv

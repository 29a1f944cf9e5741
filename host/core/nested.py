"""The host under test: a host kernel (L1) booted under TCG with emulated
SVM, whose KVM runs the guest (L2), so KVM, ksmd, mm and the guest's QEMU
run on a kernel memqual chose and their work lands on L1's clock.

Pure parts here (the host spec, L1's and the guest's command lines, the
clock and vCPUs L1 can run, the guest monitor's greeting); the process is
Machine's (host/core/machine.py).  The design and its measurements:
docs/host-under-test.md."""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Callable
from pathlib import Path

from qemu.qmp.legacy import QEMUMonitorProtocol

from memqual.host.core import settings
from memqual.host.core.clock import ICOUNT, ICOUNT_TSC_KHZ, WALL_CLOCK, Clock
from memqual.host.core.environment import shared_fact
from memqual.host.core.errors import BadInput
from memqual.host.core.kernelspec import KernelSpec, parse_kernel
from memqual.host.core.polling import poll
from memqual.host.core.qemu import MachineConfig, command_line, host_tsc_khz, opt_value

# L1's memory beyond its guest's: the initramfs with QEMU and the guest's
# image unpacked (about 200 MiB), the guest's QEMU and L1's kernel.
L1_OVERHEAD_MIB = 1024
# The guest's SSH port inside L1 (L1's own dropbear has 22).
INNER_SSH_PORT = 2222
FW_CFG_NAME = "opt/memqual/guest-argv"
# microvm's fw_cfg (ports 0x510-0x51b, DMA at +4), told to the driver
# since microvm's firmware tables do not describe it.
FW_CFG_IOPORT = "qemu_fw_cfg.ioport=0x0c@0x510:0:1:4"
# TCG's AMD CPU with SVM and nested paging: QEMU's emulation of AMD-V,
# which L1's kvm_amd drives (checked here: ENVIRONMENT.md).
TCG_SVM_CPU = "qemu64,+svm,+npt,+rdrand"
# The coarsest icount shift L1 runs at (docs/host-under-test.md, "The
# clock").  At shift 4 (16 ns an instruction) the guest stalled in its
# boot; at shift 2 it booted, but a guest interrupted often (a balloon
# inflate polled every 10 ms) got an interrupt inside its own interrupt
# handler and deadlocked, 3 times of 3; at shifts 1 and 0, 1 of 1 and 2 of
# 2 completed.  Each guest timer tick is then 4 times more L1 instructions
# apart than at shift 2.
MAX_SHIFT = 0
# A boot of L1 and then the guest takes this many times a plain guest's
# (41 s of wall time on icount:2 here against about 7 s for a plain TCG boot
# to SSH on a loaded host): a command's boot deadline grows by it.
BOOT_TIMEOUT_FACTOR = 4
# QEMU's microvm gives a KVM guest no CMOS RTC, and Linux then probes
# ports 0x70-0x71 for one anyway (a platform device, no PNP entry): under
# L1 that probe spun 3 s of the guest's boot before "rtc_cmos: broken or
# not accessible" (docs/host-under-test.md, "How it is built, and why").
# A second initcall_blacklist adds to the first.
NO_CMOS_PROBE = "initcall_blacklist=cmos_init"
# The guest's CPU is L1's, an AMD of family 15, so Linux looks for a K8
# GART (the AGP aperture, twice) and runs its early PCI quirks, reading
# PCI config space through ports 0xcf8/0xcfc: every read an exit to the
# guest's QEMU in L1.  Under L1 that took 1.48 s of the guest's 2.27 s
# kernel boot (its dmesg: "AGP: Checking aperture..." to "No AGP bridge
# found", 0.66 s, and 0.82 s before the first).  pci=noearly skips the
# early reads alone; the PCI bus is probed as before (seed 000's pc
# guest has its NIC and VGA there).  docs/host-under-test.md, "How it is
# built, and why".
NO_EARLY_PCI = "pci=noearly"
PARAM = re.compile(r"([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)=([A-Za-z0-9_.,+-]+)")
HOST_FAILED = "memqual-host-failed"  # guest/rc.host's line when L1 cannot start the guest


@dataclasses.dataclass(frozen=True)
class HostUnderTest:
    """A host kernel as the guest's host: ``kernel`` a Debian kernel by
    name or a ``memqual kernel build`` name, with its extra command line;
    ``params`` module parameters of L1's KVM (``kvm_amd.npt=0``)."""

    kernel: KernelSpec
    params: tuple[str, ...] = ()
    # What a scenario sets at L1's boot because it must be in place before
    # the guest's QEMU starts (THP's mode, which decides how guest RAM is
    # faulted in): its knobs, not the host's identity, so not in ``name``.
    boot_knobs: tuple[str, ...] = ()
    # What guards against the outer QEMU's re-delivery of injected
    # interrupts (GUEST_CPU, MAX_SHIFT): changed only to show the bug
    # again (lab/svm_redelivery.py), and then part of the host's name.
    guest_cpu: str = ""
    max_shift: int | None = None

    @property
    def name(self) -> str:
        lab = [f"guest-cpu={self.guest_cpu}"] if self.guest_cpu else []
        lab += [f"max-shift={self.max_shift}"] if self.max_shift is not None else []
        return self.kernel.name + "".join(f" {p}" for p in (*self.params, *lab))

    @property
    def cpu(self) -> str:
        """The guest's -cpu under L1's KVM."""
        return self.guest_cpu or GUEST_CPU

    @property
    def shift_cap(self) -> int:
        return MAX_SHIFT if self.max_shift is None else self.max_shift

    def label(self, accel: str) -> str:
        """How records and pages name this host."""
        how = EMULATED_SVM if accel == "tcg" else "KVM (nested)"
        return f"{self.name} in {how}, L2 accel kvm"

    def cmdline(self) -> str:
        """L1's extra kernel command line: the kernel's own, then the
        module parameters, which L1's modprobe reads from it."""
        return " ".join(p for p in (self.kernel.cmdline_extra, *self.params, *self.boot_knobs) if p)

    def with_boot_knobs(self, *words: str) -> HostUnderTest:
        """This host with ``words`` added to L1's command line (checked like
        any kernel command line)."""
        for word in words:
            parse_kernel(f"x:{word}")
        return dataclasses.replace(self, boot_knobs=(*self.boot_knobs, *words))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"kernel": self.kernel.name, "params": list(self.params)}
        if self.guest_cpu:
            out["guest_cpu"] = self.guest_cpu
        if self.max_shift is not None:
            out["max_shift"] = self.max_shift
        return out


def host_clock(asked: Clock, max_shift: int = MAX_SHIFT) -> Clock:
    """The clock L1 runs on for ``asked``: icount no coarser than
    ``max_shift``; the wall clock as it is."""
    if asked.icount and asked.shift is not None and asked.shift > max_shift:
        return Clock(ICOUNT, max_shift)
    return asked


THIS_MACHINE = "this machine"
# How a host's label says L1 ran under TCG with emulated SVM: an emulated
# CPU, whose figures are its instructions and emulated exits.
EMULATED_SVM = "TCG+SVM"


def on_emulated_svm(label: str) -> bool:
    """Does a host's label (``HostUnderTest.label``) name an L1 that ran
    under TCG with emulated SVM?"""
    return f" in {EMULATED_SVM}," in label


def this_machine_label(accel: str) -> str:
    return f"{THIS_MACHINE}, accel {accel}"


def parse_param(text: str) -> str:
    """``module.param=value`` for a module L1 loads, checked for form
    (the parameter's existence is checked against the kernel's module,
    ``check_params``)."""
    match = PARAM.fullmatch(text.strip())
    if not match:
        raise BadInput(f"--host-kernel-param {text!r}: give module.param=value for kvm or kvm_amd (e.g. kvm_amd.npt=0)")
    return match.group(0)


def parse_host(kernel: str, params: list[str] | tuple[str, ...] = ()) -> HostUnderTest:
    return HostUnderTest(parse_kernel(kernel), tuple(parse_param(p) for p in params))


def from_environment() -> HostUnderTest | None:
    """The host under test this process's guests run on
    (``$MEMQUAL_HOST_KERNEL``, set by ``memqual run --host-kernel``), or
    None: this machine."""
    kernel = settings.host_kernel()
    if not kernel:
        return None
    try:
        return parse_host(kernel, settings.host_kernel_params())
    except BadInput as exc:
        raise BadInput(f"{settings.HOST_KERNEL}={kernel!r}: {exc}") from None


def environment_of(host: HostUnderTest) -> dict[str, str]:
    """The variables that make ``host`` the host of a child's guests."""
    return {settings.HOST_KERNEL: host.kernel.name, settings.HOST_KERNEL_PARAMS: " ".join(host.params)}


def put_environment(host: HostUnderTest | None) -> None:
    """Make ``host`` the host of this process's and its children's guests."""
    values = environment_of(host) if host else {}
    for name in (settings.HOST_KERNEL, settings.HOST_KERNEL_PARAMS):
        settings.put(name, values.get(name) or None)


def check_same_host(hosts: dict[str, str | None]) -> str:
    """The one host of several sources (an A/B's arms, compare's files),
    given as ``{source: host}`` (None: this machine); one line when they
    differ: a ratio across hosts measures the hosts, not what the run
    compares."""
    return shared_fact(
        hosts,
        THIS_MACHINE,
        differ="the figures ran on different hosts",
        advice="a ratio across hosts compares the hosts; run both on the same host (--host-kernel), or, for an "
        "A/B of host kernels, compare with --across-hosts",
        joiner=" on ",
    )


def check_params(host: HostUnderTest, known: dict[str, set[str]]) -> None:
    """Each parameter names a module L1 loads and a parameter that module
    has (``known``: by module, from modinfo)."""
    for param in host.params:
        module, _, rest = param.partition(".")
        name = rest.partition("=")[0]
        if module not in known:
            raise BadInput(
                f"--host-kernel-param {param}: L1 loads {' and '.join(sorted(known))}, not {module}; "
                "give one of their parameters"
            )
        if name not in known[module]:
            raise BadInput(
                f"--host-kernel-param {param}: {host.kernel.version}'s {module} has no parameter {name} "
                f"(it has: {', '.join(sorted(known[module])) or 'none'})"
            )


# The guest's CPU under L1's KVM.  kvm-pv-eoi=off: TCG's SVM (QEMU 7.2
# to 10.0 at least) delivers an interrupt VMRUN injects and leaves its
# vector pending as an exception, so a vCPU exit before the guest's next
# VM exit (icount's deadlines make them frequent) delivers it a second
# time, whatever the guest's IF.  With paravirtual EOI the guest's timer
# handler makes no exit before it takes the hrtimer lock, and the second
# delivery deadlocks it there; a real EOI exits at the handler's start.
# docs/host-under-test.md, "A guest that spun on icount".
GUEST_CPU = "host,kvm-pv-eoi=off"


def guest_argv(config: MachineConfig, host_clock: Clock, kernel: str, initrd: str, cpu: str = GUEST_CPU) -> list[str]:
    """The guest's QEMU command line as L1 runs it: KVM, its monitor on a
    TCP port of L1, its SSH forwarded from L1's address, its console on
    L1's.  The guest's TSC is L1's: 1 GHz of L1's virtual time under
    icount, else this machine's rate, told so it skips a calibration that
    costs L1 seconds."""
    khz = ICOUNT_TSC_KHZ if host_clock.icount else host_tsc_khz()
    tsc = f"tsc_early_khz={khz}" if khz else ""
    # A pc or q35 guest has its CMOS RTC: only microvm's probe finds nothing.
    no_cmos = NO_CMOS_PROBE if config.machine == "microvm" else ""
    extra = " ".join(p for p in (config.cmdline_extra, tsc, no_cmos, NO_EARLY_PCI) if p)
    inner = dataclasses.replace(
        config, cmdline_extra=extra, warm=False, clock="", extra_args=(*config.extra_args, "-cpu", cpu)
    )
    return command_line(
        inner,
        "kvm",
        Path(kernel),
        Path(initrd),
        None,
        Path("/dev/console"),
        INNER_SSH_PORT,
        None,
        WALL_CLOCK,
        inner=True,
    )


def host_config(
    config: MachineConfig, host: HostUnderTest, argv_file: Path, accel: str, host_clock: Clock
) -> MachineConfig:
    """L1's machine: microvm with the guest's vCPUs, its memory and more,
    an AMD CPU with SVM (TCG) or this machine's (KVM), the guest's argv in
    fw_cfg.  Guest RAM is not marked mergeable: this machine's KSM stays
    out of L1."""
    cpu = TCG_SVM_CPU if accel == "tcg" else "host"
    # A guest that can grow (memory hotplug: virtio-mem) may take all of
    # its maxmem from L1.
    guest_mib = max(config.memory_mib, config.maxmem_mib or 0)
    return MachineConfig(
        memory_mib=guest_mib + L1_OVERHEAD_MIB,
        cpus=host_vcpus(config.cpus, host_clock),
        machine="microvm",
        accel=accel,
        mem_merge=False,
        balloon=None,
        extra_args=("-cpu", cpu, "-fw_cfg", f"name={FW_CFG_NAME},file={opt_value(argv_file)}"),
        cmdline_extra=" ".join(p for p in ("memqual.role=host", FW_CFG_IOPORT, host.cmdline()) if p),
        warm=False,
        clock=host_clock.label,
        tcg_thread=config.tcg_thread,
    )


def host_vcpus(guest_vcpus: int, host_clock: Clock) -> int:
    """L1's vCPUs, and the guest's: one each under icount, else as many as
    the guest asks.  Measured here on icount:2: with two L1 vCPUs (QEMU
    10.0.2) the guest reset itself a second into its boot, every time; with
    one L1 vCPU a guest of two stalled (RCU stall warnings, no SSH in 200 s)."""
    return 1 if host_clock.icount else guest_vcpus


def write_argv(argv: list[str], path: Path) -> None:
    """The guest's argv, NUL-separated, as rc.host hands it to xargs -0."""
    for word in argv:
        if "\0" in word:
            raise BadInput("a guest QEMU argument holds a NUL byte")
    path.write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")


def monitor_greets(port: int, timeout: float) -> socket.socket | None:
    """A connection to the guest's monitor once it greets, else None.
    L1's forward accepts before anything listens in L1, then drops the
    connection: the greeting's first byte, peeked, tells the monitor is
    there, and the socket is handed to QMP with the greeting unread."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return None
    try:
        sock.settimeout(timeout)
        first = sock.recv(1, socket.MSG_PEEK)
    except OSError:
        first = b""
    if first != b"{":
        sock.close()
        return None
    sock.settimeout(None)
    return sock


# /proc/net/tcp's states of a socket whose process still holds it: the
# connection is open (ESTABLISHED) or the peer closed it and its owner has
# not yet (CLOSE_WAIT).  Every other state at the monitor's port is the
# listening socket or the kernel's alone (LAST_ACK, TIME_WAIT, ...).
HELD_STATES = frozenset({"01", "08"})


def monitor_held(proc_net_tcp: str, port: int) -> bool:
    """Whether a connection to ``port`` is still held by its server, from
    the text of /proc/net/tcp and /proc/net/tcp6 (their header lines
    included): a socket whose local port is ``port`` in a state its
    process holds (``HELD_STATES``)."""
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[1]:
            continue
        local_port = fields[1].rsplit(":", 1)[1]
        try:
            number = int(local_port, 16)
        except ValueError:
            continue
        if number == port and fields[3].upper() in HELD_STATES:
            return True
    return False


def wait_monitor_released(read_sockets: Callable[[], str], port: int, within_s: float) -> None:
    """Wait until the guest's monitor in L1 has let memqual's closed
    connection go: no socket at ``port`` (its port in L1) that its QEMU
    still holds, as ``read_sockets`` (L1's /proc/net/tcp and tcp6) tells.
    Before L1 is saved: a connection held in the saved state would hold
    the one-client monitor in every restore."""

    def released() -> bool:
        return not monitor_held(read_sockets(), port)

    # 100 ms: the poll period of a read over SSH to L1, not a wait for an event
    poll(released, within_s, 0.1, what="the guest's monitor in L1 letting memqual's connection go")


def connect_monitor(sock: socket.socket) -> QEMUMonitorProtocol:
    monitor = QEMUMonitorProtocol(sock)
    monitor.connect(negotiate=True)
    return monitor

"""The host's share of a balloon move on a host under test: the CPU of the
guest QEMU's threads in L1 between two readings of L1's /proc (schedstat
ns; user, system and guest ticks), sorted by thread kind (vCPU or not),
and the seed's parts as shares of the driver's span.  Why per thread,
and what each kind holds: docs/balloon.md, "The host's share on a host
under test"."""

from __future__ import annotations

import dataclasses

from memqual.host.core.errors import GuestError
from memqual.host.core.shell import Shell

# /proc's clock_t: USER_HZ is 100 on every x86-64 Linux (the ABI fixes it).
USER_HZ = 100
READ_TIMEOUT_S = 30.0
# One line a thread of process $1: its stat, "|", its schedstat.  The pid
# is an argument, never part of the script.
_THREADS = (
    'cd /proc/"$1"/task || exit 1; for t in *; do '
    'read -r s <"$t/stat" && read -r r <"$t/schedstat" && echo "$s|$r"; done'
)


@dataclasses.dataclass(frozen=True)
class ThreadTimes:
    """One thread's CPU so far: ticks by kind, and run time in ns."""

    tid: int
    comm: str
    user_ticks: int  # guest time included (the kernel adds it to both)
    system_ticks: int
    guest_ticks: int
    run_ns: int
    vcpu: bool = False  # a vCPU's thread (QMP's query-cpus-fast names them)


def parse_thread(line: str) -> ThreadTimes:
    """One line of ``_THREADS``: ``/proc/PID/task/TID/stat|schedstat``.
    The name may hold spaces and parentheses ("CPU 0/KVM"): it ends at the
    last ")"."""
    stat, sep, sched = line.partition("|")
    head, paren, rest = stat.rpartition(")")
    tid, _, comm = head.partition(" (")
    fields = rest.split()
    if not (sep and paren and tid.strip().isdigit() and len(fields) >= 41 and sched.split()):
        raise GuestError(f"not a thread's stat and schedstat: {line[:200]!r}")
    try:
        # rest starts at field 3 (state): utime is 14, stime 15, guest_time 43.
        return ThreadTimes(int(tid), comm, int(fields[11]), int(fields[12]), int(fields[40]), int(sched.split()[0]))
    except ValueError as exc:
        raise GuestError(f"not a thread's stat and schedstat: {line[:200]!r}") from exc


@dataclasses.dataclass(frozen=True)
class HostWork:
    """What the host spent between two readings, in seconds of L1's clock."""

    loop_run_s: float  # QEMU's threads other than vCPUs (schedstat)
    loop_user_s: float  # ... in user space (the virtqueue handler, with ioeventfd on)
    loop_system_s: float  # ... in L1's kernel (its madvise, with ioeventfd on)
    kvm_s: float  # vCPU threads in L1's kernel: KVM's exits and faults, madvise with ioeventfd off
    vcpu_user_s: float  # vCPU threads in QEMU's user space, guest time excluded
    guest_s: float  # vCPU threads running the guest

    @property
    def host_s(self) -> float:
        """The host's work: QEMU's loop, KVM, QEMU's exit handling."""
        return self.loop_run_s + self.kvm_s + self.vcpu_user_s

    def breakdown(self, span_s: float, alloc_s: float, wait_s: float) -> dict[str, float]:
        """The seed's parts as shares (%) of the driver's span, as far as
        the clocks tell them apart.

        - allocating: the driver's own count, the guest's view: it holds
          L1's work faulting in the pages the guest touches as it
          allocates (a guest zeroes them with init_on_alloc);
        - handler and translation: QEMU in user space, any thread (the
          virtqueue handler runs in the vCPU's thread with ioeventfd off,
          memqual's setting on icount, else in the main loop); address
          translation is code inside the handler, not told apart from the
          rest of it without a profiler in L1;
        - madvise and the kick: the driver's wait less QEMU's user time:
          L1's kernel for the kick's exit, the madvise of every page and
          the ack's interrupt, one thread's kernel time, so not told apart
          here (the fit over request sizes splits them: per request the
          kick, per page the madvise);
        - host kernel, guest, host: the threads' totals, for the reader."""
        span = span_s or 1.0
        qemu_user = self.loop_user_s + self.vcpu_user_s
        return {
            "allocating_pct": 100.0 * alloc_s / span,
            "handler_and_translation_pct": 100.0 * qemu_user / span,
            "madvise_and_kick_pct": 100.0 * max(wait_s - qemu_user, 0.0) / span,
            "host_kernel_pct": 100.0 * (self.loop_system_s + self.kvm_s) / span,
            "guest_pct": 100.0 * self.guest_s / span,
            "host_pct": 100.0 * self.host_s / span,
        }


@dataclasses.dataclass(frozen=True)
class Reading:
    threads: tuple[ThreadTimes, ...]

    def minus(self, before: Reading) -> HostWork:
        """The work between ``before`` and this reading.  A thread that
        started in between counts from zero; one that ended is lost (QEMU's
        threads live as long as the guest, its short-lived workers aside)."""
        old = {t.tid: t for t in before.threads}
        zero = ThreadTimes(0, "", 0, 0, 0, 0)
        sums = dict.fromkeys(("loop_run", "loop_user", "loop_sys", "vcpu_user", "vcpu_sys", "guest"), 0)
        for t in self.threads:
            b = old.get(t.tid, zero)
            if t.vcpu:
                guest = t.guest_ticks - b.guest_ticks
                sums["guest"] += guest
                sums["vcpu_user"] += t.user_ticks - b.user_ticks - guest
                sums["vcpu_sys"] += t.system_ticks - b.system_ticks
            else:
                sums["loop_run"] += t.run_ns - b.run_ns
                sums["loop_user"] += t.user_ticks - b.user_ticks
                sums["loop_sys"] += t.system_ticks - b.system_ticks
        return HostWork(
            loop_run_s=sums["loop_run"] / 1e9,
            loop_user_s=sums["loop_user"] / USER_HZ,
            loop_system_s=sums["loop_sys"] / USER_HZ,
            kvm_s=sums["vcpu_sys"] / USER_HZ,
            vcpu_user_s=max(sums["vcpu_user"], 0) / USER_HZ,
            guest_s=sums["guest"] / USER_HZ,
        )

    @property
    def run_s(self) -> float:
        """Every thread's run time: QEMU's CPU seconds on L1's clock."""
        return sum(t.run_ns for t in self.threads) / 1e9


def parse_reading(text: str, vcpus: frozenset[int]) -> Reading:
    """The threads of one reading, those in ``vcpus`` marked as vCPUs.
    QEMU names its threads only with ``-name debug-threads=on``, so the
    vCPUs are known by their ids, not their names."""
    threads = tuple(parse_thread(line) for line in text.splitlines() if line.strip())
    threads = tuple(dataclasses.replace(t, vcpu=t.tid in vcpus) for t in threads)
    if not vcpus or not vcpus <= {t.tid for t in threads}:
        shown = sorted(t.tid for t in threads)
        raise GuestError(f"the host under test's QEMU has threads {shown}, not every vCPU of {sorted(vcpus)}")
    return Reading(threads)


@dataclasses.dataclass(frozen=True)
class QemuThreads:
    """The guest's QEMU in L1 (``pid``), read over L1's shell; ``vcpus``
    its vCPU threads' ids (QMP's query-cpus-fast ``thread-id``)."""

    shell: Shell
    pid: int
    vcpus: frozenset[int]

    def read(self) -> Reading:
        out = self.shell.run(["sh", "-c", _THREADS, "threads", str(int(self.pid))], timeout=READ_TIMEOUT_S, check=False)
        if out.status != 0:
            raise GuestError(f"the host under test's QEMU (pid {self.pid}) is gone: {out.stderr.strip()[:200]}")
        return parse_reading(out.stdout, self.vcpus)

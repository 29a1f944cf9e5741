"""KSM of the host under test (L1, host/core/nested.py): the knobs,
counters and waits of ``KsmController`` read and written in L1 over its
SSH, for the same scenario procedures (merge.py, volatile.py).

No lock, no snapshot (L1 ends with its guest); each reading one command
in L1 (counters, ksmd's CPU, L1's clock), the readings of a window taken
in L1 at its scan ends; ``process(pid)`` answers for L1's one guest QEMU;
deadlines stretched by ``slowdown`` (L1 runs under TCG).  Why:
docs/host-under-test.md, "KSM on L1's ksmd".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

from memqual.host.core.errors import CapabilityMissing, GuestError, Timeout
from memqual.host.core.knobs import KNOB_NAME, selected
from memqual.host.core.l1_marks import AWAIT_MARK, EXITS, KEEP_UNTIL_END, MARK_WAIT_S, cancel_mark, parse_mark
from memqual.host.core.nested import BOOT_TIMEOUT_FACTOR
from memqual.host.core.polling import poll
from memqual.host.core.qemu import L1_MARK_FIFO
from memqual.host.core.shell import Shell
from memqual.host.ksm import procfs
from memqual.host.ksm.schedule import AnonHuge, AwaitMark, Mark, Now, Outcome, OwnPages, ScanEnds, Schedule, SetKnob
from memqual.host.ksm.sysfs import COUNTERS, KsmCounters, write_order

KSM_DIR = "/sys/kernel/mm/ksm"
THP_DIR = "/sys/kernel/mm/transparent_hugepage"
MIN_POLL_S = 0.25
COMMAND_TIMEOUT_S = 60.0

# The pids of L1's processes whose comm starts with $1 (a constant of
# this module, passed as an argument: no input reaches a shell string).
_FIND = (
    'for d in /proc/[0-9]*; do read -r c <"$d/comm" 2>/dev/null && case "$c" in "$1"*) echo "${d#/proc/}";; esac; done'
)
# One reading: every counter L1's kernel has, ksmd's CPU (ns) and its
# times on a CPU (schedstat's first and third fields), L1's interrupts
# (/proc/stat's intr, read by the shell: no fork), L1's clock.


def _reading(files: str) -> str:
    """The shell of one reading, its counter files' names in ``files``."""
    return (
        f'for f in {files}; do [ -r "$f" ] && echo "$f $(cat "$f")"; done; '
        "cpu_ns= slices=; read -r cpu_ns wait_ns slices 2>/dev/null </proc/$KSMD/schedstat; "
        'echo "ksmd_cpu_ns $cpu_ns"; echo "ksmd_slices $slices"; '
        'while read -r key total rest; do [ "$key" = intr ] && echo "interrupts $total" && break; done </proc/stat; '
        'echo "uptime $(cut -d" " -f1 /proc/uptime)"'
    )


_READ = _reading('"$@"')
_COUNTERS = 'cd "$1" && shift 2 && ' + _READ
# Readings at the ends of full scans, taken in L1: the first once
# full_scans has grown by $2 from now, then one at each of the next $3 - 1
# scan ends, each followed by a line "==".  ksmd sleeps sleep_millisecs
# after every batch and a full scan ends at a batch's end, so a 2 ms poll
# in L1 reads the counters in that sleep, where ksmd's CPU and its page
# counts stand still: a window is whole scans, the same ones on every
# boot, and no scan ends unseen between two readings.  Polls from this
# machine over SSH would land anywhere in the next scan, at moments this
# machine's load decides.  ``read`` is the shell's own: no fork a poll.
_SCAN_ENDS = (
    'cd "$1" && read -r n <full_scans && target=$((n + $2)) && count=$3 && shift 4 && '
    'while [ "$count" -gt 0 ]; do '
    'while read -r n <full_scans && [ "$n" -lt "$target" ]; do usleep 2000; done; '
    + _READ
    + "; echo ==; target=$((n + 1)); count=$((count - 1)); done"
)
# L1's own deadline for a wait, beyond the one this machine keeps: a wait
# this machine gave up on must not go on polling in L1.
L1_DEADLINE_SLACK_S = 30.0

# A whole schedule (host/ksm/schedule.py) in L1, its steps as words:
# "set NAME VALUE", "scans N" (as _SCAN_ENDS from the next scan end),
# "own" (the guest QEMU's ksm_rmap_items), "mark" (host/core/l1_marks.py
# AWAIT_MARK: until the guest marks a moment), "huge" (the guest QEMU's
# AnonHugePages).  A knob is written by the shell's own echo, one
# write(), right after the reading before it, in ksmd's sleep at a scan
# end.  The counters' names come in $COUNTERS.  The mark's waiter holds
# none of the command's descriptors: SSH would wait for it to let go of
# stderr before it ended the command.
_SCHEDULE = (
    'cd "$1" && shift && while [ $# -gt 0 ]; do case "$1" in '
    'set) echo "$3" >"$2" || exit 3; shift 3;; '
    "scans) count=$2; shift 2; read -r n <full_scans; target=$((n + 1)); "
    'while [ "$count" -gt 0 ]; do '
    'while read -r n <full_scans && [ "$n" -lt "$target" ]; do usleep 2000; done; '
    + _reading("$COUNTERS")
    + "; echo ==; target=$((n + 1)); count=$((count - 1)); done;; "
    'own) r=; while read -r key value; do [ "$key" = ksm_rmap_items ] && r=$value; done 2>/dev/null '
    '</proc/"$QEMU"/ksm_stat; echo "own $r"; echo ==; shift;; '
    "mark) " + AWAIT_MARK + "shift;; "
    'huge) h=; while read -r key value unit; do [ "$key" = AnonHugePages: ] && h=$value; done '
    '</proc/"$QEMU"/smaps_rollup; echo "huge $h"; echo ==; shift;; '
    'now) read -r up rest </proc/uptime; echo "now $up"; echo ==; shift;; '
    "*) exit 4;; esac; done"
)
_WORDS: dict[type, str] = {OwnPages: "own", AwaitMark: "mark", AnonHuge: "huge", Now: "now"}

# A process's KSM figures, sections split by a line "--".
_PROCESS = 'cd /proc/"$1" && cat ksm_merging_pages && echo -- && cat ksm_stat 2>/dev/null; echo --; cat smaps_rollup'


class L1Files:
    """A sysfs directory of L1: the ``KsmFiles`` the scenarios read, and
    the knob writes.  The names in it are listed once (a kernel's knobs do
    not come and go)."""

    def __init__(self, shell: Shell, root: str) -> None:
        self.shell = shell
        self.root = root
        listing = shell.run(["ls", "-1", root], timeout=COMMAND_TIMEOUT_S, check=False)
        self.names = frozenset(listing.stdout.split()) if listing.status == 0 else frozenset()

    def exists(self) -> bool:
        return bool(self.names)

    def has(self, name: str) -> bool:
        return name in self.names

    def read(self, name: str) -> str:
        return selected(self.shell.run(["cat", self._path(name)], timeout=COMMAND_TIMEOUT_S).stdout)

    def read_int(self, name: str) -> int:
        return int(self.read(name))

    def read_int_or_none(self, name: str) -> int | None:
        return self.read_int(name) if self.has(name) else None

    def write(self, name: str, value: int | str) -> None:
        # tee writes what it reads in one write(): what sysfs wants.
        self.shell.run(["tee", self._path(name)], timeout=COMMAND_TIMEOUT_S, input=f"{value}\n".encode())

    def knobs(self, names: tuple[str, ...] | list[str] | None = None) -> dict[str, str]:
        chosen = sorted(self.names) if names is None else [n for n in names if n in self.names]
        return {n: self.read(n) for n in chosen}

    def _path(self, name: str) -> str:
        if not KNOB_NAME.fullmatch(name):
            raise ValueError(f"not a sysfs attribute name: {name!r}")
        return f"{self.root}/{name}"


class L1Ksm:
    """L1's KSM as the scenarios drive it (the ``KsmHost`` Protocol)."""

    def __init__(
        self,
        shell: Shell,
        guest_pid: int,
        qemu_pid: int,
        ksmd_pid: int | None,
        slowdown: float,
        ksm_dir: str = KSM_DIR,
        thp_dir: str = THP_DIR,
        mark_fifo: str = L1_MARK_FIFO,
        mark_wait_s: float = MARK_WAIT_S,
    ) -> None:
        self.shell = shell
        self.mark_fifo = mark_fifo
        self.mark_wait_s = mark_wait_s
        self.guest_pid = guest_pid
        self.qemu_pid = qemu_pid
        self.ksmd_pid = ksmd_pid
        self.slowdown = slowdown
        self._fs = L1Files(shell, ksm_dir)
        self.thp = L1Files(shell, thp_dir)

    @classmethod
    def of(cls, shell: Shell, guest_pid: int, slowdown: float = BOOT_TIMEOUT_FACTOR) -> Self:
        """L1's KSM for the guest whose L1 QEMU has ``guest_pid`` here;
        GuestError unless L1 runs exactly one guest QEMU."""
        qemus = find(shell, "qemu-system")
        if len(qemus) != 1:
            raise GuestError(f"the host under test runs {len(qemus)} guest QEMUs ({qemus}), not one")
        ksmd = find(shell, "ksmd")
        return cls(shell, guest_pid, qemus[0], ksmd[0] if ksmd else None, slowdown)

    @property
    def fs(self) -> L1Files:
        return self._fs

    def set(self, **knobs: int | str) -> None:
        """Write KSM knobs in the order KsmController does (advisor_mode
        first, run last)."""
        unknown = [n for n in knobs if not self._fs.has(n)]
        if unknown:
            raise CapabilityMissing(f"the host under test's KSM has no knob {', '.join(unknown)} in {self._fs.root}")
        for name in write_order(list(knobs)):
            self._fs.write(name, knobs[name])

    def set_thp(self, **knobs: str) -> None:
        for name, value in knobs.items():
            self.thp.write(name, value)

    def unmerge(self) -> None:
        self.set(run=2)

    def knobs(self) -> dict[str, str]:
        return self._fs.knobs()

    def counters(self) -> KsmCounters:
        argv = ["env", f"KSMD={self.ksmd_pid or 0}", "sh", "-c", _COUNTERS, "counters", self._fs.root, "--", *COUNTERS]
        return parse_counters(self.shell.run(argv, timeout=COMMAND_TIMEOUT_S).stdout)

    def process(self, pid: int) -> procfs.ProcessKsm:
        if pid != self.guest_pid:
            raise ValueError(f"pid {pid} is not the guest's ({self.guest_pid}): L1 runs only that guest's QEMU")
        out = self.shell.run(["sh", "-c", _PROCESS, "process", str(self.qemu_pid)], timeout=COMMAND_TIMEOUT_S)
        return parse_process(self.qemu_pid, out.stdout)

    def wait_full_scans(self, n: int, timeout_s: float, poll_s: float = MIN_POLL_S) -> KsmCounters:
        """Wait until full_scans has grown by n (in L1: ``_SCAN_ENDS``);
        Timeout if it does not within timeout_s (stretched by slowdown).
        ``poll_s`` is for a poll from this machine: L1 polls itself."""
        return self._scan_ends(n, 1, timeout_s)[0]

    def scan_end_readings(self, scans: int, timeout_s: float) -> list[KsmCounters]:
        """One reading at each of the next ``scans`` full-scan ends, all
        taken in L1 by one command; ``timeout_s`` is per scan."""
        return self._scan_ends(1, scans, timeout_s)

    def _scan_ends(self, first: int, count: int, timeout_s: float) -> list[KsmCounters]:
        deadline = timeout_s * self.slowdown * (first + count - 1)
        argv = [
            "env",
            f"KSMD={self.ksmd_pid or 0}",
            "timeout",
            "-s",
            "KILL",
            str(int(deadline) + 1),
            "sh",
            "-c",
            _SCAN_ENDS,
            "scan-ends",
            self._fs.root,
            str(first),
            str(count),
            "--",
            *COUNTERS,
        ]
        out = self.shell.run(argv, timeout=deadline + L1_DEADLINE_SLACK_S, check=False)
        # A reading cut short by the deadline has no "==" after it: left out.
        readings = [parse_counters(part) for part in out.stdout.split("==\n")[:-1]]
        if out.status == 0 and len(readings) == count:
            return readings
        end = self.counters()
        seen = f"{len(readings)} of {count} scan ends seen"
        raise Timeout(
            f"the host under test's KSM: {seen} in {deadline:.0f} s (its wait in L1 exited {out.status}); "
            f"now full_scans {end.full_scans}, pages_sharing {end.pages_sharing}, "
            f"ksmd's CPU {end.ksmd_cpu_s} s of L1's {end.taken_s:.1f} s"
        )

    def run_schedule(self, schedule: Schedule, timeout_s: float, knobs: tuple[str, ...] = ()) -> Outcome:
        """Every step of ``schedule`` in L1 by one command (``_SCHEDULE``);
        ``timeout_s`` a full scan, stretched by ``slowdown``; ``knobs``
        read beside the counters at each scan end (``KsmCounters.knobs``).
        Timeout when L1's deadline cut it short, with what it had read."""
        for name in knobs:
            if not KNOB_NAME.fullmatch(name) or not self._fs.has(name):
                raise CapabilityMissing(f"the host under test's KSM has no knob {name} in {self._fs.root}")
        words: list[str] = []
        for step in schedule.steps:
            if isinstance(step, SetKnob):
                if not self._fs.has(step.name):
                    raise CapabilityMissing(f"the host under test's KSM has no knob {step.name} in {self._fs.root}")
                words += ["set", step.name, str(step.value)]
            elif isinstance(step, ScanEnds):
                words += ["scans", str(step.count)]
            else:
                words.append(_WORDS[type(step)])
        deadline = timeout_s * self.slowdown * schedule.scans
        argv = [
            "env",
            f"KSMD={self.ksmd_pid or 0}",
            f"QEMU={self.qemu_pid}",
            f"COUNTERS={' '.join((*COUNTERS, *knobs))}",
            f"MARK={self.mark_fifo}",
            f"MARK_WAIT={int(self.mark_wait_s)}",
            "sh",
            "-c",
            KEEP_UNTIL_END,
            "keep-until-end",
            str(int(deadline) + 1),
            _SCHEDULE,
            self._fs.root,
            *words,
        ]
        out = self.shell.run(argv, timeout=deadline + L1_DEADLINE_SLACK_S, check=False)
        parts = out.stdout.split("==\n")[:-1]
        scan_ends: list[tuple[KsmCounters, ...]] = []
        own: list[int | None] = []
        marks: list[Mark] = []
        huge: list[int | None] = []
        now: list[float] = []
        at = 0
        for step in schedule.steps:
            if isinstance(step, ScanEnds):
                scan_ends.append(tuple(parse_counters(p, knobs) for p in parts[at : at + step.count]))
                at += step.count
            elif isinstance(step, SetKnob) or at >= len(parts):
                continue
            elif isinstance(step, OwnPages):
                own.append(parse_count("own", parts[at]))
                at += 1
            elif isinstance(step, AwaitMark):
                marks.append(parse_mark(parts[at]))
                at += 1
            elif isinstance(step, Now):
                now.append(parse_now(parts[at]))
                at += 1
            else:
                huge.append(parse_count("huge", parts[at]))
                at += 1
        outcome = Outcome(tuple(scan_ends), tuple(own), tuple(marks), tuple(huge), tuple(now))
        try:
            if out.status != 0:
                raise ValueError(f"exited {out.status}: {EXITS.get(out.status, 'failed')}")
            outcome.check(schedule)
        except ValueError as exc:
            seen = sum(len(r) for r in scan_ends)
            end = self.counters()
            raise Timeout(
                f"the host under test's KSM: a schedule of {schedule.scans} scans saw {seen} scan ends in "
                f"{deadline:.0f} s ({exc}; {out.stderr.strip()[:200] or 'no output on stderr'}); now full_scans "
                f"{end.full_scans}, ksmd's CPU {end.ksmd_cpu_s} s of L1's {end.taken_s:.1f} s"
            ) from exc
        return outcome

    def cancel_mark(self) -> None:
        """End a schedule's wait for the guest's mark (it exits, and
        ``run_schedule`` raises): the guest will not mark, its agent failed."""
        cancel_mark(self.shell, self.mark_fifo)

    def wait_until(
        self, predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = MIN_POLL_S
    ) -> None:
        poll(predicate, timeout_s * self.slowdown, max(poll_s, MIN_POLL_S), what=f"the host under test's KSM: {what}")


def find(shell: Shell, comm_prefix: str) -> list[int]:
    """The pids of L1's processes whose name starts with ``comm_prefix``."""
    out = shell.run(["sh", "-c", _FIND, "find", comm_prefix], timeout=COMMAND_TIMEOUT_S, check=False).stdout
    return sorted(int(word) for word in out.split() if word.isdigit())


def parse_counters(text: str, knobs: tuple[str, ...] = ()) -> KsmCounters:
    """One reading of ``_COUNTERS``'s output; a counter L1's kernel lacks is
    None (ksmd's CPU too, without schedstat); ``knobs`` read beside them
    into ``KsmCounters.knobs``."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        values[name] = value.strip()

    def number(name: str) -> int | None:
        value = values.get(name, "")
        return int(value) if value.lstrip("-").isdigit() else None

    if "uptime" not in values or number("full_scans") is None:
        raise GuestError(f"not a reading of the host under test's KSM: {text[:200]!r}")
    cpu_ns = number("ksmd_cpu_ns")
    return KsmCounters(
        taken_s=float(values["uptime"]),
        full_scans=number("full_scans") or 0,
        pages_shared=number("pages_shared") or 0,
        pages_sharing=number("pages_sharing") or 0,
        pages_unshared=number("pages_unshared") or 0,
        pages_volatile=number("pages_volatile") or 0,
        pages_skipped=number("pages_skipped"),
        pages_scanned=number("pages_scanned"),
        general_profit=number("general_profit"),
        ksmd_cpu_s=cpu_ns / 1e9 if cpu_ns is not None else None,
        ksmd_slices=number("ksmd_slices"),
        interrupts=number("interrupts"),
        knobs=tuple((name, found) for name in knobs if (found := number(name)) is not None),
    )


def parse_now(text: str) -> float:
    """A ``now`` step's line: L1's /proc/uptime."""
    name, _, value = text.strip().partition(" ")
    try:
        if name != "now":
            raise ValueError
        return float(value)
    except ValueError:
        raise GuestError(f"not a now line of the host under test: {text[:200]!r}") from None


def parse_count(word: str, text: str) -> int | None:
    """An ``own`` or ``huge`` step's line: the guest QEMU's ksm_rmap_items
    or AnonHugePages, None where L1's kernel has no such file."""
    name, _, value = text.strip().partition(" ")
    if name != word:
        raise GuestError(f"not a {word} line of the guest's QEMU: {text[:200]!r}")
    return int(value) if value.isdigit() else None


def parse_process(pid: int, text: str) -> procfs.ProcessKsm:
    """``_PROCESS``'s output: ksm_merging_pages, ksm_stat, smaps_rollup."""
    parts = text.split("--\n")
    if len(parts) != 3 or not parts[0].strip().isdigit():
        raise GuestError(f"not the KSM figures of L1's process {pid}: {text[:200]!r}")
    return procfs.ProcessKsm(
        pid=pid,
        merging_pages=int(parts[0]),
        stat=procfs.parse_ksm_stat(parts[1]),
        anon_huge_kib=procfs.parse_anon_huge_kib(parts[2]),
    )

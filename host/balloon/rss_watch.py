"""A process's RSS watched inside a host under test (L1), on L1's clock:
what free page reporting gives back, timed where it happens, and the CPU
the process spent on each pass.  One constant shell script (``WATCH``), run
over L1's SSH with its inputs as argv, polls the guest QEMU's VmRSS and its
threads' run time every few ms, stamps each reading with L1's /proc/uptime
and ends itself at a target or a deadline on L1's clock; ``Watch`` reads
its output (the start event, the end, the passes and their work).  Why in
L1, and from which event: docs/host-under-test.md, "Free page reporting
on L1's clock"."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from memqual.host.core.errors import GuestError, Timeout
from memqual.host.core.nested import BOOT_TIMEOUT_FACTOR
from memqual.host.core.shell import Shell

POLL_US = 2000  # L1's RSS every 2 ms of L1's clock (KSM's scan ends are polled so too)
# A reading is kept (printed) when the RSS moved by this much since the last
# kept one, besides the first at or below the start and the end: reporting
# hands pages over in 2 MiB blocks, and a bound on the lines keeps the
# script's string work small however the RSS jitters.
STEP_KIB = 1024
UPTIME_RESOLUTION_S = 0.01  # /proc/uptime has centiseconds
# Kept readings closer than this are one pass of the guest's reporting: a
# pass hands its pages over within tens of ms of L1's clock, and the next
# comes 2 s later (the guest's reporting delay; each pass reports about a
# sixteenth of each free list, mm/page_reporting.c's budget).
PASS_GAP_S = 0.5
# This machine's wait for the script, beyond L1's own deadline: L1 runs
# under TCG, so an L1 second can take several of this machine's.
WALL_SLACK_S = 60.0
READY_TIMEOUT_S = 120.0  # for its first reading: one SSH connection and one read in L1

# $1 pid, $2 start KiB, $3 target KiB, $4 deadline (L1 centiseconds from the
# first reading), $5 step KiB, $6 poll period (us).  Prints "ready CS KIB
# NS" at once, then, at its end, the kept readings "CS KIB PREVIOUS_CS NS
# PREVIOUS_NS" (the poll before it, for the resolution and the work) and
# "end met|deadline CS KIB POLLS NS"; "gone CS" when the process went.  NS
# is the run time of all the process's threads so far (schedstat's first
# field, ns of L1's clock), read by the shell's own `read`: no fork a poll.
# The kept readings are printed at the end, not as they come: each line
# sent is L1's work inside the timed span.  /proc/uptime always has two
# decimals: "1" before them keeps a leading 0 from reading as octal.
WATCH = (
    "pid=$1 start=$2 target=$3 limit=$4 step=$5 period=$6; "
    "tick() { read -r up rest </proc/uptime; now=$((${up%.*} * 100 + 1${up#*.} - 100)); }; "
    'kib() { rss=; while read -r key value unit; do [ "$key" = VmRSS: ] && rss=$value && break; done '
    '<"/proc/$pid/status"; } 2>/dev/null; '
    'cpu() { ns=0; for f in /proc/"$pid"/task/*/schedstat; do read -r run rest <"$f" && ns=$((ns + run)); done; } '
    "2>/dev/null; "
    'tick; kib; cpu; [ -n "$rss" ] || { echo "gone $now"; exit 3; }; '
    'echo "ready $now $rss $ns"; '
    "end=$((now + limit)) polls=1 last=$rss started= out=; "
    '[ "$rss" -le "$start" ] && started=1; '
    "while :; do "
    'if [ "$rss" -le "$target" ]; then how=met; break; fi; '
    'if [ "$now" -ge "$end" ]; then how=deadline; break; fi; '
    'usleep "$period"; was=$now wasns=$ns; tick; kib; cpu; '
    '[ -n "$rss" ] || { printf "$out"; echo "gone $now"; exit 3; }; '
    "polls=$((polls + 1)) keep=; "
    'if [ -z "$started" ] && [ "$rss" -le "$start" ]; then started=1 keep=1; '
    'elif [ "$rss" -le "$target" ] || [ $((rss - last)) -ge "$step" ] || [ $((last - rss)) -ge "$step" ]; '
    "then keep=1; fi; "
    'if [ -n "$keep" ]; then out="$out$now $rss $was $ns $wasns\n" last=$rss; fi; '
    "done; "
    'printf "$out"; echo "end $how $now $rss $polls $ns"'
)
# L1's own backstop (busybox timeout, on L1's clock) beyond the script's
# deadline: a script this machine gave up on must not poll on in L1.
L1_BACKSTOP_S = 30


@dataclasses.dataclass(frozen=True)
class Reading:
    """One kept reading: L1's uptime, the RSS, and the uptime of the poll
    before it (which still showed the RSS before the change); the
    process's run time so far at each (ns of L1's clock)."""

    uptime_s: float
    kib: int
    previous_s: float
    cpu_ns: int = 0
    previous_cpu_ns: int = 0

    @property
    def gap_s(self) -> float:
        """When it happened, within: the poll before to this one."""
        return self.uptime_s - self.previous_s


@dataclasses.dataclass(frozen=True)
class Watch:
    """What the script saw: its first reading, the kept ones after it, how
    it ended (``met``: at or below the target; else its deadline), its last
    reading and its polls; with the thresholds it was given."""

    first: Reading
    readings: tuple[Reading, ...]
    met: bool
    last: Reading
    polls: int
    start_kib: int
    target_kib: int

    @property
    def start(self) -> Reading | None:
        """The start event: the first reading at or below ``start_kib``,
        the RSS's first fall below the held peak as L1 sees it (free page
        reporting's first pages back in the host).  None when it never
        fell, or had already fallen at the first reading (a start the
        watcher did not see is no start)."""
        if self.first.kib <= self.start_kib:
            return None
        return next((r for r in self.readings if r.kib <= self.start_kib), None)

    @property
    def return_s(self) -> float | None:
        """L1 seconds from the start to the target, when both were seen."""
        start = self.start
        # centiseconds, as L1's uptime counts them
        return round(self.last.uptime_s - start.uptime_s, 2) if start is not None and self.met else None

    @property
    def watched_s(self) -> float:
        """L1 seconds the script watched: from its first reading to its last."""
        return round(self.last.uptime_s - self.first.uptime_s, 2)

    def _groups(self) -> list[list[Reading]]:
        groups: list[list[Reading]] = []
        for reading in self.readings:
            if groups and reading.uptime_s - groups[-1][-1].uptime_s <= PASS_GAP_S:
                groups[-1].append(reading)
            else:
                groups.append([reading])
        return groups

    def passes(self) -> list[tuple[float, int]]:
        """The kept readings grouped into the guest's reporting passes: each
        pass's first reading (L1 seconds from the watcher's first) and the
        KiB the RSS fell over the pass."""
        return [(p.at_s, p.fallen_kib) for p in self.pass_work]

    @functools.cached_property
    def pass_work(self) -> tuple[PassWork, ...]:
        """Each pass with the process's run time over it: from the poll
        before its first fall to its last kept reading.  Between passes
        the guest idles, so what QEMU's threads ran in that span is the
        pass: the guest's reporting and the host's handling of it."""
        found, before = [], self.first.kib
        for group in self._groups():
            at_s = round(group[0].uptime_s - self.first.uptime_s, 2)
            cpu_ns = group[-1].cpu_ns - group[0].previous_cpu_ns
            found.append(PassWork(at_s, before - group[-1].kib, cpu_ns))
            before = group[-1].kib
        return tuple(found)

    @property
    def cpu_ns_per_mib(self) -> float | None:
        """The process's run time over the passes per MiB they gave back
        (None when nothing fell, or a pass's run time came out negative): a
        pass the watcher's end cut short counts what it had given back by
        then."""
        passes = [p for p in self.pass_work if p.fallen_kib > 0]
        fallen = sum(p.fallen_kib for p in passes)
        if fallen <= 0 or any(p.cpu_ns < 0 for p in self.pass_work):
            return None
        return sum(p.cpu_ns for p in passes) * 1024 / fallen

    def timeline(self) -> list[tuple[float, int]]:
        """The kept readings as (L1 seconds from the first, KiB), the first included."""
        return [(round(r.uptime_s - self.first.uptime_s, 2), r.kib) for r in (self.first, *self.readings)]

    @property
    def resolution_s(self) -> float:
        """How far each end of ``return_s`` may be from its event: the
        widest gap between a kept reading and the poll before, and
        /proc/uptime's own step."""
        ends = [r for r in (self.start, self.last if self.met else None) if r is not None]
        return max([UPTIME_RESOLUTION_S, *(r.gap_s for r in ends)])

    def problems(self) -> list[str]:
        """What makes ``return_s`` no measurement of reporting's return."""
        found = []
        if self.first.kib <= self.start_kib:
            found.append(f"the RSS was already down at the watcher's first reading ({self.first.kib} KiB)")
        elif self.start is None:
            found.append(f"the RSS never fell to {self.start_kib} KiB")
        if not self.met:
            found.append(f"the RSS was not down to {self.target_kib} KiB by L1's deadline")
        # The run time is summed over the threads alive at each poll: one
        # that ended inside a pass takes its time with it.
        short = [p.at_s for p in self.pass_work if p.cpu_ns < 0]
        if short:
            found.append(f"a pass's run time came out negative (a QEMU thread ended in it) at {short} L1 s")
        return found


@dataclasses.dataclass(frozen=True)
class PassWork:
    """One reporting pass: when it started (L1 seconds from the watcher's
    first reading), the KiB the RSS fell over it, and the process's run
    time over it (ns of L1's clock)."""

    at_s: float
    fallen_kib: int
    cpu_ns: int


def _centis(word: str) -> float:
    return int(word) / 100


def parse(text: str, start_kib: int, target_kib: int) -> Watch:
    """``WATCH``'s output; GuestError for anything else (the process gone,
    an output cut short)."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if any(words[0] == "gone" for words in lines):
        raise GuestError("the guest's QEMU in the host under test went while its RSS was watched")
    if len(lines) < 2 or lines[0][0] != "ready" or lines[-1][0] != "end":
        raise GuestError(f"not the output of L1's RSS watcher: {text[:200]!r}")
    try:
        ready, end = lines[0], lines[-1]
        if len(ready) != 4 or len(end) != 6 or end[1] not in ("met", "deadline"):
            raise ValueError
        ready_ns = int(ready[3])
        first = Reading(_centis(ready[1]), int(ready[2]), _centis(ready[1]), ready_ns, ready_ns)
        kept = []
        for words in lines[1:-1]:
            if len(words) != 5:
                raise ValueError
            kept.append(Reading(_centis(words[0]), int(words[1]), _centis(words[2]), int(words[3]), int(words[4])))
        end_s, end_kib, polls, end_ns = _centis(end[2]), int(end[3]), int(end[4]), int(end[5])
    except ValueError as exc:
        raise GuestError(f"not the output of L1's RSS watcher: {text[:200]!r}") from exc
    # The end is the last kept reading when it ended there; a deadline's
    # end may be a poll no line kept (the RSS did not move by a step).
    last = kept[-1] if kept and kept[-1].uptime_s == end_s else Reading(end_s, end_kib, end_s, end_ns, end_ns)
    return Watch(first, tuple(kept), end[1] == "met", last, polls, start_kib, target_kib)


def argv(pid: int, start_kib: int, target_kib: int, deadline_s: float) -> list[str]:
    """The command that watches process ``pid`` of L1 (the script, its
    inputs as arguments, under L1's own backstop)."""
    limit_cs = round(deadline_s * 100)
    backstop = int(deadline_s) + L1_BACKSTOP_S
    numbers = (pid, start_kib, target_kib, limit_cs, STEP_KIB, POLL_US)
    return ["timeout", "-s", "KILL", str(backstop), "sh", "-c", WATCH, "rss-watch", *map(str, numbers)]


def watch(
    shell: Shell,
    pid: int,
    start_kib: int,
    target_kib: int,
    deadline_s: float,
    free: Callable[[], None],
    slowdown: float = BOOT_TIMEOUT_FACTOR,
) -> Watch:
    """Watch L1's process ``pid`` while ``free`` is called: the script is
    polling (its first reading came back) before ``free`` runs, so nothing
    it sets off can come before the first reading.  ``deadline_s`` is on
    L1's clock, from the first reading; this machine waits that stretched
    by ``slowdown``, with slack."""
    running = shell.start(argv(pid, start_kib, target_kib, deadline_s))
    try:
        ready = next((line for line in running.lines(timeout=READY_TIMEOUT_S) if line.startswith("ready")), None)
        if ready is None:
            out = running.wait(10)
            raise GuestError(f"L1's RSS watcher ended before its first reading: {out.stdout[-300:]!r}")
        free()
        wall_s = deadline_s * slowdown + L1_BACKSTOP_S + WALL_SLACK_S
        try:
            out = running.wait(wall_s)
        except Timeout as exc:
            raise GuestError(f"L1's RSS watcher did not end within {wall_s:.0f} s of this machine's") from exc
        return parse(out.stdout, start_kib, target_kib)
    finally:
        running.kill()

"""Empty the guest's per-CPU free-page lists before a floor probe.

Why: free pages a CPU keeps on its per-CPU lists (pcp) are not in the
zone's free count, so once the zone sits on its min watermark the
balloon's allocations (__GFP_NORETRY) cannot have them.  The kernel drains
them only after direct reclaim made progress, and a memqual guest has
nothing to reclaim (its root is in RAM, no swap), so they stay stranded
and the floor includes them.  How many there are depends on which CPU
freed what before the probe, not on the kernel's steady state: measured
here (1 GiB guest, 2 vCPUs, TCG), at the floor sysrq-m showed 21-24 MiB on
the lists and the floors of three boots of 6.12 came out 145-149 MiB; after
cycling cpu1 offline and online (the CPU-dead callback returns its lists to
the buddy allocator) 9.5-10 MiB were left and six probes of the same three
boots gave 135.0-136.0 MiB.  6.12's lists grow more than 6.1's (their high
mark is tuned between the low watermark's share and an eighth of the zone
per CPU), which is why its floor scattered more.

Cycling a CPU is the drain a user can trigger without side effects that
last: the CPU is online again before the probe, and this module checks it.
The boot CPU has no ``online`` file and keeps its lists (the 9.5-10 MiB
left above), the same amount from probe to probe.
"""

from __future__ import annotations

import dataclasses
import re

from memqual.host.core.errors import GuestError
from memqual.host.core.shell import Shell

# One line per CPU that has an online file and was online: whether it went
# offline (so its lists were drained) and its state afterwards.
DRAIN_SCRIPT = r"""
for f in /sys/devices/system/cpu/cpu[0-9]*/online; do
  [ -e "$f" ] || continue
  [ "$(cat "$f")" = 1 ] || continue
  n=${f%/online}; n=${n##*/cpu}
  if echo 0 > "$f" 2>/dev/null; then off=1; else off=0; fi
  echo 1 > "$f" 2>/dev/null
  echo "percpu_drain cpu=$n offline=$off online=$(cat "$f")"
done
echo percpu_drain done
"""
LINE = re.compile(r"percpu_drain cpu=(\d+) offline=([01]) online=([01])")


@dataclasses.dataclass(frozen=True)
class Drain:
    """The CPUs whose per-CPU lists went back to the buddy allocator."""

    cpus: tuple[int, ...]


def parse_drain(stdout: str) -> Drain:
    """The script's report; GuestError if it did not finish, a CPU could
    not go offline (its lists stay stranded) or did not come back online."""
    lines = stdout.strip().splitlines()
    if not lines or lines[-1].strip() != "percpu_drain done":
        raise GuestError(f"per-CPU list drain did not finish: {stdout[-300:]!r}")
    cpus: list[int] = []
    for line in lines[:-1]:
        m = LINE.fullmatch(line.strip())
        if m is None:
            raise GuestError(f"per-CPU list drain: unexpected line {line!r}")
        cpu, offline, online = int(m.group(1)), m.group(2) == "1", m.group(3) == "1"
        if not online:
            raise GuestError(f"cpu{cpu} did not come back online after the per-CPU list drain")
        if not offline:
            raise GuestError(f"cpu{cpu} refused to go offline: its per-CPU free pages stay out of the balloon's reach")
        cpus.append(cpu)
    return Drain(tuple(cpus))


def drain_percpu_lists(shell: Shell, timeout: float = 60.0) -> Drain:
    """Cycle every hotpluggable online CPU of the guest (offline, online)."""
    return parse_drain(shell.run(["sh", "-c", DRAIN_SCRIPT], timeout=timeout).stdout)

"""Empty the guest's per-CPU free-page lists before a floor probe.

Free pages on a CPU's lists are not in the zone's free count, so the
balloon cannot take them at the floor, and how many there are depends on
which CPU freed what: cycling each non-boot CPU offline and online returns
them to the buddy allocator, and this module checks the CPU is back.  The
figures: docs/balloon.md, "Emptying the per-CPU lists".
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

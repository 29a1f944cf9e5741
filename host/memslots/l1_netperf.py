"""Seed 000's netperf on the host under test: TCP_RR over the guest's
emulated rtl8139 while L1 counts the host's memslot searches by kind.
Avi Kivity ranked the kinds by how often a working guest makes them (seed
002): with nested paging a RAM page is searched once and then served by
the hardware, while every access to an emulated device or to the xAPIC's
page misses every slot.  A page-touching window cannot show that order
(its guest uses x2APIC and virtio); this window is the 2011 guest's own
traffic.  docs/memslots-kvm.md, "Seed 000's netperf in the host under test".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memqual.host.core import clock as clocks
from memqual.host.core.environment import Environment
from memqual.host.core.errors import GuestError
from memqual.host.core.record import Measurement
from memqual.host.memslots import l1_faults, l1_kinds, lookup_kinds
from memqual.host.memslots.guest_layouts import SEED_000_GUEST

SCENARIO = "memslots.l1_netperf"
WORKLOAD = "tcp_rr"
AGENT = "tcp_rr"
# The NIC's own user network, apart from the suite's SSH network (10.0.2.0/24),
# with nothing reachable but an echo: QEMU's user network runs `cat` in L1
# for each connection to PEER:PORT (guestfwd), netperf's server in one word.
NET = "10.9.0.0/24"
GUEST_ADDRESS = "10.9.0.15/24"
PEER = "10.9.0.100"
PORT = 7
# A 2011 guest's APIC is the xAPIC (a page of MMIO: every EOI is a write
# there, a complete miss in the host); today's guests take x2APIC (MSRs,
# no search) when the CPU has it, as L1's emulated one does.
GUEST = dataclasses.replace(
    SEED_000_GUEST,
    nic_options=f"net={NET},guestfwd=tcp:{PEER}:{PORT}-cmd:cat",
    cmdline="nox2apic",
)
TRANSACTIONS = 1000
RUNS = 3
# A run's wall-clock bound on this machine's clock, before the guest's
# clock's and L1's stretch: a transaction is a few hundred microseconds.
RUN_BOUND_S = 30.0
SETTING = f"{AGENT} {PEER}:{PORT} {TRANSACTIONS} x {RUNS}, xAPIC"

# Bring the rtl8139 up on its own network: load its driver, find its
# interface by PCI id (the SSH NIC is eth0), keep IPv6's chatter off it, and
# wait for its carrier.  A constant: no input reaches it.
LINK_SCRIPT = f"""
modprobe 8139cp || exit 3
for i in $(seq 50); do
  for d in /sys/class/net/*; do
    [ "$(cat $d/device/vendor 2>/dev/null)" = 0x10ec ] && [ "$(cat $d/device/device 2>/dev/null)" = 0x8139 ] \
      && n=${{d##*/}} && break
  done
  [ -n "$n" ] && break
  sleep 0.1
done
[ -n "$n" ] || exit 4
echo 1 > /proc/sys/net/ipv6/conf/$n/disable_ipv6 2>/dev/null
ip addr add {GUEST_ADDRESS} dev $n && ip link set $n up || exit 5
for i in $(seq 100); do [ "$(cat /sys/class/net/$n/carrier 2>/dev/null)" = 1 ] && echo "$n" && exit 0; sleep 0.1; done
exit 6
"""
_IFACE = re.compile(r"[a-zA-Z0-9_.-]{1,15}")
_RUN = re.compile(r"event=run index=(\d+) transactions=(\d+) duration_s=([0-9.]+) us_per_transaction=([0-9.]+)")


@dataclass(frozen=True)
class NetperfBoot:
    """One boot of L1: the guest's TCP_RR runs and the searches L1
    counted over them."""

    structure: str
    conditions: str
    transactions: int  # a run
    seconds: tuple[float, ...]
    kinds: l1_kinds.KindCounts
    checks: tuple[l1_faults.SlotCheck, ...]

    @property
    def transactions_per_s(self) -> float:
        """netperf's TCP_RR figure, on the guest's clock."""
        return self.transactions * len(self.seconds) / sum(self.seconds)

    def per_transaction(self, kind: str) -> float:
        return self.kinds.count(kind) / (self.transactions * len(self.seconds))

    def findings(self) -> list[str]:
        return l1_faults.slot_findings(self.structure, self.checks)


def parse_runs(text: str, runs: int) -> tuple[int, tuple[float, ...]]:
    """tcp_rr's transactions a run and each run's seconds; GuestError
    unless it printed ``runs`` runs of one size and its end."""
    found = [(int(m.group(2)), float(m.group(3))) for m in _RUN.finditer(text)]
    if (
        len(found) != runs
        or "event=done" not in text
        or any(sec <= 0 for _n, sec in found)
        or len({n for n, _sec in found}) != 1
    ):
        raise GuestError(f"{AGENT} printed {len(found)} of {runs} runs: {text.strip()[-300:]!r}")
    return found[0][0], tuple(sec for _n, sec in found)


def link_up(vm: l1_faults.Guest, deadline: float) -> str:
    """The rtl8139's interface, up on NET; GuestError naming the step that
    failed otherwise."""
    proc = vm.ssh.run(["sh", "-c", LINK_SCRIPT], timeout=deadline, check=False)
    steps = {3: "load 8139cp", 4: "find the rtl8139's interface", 5: "address it", 6: "see its carrier"}
    name = str(proc.stdout).strip()
    if proc.status != 0 or not _IFACE.fullmatch(name):
        step = steps.get(proc.status, f"bring it up (exit {proc.status})")
        raise GuestError(f"the guest's rtl8139 did not come up: could not {step}: {str(proc.stderr).strip()[-200:]!r}")
    return name


def measure(vm: l1_faults.Guest, conditions: str, transactions: int = TRANSACTIONS, runs: int = RUNS) -> NetperfBoot:
    """Settle the guest, bring its rtl8139 up, reset L1's counts, run
    ``runs`` runs of ``transactions`` TCP_RR transactions, read L1's counts."""

    def deadline(seconds: float) -> float:
        return clocks.deadline_s(seconds, vm.clock)

    vm.ssh.run(["sh", "-c", f"sync; sleep {l1_faults.SETTLE_S}"], timeout=deadline(l1_faults.SETTLE_S + 60))
    ram = l1_kinds.system_ram(str(vm.ssh.run(["cat", "/proc/iomem"]).stdout))
    link_up(vm, deadline(60))
    path = vm.deploy(AGENT)
    vm.host_ssh.run(["sh", "-c", l1_kinds.RESET_SCRIPT])
    bound = deadline(RUN_BOUND_S * runs * max(1, transactions // TRANSACTIONS))
    out = str(vm.ssh.run([path, PEER, str(PORT), str(transactions), str(runs)], timeout=bound).stdout)
    reading = l1_kinds.parse_reading(str(vm.host_ssh.run(["sh", "-c", l1_kinds.READ_SCRIPT]).stdout))
    if not reading.search:
        raise GuestError("L1's kvm names no memslot_search: not a kernel built with images/kvm-memslots/")
    count, seconds = parse_runs(out, runs)
    kinds = l1_kinds.sort_kinds(reading, ram)
    return NetperfBoot(reading.search, conditions, count, seconds, kinds, l1_faults.slot_checks(reading))


def settings(transactions: int = TRANSACTIONS, runs: int = RUNS) -> dict[str, Any]:
    return {
        "guest": GUEST.name,
        **GUEST.settings(),
        "workload": f"{AGENT} {PEER}:{PORT} {transactions} x {runs}",
        "transactions": transactions,
        "runs": runs,
    }


def records(boots: Sequence[NetperfBoot], environment: Environment) -> list[Measurement]:
    """Per structure and conditions: ``tcp_rr_per_s`` (transactions a
    second, on the guest's clock), each kind's searches a transaction
    (counted), and memslots.l1_lookup_kinds' searches a second of each
    kind with ``workload`` tcp_rr, one replicate a boot."""
    groups: dict[tuple[str, str], list[NetperfBoot]] = {}
    for boot in boots:
        groups.setdefault((boot.structure, boot.conditions), []).append(boot)
    setting, env = settings(), environment.to_json()
    out = []
    for (structure, conditions), group in groups.items():
        variant = {"structure": structure, "conditions": conditions, "workload": WORKLOAD}
        where = l1_faults.Where(variant, setting, env)
        rates = [b.transactions_per_s for b in group]
        out.append(
            dataclasses.replace(
                where.record("tcp_rr_per_s", "1/s", "higher", rates, clock_reads=l1_faults.GUEST_CLOCK),
                scenario=SCENARIO,
            )
        )
        for kind in l1_kinds.KINDS:
            per = [b.per_transaction(kind) for b in group]
            rec = where.record(f"{kind}_per_transaction", "searches", "lower", per, counted_by="the kernel's counters")
            out.append(dataclasses.replace(rec, scenario=SCENARIO))
        counts = [lookup_kinds.Counts({k: b.kinds.count(k) for k in l1_kinds.KINDS}, sum(b.seconds)) for b in group]
        for rec in lookup_kinds.records(counts, {**setting, "accel": "kvm"}):
            if rec.variant["kind"] in l1_kinds.KINDS:
                out.append(
                    dataclasses.replace(
                        rec, scenario=l1_faults.KINDS_SCENARIO, variant={**rec.variant, **variant}, environment=env
                    )
                )
    return out


def to_json(boot: NetperfBoot) -> dict[str, Any]:
    return {
        "structure": boot.structure,
        "conditions": boot.conditions,
        "transactions": boot.transactions,
        "seconds": list(boot.seconds),
        "transactions_per_s": boot.transactions_per_s,
        "kinds": dataclasses.asdict(boot.kinds),
        "order": boot.kinds.order(),
        "slots": [dataclasses.asdict(c) for c in boot.checks],
        "findings": boot.findings(),
    }


def render(boots: Sequence[NetperfBoot], host: str, clock_label: str) -> list[str]:
    """One line a boot: TCP_RR transactions a second, each kind's searches
    a transaction and nodes a search, the order; then any slot whose
    count differs."""
    lines = [
        f"host: {host}, clock {clock_label}; guest {GUEST.name} (xAPIC), {SETTING}",
        f"{'boot':>4} {'search':9} {'TCP_RR/s':>9} {'misses/tr':>10} {'nodes':>6} {'RAM hits/tr':>12} {'nodes':>6} "
        f"{'other/tr':>9} {'nodes':>6}  order",
    ]
    for index, b in enumerate(boots, 1):
        shown = b.kinds.nodes_shown()
        lines.append(
            f"{index:>4} {b.structure:9} {b.transactions_per_s:>9.1f} {b.per_transaction('miss'):>10.3f} "
            f"{shown['miss']:>6} {b.per_transaction('ram_hit'):>12.4f} {shown['ram_hit']:>6} "
            f"{b.per_transaction('other_hit'):>9.4f} {shown['other_hit']:>6}  {' > '.join(b.kinds.order())}"
        )
        lines += [f"     differs: {finding}" for finding in b.findings()]
    return lines

"""host/memslots/l1_netperf.py: seed 000's TCP_RR over its rtl8139 on the
host under test, the searches L1 counts over it sorted by kind, records
that the priorities claim reads."""

from __future__ import annotations

from typing import Any

import pytest
from l1_counts import IOMEM, RAM, reading_text

from memqual.host.core import clock
from memqual.host.core.environment import Environment
from memqual.host.core.errors import GuestError
from memqual.host.memslots import l1_kinds, l1_netperf


def tcp_rr_output(runs: int = 3, transactions: int = 1000, seconds: float = 0.25) -> str:
    return (
        "event=connected address=10.9.0.100 port=7\n"
        + "".join(
            f"event=run index={i} transactions={transactions} duration_s={seconds:.9f} "
            f"us_per_transaction={seconds * 1e6 / transactions:.3f}\n"
            for i in range(runs)
        )
        + f"event=done runs={runs}\n"
    )


@pytest.mark.parametrize(
    ("text", "runs", "ok"),
    [
        (tcp_rr_output(), 3, True),
        (tcp_rr_output(runs=2), 3, False),  # a run short
        (tcp_rr_output().replace("event=done runs=3\n", ""), 3, False),  # ended early
        (tcp_rr_output().replace("duration_s=0.250000000", "duration_s=0.000000000", 1), 3, False),
        (tcp_rr_output().replace("transactions=1000 ", "transactions=999 ", 1), 3, False),  # runs of two sizes
        ("event=error reason=connect:Connection refused\n", 3, False),
    ],
)
def test_runs_parsed_or_refused(text: str, runs: int, ok: bool) -> None:
    if ok:
        assert l1_netperf.parse_runs(text, runs) == (1000, (0.25, 0.25, 0.25))
    else:
        with pytest.raises(GuestError, match="tcp_rr printed"):
            l1_netperf.parse_runs(text, runs)


class Result:
    def __init__(self, stdout: str, status: int = 0) -> None:
        self.stdout, self.stderr, self.status = stdout, "", status


class ScriptedShell:
    """Answers each command from a table (the first key found in it) and
    logs the commands."""

    def __init__(self, answers: dict[str, Result], log: list[str]) -> None:
        self.answers, self.log = answers, log

    def start(self, argv: list[str]) -> Any:
        raise AssertionError("nothing runs in the background")

    def run(self, argv: list[str], timeout: float = 60.0, check: bool = True, input: bytes | None = None) -> Any:
        assert timeout > 0
        self.log.append(" ".join(argv))
        key = next((k for k in self.answers if k in " ".join(argv)), None)
        return self.answers[key] if key else Result("")


class NetperfGuest:
    """L2 and L1 of one boot: the link script, tcp_rr's runs, L1's counts."""

    def __init__(self, slots: list[tuple[int, int, int, int, int]], misses: int, link: Result) -> None:
        self.log: list[str] = []
        self.ssh = ScriptedShell(
            {"/proc/iomem": Result(IOMEM), "modprobe 8139cp": link, "tcp_rr": Result(tcp_rr_output())}, self.log
        )
        self.host_ssh = ScriptedShell(
            {"memslot_slots; do echo 0": Result(""), "echo slots": Result(reading_text("rbtree", slots, misses))},
            self.log,
        )
        self.clock = clock.icount(0)

    def deploy(self, agent: str) -> str:
        return f"/tmp/{agent}"


# (slots as (id, base, npages, hits, hit_nodes), misses, the order L1's counts give)
WINDOWS = [
    # The 2011 guest's traffic: every register access and EOI misses.
    ([(3, 256, 786144, 40, 80)], 9000, ["miss", "ram_hit", "other_hit"]),
    # A guest whose devices and APIC make no MMIO access: RAM hits lead.
    ([(3, 256, 786144, 900, 1800), (2, 0xFC000, 1024, 3, 9)], 5, ["ram_hit", "miss", "other_hit"]),
]


@pytest.mark.parametrize(("slots", "misses", "order"), WINDOWS)
def test_a_boot_counts_the_window_of_transactions_alone(
    slots: list[tuple[int, int, int, int, int]], misses: int, order: list[str]
) -> None:
    guest = NetperfGuest(slots, misses, Result("eth1\n"))
    boot = l1_netperf.measure(guest, "2011-npt")
    steps = [cmd.split()[0] for cmd in guest.log if "echo 0" in cmd or "tcp_rr" in cmd or "echo slots" in cmd]
    # L1's counts reset after the link came up and read after the last run.
    assert steps == ["sh", "/tmp/tcp_rr", "sh"]
    assert guest.log.index(next(c for c in guest.log if "modprobe 8139cp" in c)) < guest.log.index(
        next(c for c in guest.log if "echo 0" in c)
    )
    assert "/tmp/tcp_rr 10.9.0.100 7 1000 3" in guest.log
    assert boot.transactions_per_s == pytest.approx(4000.0)
    assert boot.per_transaction("miss") == pytest.approx(misses / 3000)
    assert boot.kinds.order() == order
    assert l1_netperf.render([boot], "K", "icount:0")[2].split()[1:3] == ["rbtree", "4000.0"]


@pytest.mark.parametrize(
    ("link", "step"),
    [
        (Result("", 3), "load 8139cp"),
        (Result("", 4), "find the rtl8139's interface"),
        (Result("", 6), "see its carrier"),
        (Result("eth1; rm -rf /\n", 0), "bring it up"),  # not an interface's name
    ],
)
def test_a_link_that_does_not_come_up_names_its_step(link: Result, step: str) -> None:
    guest = NetperfGuest([(3, 256, 786144, 40, 80)], 9000, link)
    with pytest.raises(GuestError, match=step):
        l1_netperf.measure(guest, "2011-npt")
    assert not any("tcp_rr" in cmd for cmd in guest.log)


def netperf_boot(structure: str, misses: int, rate: float) -> l1_netperf.NetperfBoot:
    reading = l1_kinds.parse_reading(reading_text(structure, [(3, 256, 786144, 40, 80)], misses))
    return l1_netperf.NetperfBoot(
        structure, "2011-npt", 1000, (1000 / rate,) * 3, l1_kinds.sort_kinds(reading, RAM), ()
    )


def test_records_carry_the_workload_so_the_fault_windows_kinds_stay_apart() -> None:
    boots = [netperf_boot("rbtree", 9000, 4000.0), netperf_boot("rbtree", 9100, 4100.0)]
    made = l1_netperf.records(boots, Environment.from_json({}))
    rr = [r for r in made if r.metric == "tcp_rr_per_s"]
    assert len(rr) == 1 and rr[0].scenario == "memslots.l1_netperf"
    assert rr[0].replicates == [[pytest.approx(4000.0)], [pytest.approx(4100.0)]]
    assert rr[0].extra["clock_reads"] == "the guest's CLOCK_MONOTONIC (L2's)"
    kinds = [r for r in made if r.scenario == "memslots.l1_lookup_kinds"]
    assert {r.variant["kind"] for r in kinds} == set(l1_kinds.KINDS)
    assert all(r.variant["workload"] == "tcp_rr" and r.variant["conditions"] == "2011-npt" for r in kinds)
    assert "nox2apic" in rr[0].settings["cmdline"]


def test_the_guest_is_seed_000s_with_an_echo_peer_and_an_xapic() -> None:
    args = l1_netperf.GUEST.extra_args()
    netdev = args[args.index("-netdev") + 1]
    assert netdev.startswith("user,id=mq-gl-nic,restrict=on,")
    assert f"guestfwd=tcp:{l1_netperf.PEER}:{l1_netperf.PORT}-cmd:cat" in netdev
    assert l1_netperf.GUEST.machine_config().cmdline_extra == "nox2apic"
    assert l1_netperf.GUEST.ram_mib == 10 * 1024 and l1_netperf.GUEST.nic == "rtl8139"

"""host/memslots/l1_kinds.py and l1_faults.py: L1's counters and slot
list parsed, searches sorted by kind against the guest's RAM, each hit
slot's nodes checked against the model, records that pair by settings."""

from __future__ import annotations

from typing import Any

import pytest
from l1_counts import IOMEM, RAM, reading_text

from memqual.host.core import clock
from memqual.host.core.environment import Environment
from memqual.host.core.errors import CapabilityMissing, GuestError
from memqual.host.core.fault_probe import FaultRun
from memqual.host.memslots import l1_faults, l1_kinds

# A pc guest's slots as QEMU registers them (ids in registration order).
SLOTS = [
    (0, 0, 160, 10, 10),  # RAM below 640 KiB
    (1, 0xC0, 8, 0, 0),  # video ROM
    (2, 0xFC000, 1024, 3, 9),  # VGA memory: other
    (3, 256, 786144, 1000, 4000),  # RAM 1 MiB - 3 GiB
    (4, 1048576, 1835008, 20, 100),  # RAM from 4 GiB
]


def test_system_ram_reads_top_level_ranges_only() -> None:
    assert l1_kinds.system_ram(IOMEM) == RAM
    with pytest.raises(GuestError, match="no System RAM"):
        l1_kinds.system_ram("00000000-00000000 : System RAM\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memslot_lookups 1\n", "no memslot_slots list"),
        ("memslot_lookups x\nslots\n", "counters unreadable"),
        (reading_text("linear", []) + "1 2 three\n", "line unreadable"),
        (reading_text("\x1b[2Jlinear", []), "not a structure's name"),
    ],
)
def test_a_reading_that_is_not_one_is_refused(text: str, message: str) -> None:
    with pytest.raises(GuestError, match=message):
        l1_kinds.parse_reading(text)


def test_kinds_sorted_by_the_slot_each_hit_found() -> None:
    reading = l1_kinds.parse_reading(reading_text("linear", SLOTS))
    kinds = l1_kinds.sort_kinds(reading, RAM)
    assert (kinds.misses, kinds.ram_hits, kinds.other_hits, kinds.unattributed) == (5, 1030, 3, 0)
    assert kinds.nodes_per("ram_hit") == pytest.approx(4110 / 1030)
    assert kinds.nodes_per("other_hit") == 3.0
    assert kinds.order() == ["ram_hit", "miss", "other_hit"]
    # The same searches with the RAM hits gone: the order turns.
    quiet = [(i, b, n, h if i not in (0, 3, 4) else 0, hn if i not in (0, 3, 4) else 0) for i, b, n, h, hn in SLOTS]
    assert l1_kinds.sort_kinds(l1_kinds.parse_reading(reading_text("linear", quiet)), RAM).order() == [
        "miss",
        "other_hit",
        "ram_hit",
    ]


def test_a_truncated_list_sorts_nothing() -> None:
    reading = l1_kinds.parse_reading(reading_text("linear", SLOTS) + "truncated\n")
    with pytest.raises(GuestError, match="truncated"):
        l1_kinds.sort_kinds(reading, RAM)


@pytest.mark.parametrize(
    ("search", "nodes_of_slot_3", "agrees"),
    [
        ("linear", 4, True),  # id 3: the fourth entry
        ("linear", 5, False),
        ("reorder", 1, True),  # the only slot: the first entry
        ("rbtree", 7, True),  # a cache in front: no fixed count, nothing to check
    ],
)
def test_each_hit_slot_checked_against_the_model(search: str, nodes_of_slot_3: int, agrees: bool) -> None:
    slots = [(i, b, n, h, h * nodes_of_slot_3 if i == 3 else hn) for i, b, n, h, hn in SLOTS if i in (3,)]
    reading = l1_kinds.parse_reading(reading_text(search, slots))
    (check,) = l1_faults.slot_checks(reading)
    assert check.counted == nodes_of_slot_3
    assert check.agrees is agrees


def boot(structure: str, ns: float, conditions: str = "2011-shadow") -> l1_faults.FaultsBoot:
    reading = l1_kinds.parse_reading(reading_text(structure, SLOTS))
    run = FaultRun(index=0, pages=16384, faults=16384, seconds=ns * 16384 / 1e9, ns_per_page=ns)
    return l1_faults.FaultsBoot(structure, conditions, (run,), l1_kinds.sort_kinds(reading, RAM), ())


def test_records_one_replicate_a_boot_paired_by_settings() -> None:
    boots = [boot("reorder", 9000.0), boot("reorder", 9010.0), boot("tree2011", 9100.0)]
    made = l1_faults.records(boots, Environment.from_json({}))
    faults = [r for r in made if r.metric == "fault_ns"]
    assert [r.variant["structure"] for r in faults] == ["reorder", "tree2011"]
    assert faults[0].replicates == [[9000.0], [9010.0]]
    assert faults[0].settings == faults[1].settings
    kinds = [r for r in made if r.scenario == "memslots.l1_lookup_kinds"]
    assert {(r.variant["kind"], r.variant["structure"]) for r in kinds} == {
        (k, s) for k in l1_kinds.KINDS for s in ("reorder", "tree2011")
    }
    assert all(r.variant["conditions"] == "2011-shadow" for r in made)


@pytest.mark.parametrize(
    ("params", "name"),
    [
        (("kvm.mmio_caching=0", "kvm_amd.npt=0"), "2011-shadow"),
        (("kvm.mmio_caching=0",), "2011-npt"),
        ((), "today"),
        (("kvm_amd.npt=0",), "kvm_amd.npt=0"),
    ],
)
def test_conditions_named_from_the_hosts_parameters(params: tuple[str, ...], name: str) -> None:
    assert l1_faults.conditions_of(params) == name


class ScriptedShell:
    """A shell that answers each command from a table and logs them."""

    def __init__(self, answers: dict[str, str], log: list[str]) -> None:
        self.answers, self.log = answers, log

    def start(self, argv: list[str]) -> Any:
        raise AssertionError("nothing runs in the background")

    def run(self, argv: list[str], timeout: float = 60.0, check: bool = True, input: bytes | None = None) -> Any:
        self.log.append(" ".join(argv))
        key = next((k for k in self.answers if k in " ".join(argv)), None)
        return type("Result", (), {"stdout": self.answers[key] if key else ""})()


class FaultsGuest:
    """L2 and L1 of one boot: fault_probe's runs, /proc/iomem, L1's counts."""

    def __init__(self, search: str, slot_nodes: int) -> None:
        self.log: list[str] = []
        runs = "".join(
            f"event=run index={i} pages=16384 faults=16384 duration_s=0.15 ns_per_page=9155.2\n" for i in range(3)
        )
        reads = "".join(f"event=run index={i} reads=2000 duration_s=0.08 ns_per_read=40000.000\n" for i in range(3))
        self.ssh = ScriptedShell(
            {
                "/proc/iomem": IOMEM,
                "fault_probe": runs + "event=done runs=3\n",
                "mmio_pingpong": "event=device path=/sys/x\n" + reads + "event=done runs=3 sink=0\n",
            },
            self.log,
        )
        slots = [(3, 256, 786144, 1000, 1000 * slot_nodes)]
        self.host_ssh = ScriptedShell(
            {"memslot_slots; do echo 0": "", "echo slots": reading_text(search, slots)}, self.log
        )
        self.clock = clock.icount(0)

    def deploy(self, agent: str) -> str:
        return f"/tmp/{agent}"


@pytest.mark.parametrize(("slot_nodes", "findings"), [(1, 0), (3, 1)])
def test_a_boot_resets_before_the_workload_reads_after_and_checks_the_model(slot_nodes: int, findings: int) -> None:
    guest = FaultsGuest("reorder", slot_nodes)
    boot = l1_faults.measure(guest, "2011-shadow")
    steps = ("echo 0", "fault_probe 64 3", "echo slots", "mmio_pingpong 0x10ec 0x8139 1 2000 3")
    order = [cmd.split()[0] for cmd in guest.log if any(step in cmd for step in steps)]
    # Each window: L1's counts reset, the guest's work, L1's counts read.
    assert order == ["sh", "/tmp/fault_probe", "sh", "sh", "/tmp/mmio_pingpong", "sh"]
    assert boot.mmio is not None and boot.mmio.round_trips_per_s == pytest.approx(25000.0)
    assert boot.mmio.misses_per_read == pytest.approx(5 / 6000)
    assert boot.structure == "reorder" and boot.kinds.ram_hits == 1000
    assert boot.ns_per_page == pytest.approx(0.45e9 / 49152)
    assert len(boot.findings()) == findings
    assert l1_faults.render([boot], "K", "icount:0")[2].split()[1:3] == ["reorder", f"{boot.ns_per_page:.1f}"]


@pytest.mark.parametrize(("status", "refused"), [(0, False), (1, True)])
def test_a_kernel_that_does_not_count_is_a_missing_capability_naming_the_remedy(status: int, refused: bool) -> None:
    asked: list[list[str]] = []

    class Shell:
        def start(self, argv: list[str]) -> Any:
            raise AssertionError("nothing runs in the background")

        def run(self, argv: list[str], timeout: float = 60.0, check: bool = True, input: bytes | None = None) -> Any:
            asked.append(argv)
            return type("Result", (), {"status": status, "stdout": "", "stderr": ""})()

    if refused:
        with pytest.raises(CapabilityMissing, match="does not count its memslot searches .*images/kvm-memslots/"):
            l1_kinds.require_counters(Shell(), "6.1.0-57-amd64")
    else:
        l1_kinds.require_counters(Shell(), "6.1.0-57-amd64")
    assert asked == [["sh", "-c", "test -e /sys/module/kvm/parameters/memslot_slots"]]

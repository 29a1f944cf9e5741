"""The guest probe's output, the host check through QEMU, trace replay and
``memqual memslots qemu`` without a guest; the agent itself on the host."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from fakes import FakeQmp, PmemQmp

from memqual.host.cli import main as cli
from memqual.host.core.errors import BadInput, GuestError
from memqual.host.memslots import qemu_layout as Q
from memqual.host.memslots import qemu_probe as P
from memqual.host.memslots import trace as T
from memqual.host.memslots.layout import LAYOUTS_DIR, Layout, Slot

BLOCK = Q.GUEST_BLOCK // 4096
SEED = 0x1234_5678_9ABC_DEF0
PROBE_OUTPUT = """\
frames 0x100000 0x100001 0x100002 0x20
frames 0x108000
sample range=0x100000000 frame=0x100000
sample range=0x100000000 frame=0x100001
sample range=0x108000000 frame=0x108000
range start=0x100000 size=0x1ff00000 pages=1 verified=1 bad_words=0
range start=0x100000000 size=0x8000000 pages=3 verified=3 bad_words=0
range start=0x108000000 size=0x8000000 pages=1 verified=1 bad_words=0
summary pages=5 outside=0 absent=0 moved=0 bad_words=0 seed=0x123456789abcdef0
holding
"""
LAYOUT = Layout((Slot(0, 0x100, 0x1FF00), Slot(1, 0x100000, BLOCK), Slot(2, 0x108000, BLOCK)), name="t")


def ranges() -> list[P.RangeResult]:
    return [P.RangeResult(s.id, s.base_gfn * 4096, s.npages * 4096) for s in LAYOUT.slots]


def test_probe_output_fills_the_ranges_and_the_trace():
    result = P.parse_probe(PROBE_OUTPUT.splitlines(), ranges(), SEED)
    assert result.frames == [0x100000, 0x100001, 0x100002, 0x20, 0x108000]
    by_slot = result.by_slot()
    assert (by_slot[1].pages, by_slot[1].verified, by_slot[1].samples) == (3, 3, [0x100000, 0x100001])
    assert by_slot[2].samples == [0x108000] and by_slot[0].samples == []
    assert by_slot[1].coverage == 3 / BLOCK
    assert result.summary["seed"] == SEED and result.summary["bad_words"] == 0


@pytest.mark.parametrize("line", ["error what=mmap errno=12 msg=Cannot", "timeout"])
def test_probe_failures_are_guest_errors(line):
    with pytest.raises(GuestError, match="mem_probe failed"):
        P.parse_probe([line], ranges(), SEED)


def test_probe_without_summary_is_a_guest_error():
    with pytest.raises(GuestError, match="without a summary"):
        P.parse_probe(PROBE_OUTPUT.splitlines()[:3], ranges(), SEED)


def test_expected_page_is_the_agents_pattern():
    page = P.expected_page(0x100001, SEED)
    assert len(page) == 4096
    assert int.from_bytes(page[:8], "little") == (0x100001000 ^ SEED)
    assert int.from_bytes(page[8:16], "little") == (0x100001008 ^ SEED)
    assert P.expected_page(0x100002, SEED) != page


def test_host_check_counts_only_pages_qemu_holds_with_the_pattern():
    result = P.parse_probe(PROBE_OUTPUT.splitlines(), ranges(), SEED)
    vm = PmemQmp(
        {
            0x100000: P.expected_page(0x100000, SEED),
            0x100001: P.expected_page(0x100000, SEED),
            0x108000: P.expected_page(0x108000, SEED),
        }
    )
    P.host_check(vm, result)
    assert result.by_slot()[1].host_verified == 1  # 0x100001 holds another frame's pattern
    assert result.by_slot()[2].host_verified == 1


# --- trace ----------------------------------------------------------------------


def test_replay_segments_average_to_the_table():
    frames = [0x100000 + i for i in range(100)] + [0x20, 0x108000, 0x50000000]
    result = T.replay(LAYOUT, frames, segments=4)
    table = result.table
    assert table.lookups == 103 and table.workload == "trace"
    assert table.hit_fraction == pytest.approx(101 / 103)
    for name, stats in table.structures.items():
        segs = result.segment_means[name]
        assert len(segs) == 4
        sizes = [26, 26, 25, 26]  # 103 frames in 4 segments
        assert sum(m * n for m, n in zip(segs, sizes, strict=True)) / 103 == pytest.approx(stats.mean_nodes)
    # a run of frames in one slot: the last-slot cache answers with one probe
    assert result.segment_means["binsearch-lru"][1] == 1.0
    assert result.segment_means["linear"][0] == 2.0  # slot 1 is the second entry


def test_replay_refuses_an_empty_trace():
    with pytest.raises(BadInput, match="empty"):
        T.replay(LAYOUT, [])


def test_records_one_per_structure_for_the_claim():
    result = T.replay(LAYOUT, [0x100000, 0x108001, 0x20], segments=3)
    records = T.records(result, {"layout": "t"}, duration_s=1.5)
    assert {r.variant["structure"] for r in records} == set(result.table.structures)
    for record in records:
        assert (record.scenario, record.claim, record.metric, record.unit) == (
            "memslots.trace",
            "memslot-hit",
            "nodes_per_lookup",
            "nodes",
        )
        assert len(record.samples) == 3 and record.settings == {"layout": "t"}
        assert record.extra["lookups"] == 3 and record.duration_s == 1.5
    assert len({r.key() for r in records}) == 1  # one A/B group, told apart by variant


def test_trace_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "trace.json"
    T.save_trace(path, LAYOUT, [1, 2, 0x100000], source="test")
    layout, frames = T.load_trace(path)
    assert layout.slots == LAYOUT.slots and frames == [1, 2, 0x100000]
    path.write_text('{"layout": {"slots": []}, "frames": [-1]}')
    with pytest.raises(BadInput, match="non-negative"):
        T.load_trace(path)
    path.write_text("{")
    with pytest.raises(BadInput, match="not JSON"):
        T.load_trace(path)
    with pytest.raises(BadInput, match="no such trace file"):
        T.load_trace(tmp_path / "missing.json")


# --- CLI without a guest ---------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["memslots", "qemu", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_plan_json(capsys):
    layout = str(LAYOUTS_DIR / "qemu-pc-3dimm.json")
    rc, out, err = run(capsys, "--layout", layout, "--hotplug", "2", "--plan", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["qemu_args"][1] == "memory-backend-ram,id=mq-mem-1,size=134217728"
    assert [c["execute"] for c in doc["qmp"]] == ["object-add", "device_add"] * 2
    assert [d["hotplug"] for d in doc["dimms"]] == [False, True, True]


def test_cli_plan_text(capsys):
    rc, out, _ = run(capsys, "--layout", str(LAYOUTS_DIR / "qemu-pc-3dimm.json"), "--plan")
    assert rc == 0
    assert "dimm   slot 3 (gfn 0x120000-0x127fff): pc-dimm mq-dimm-3 at 0x120000000, 128 MiB, at boot" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--layout", "seed-3", "--plan"], "raise --maxmem"),
        (["--layout", "seed-3", "--slots", "0", "--plan"], "at least 1"),
        (["--layout", "nope", "--plan"], "unknown layout"),
        (["--layout", "seed-3", "--trace-out", "x.json"], "--trace-out needs --probe"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert words in err and len(err.strip().splitlines()) == 1


# --- the agent, on the host --------------------------------------------------------


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not found: the guest agent cannot be built")
def test_agent_writes_and_reads_back_its_pattern():
    from memqual.images.agents import build_agent

    binary = build_agent(P.AGENT)
    proc = subprocess.run(
        [str(binary), "probe", "2", hex(SEED), "0x0:0x1000"], input=b"", capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout[-300:]
    lines = proc.stdout.decode().splitlines()
    result = P.parse_probe(lines, [P.RangeResult(0, 0, 0x1000)], SEED)
    assert len(result.frames) == 512 and lines[-1] == "holding"
    assert result.summary["pages"] == 512 and result.summary["bad_words"] == 0
    bad = subprocess.run([str(binary), "probe", "x"], capture_output=True, timeout=10)
    assert bad.returncode == 2 and b"usage" in bad.stderr


# --- device MMIO from QEMU's trace log ---------------------------------------------

MMIO_LOG = """\
memory_region_ops_write cpu 0 mr 0x5578f42b71e0 addr 0xfee000b0 value 0x0 size 4 name 'apic-msi'
memory_region_ops_read cpu 1 mr 0x5578f42b71e0 addr 0xfee01030 value 0x50014 size 4 name 'apic-msi'
memory_region_ops_write cpu 0 mr 0x5578f4000000 addr 0x3f8 value 0x41 size 1 name 'serial'
memory_region_ops_read cpu 0 mr 0x5578f4000001 addr 0xfed000f0 value 0x1 size 4 name 'hpet'
memory_region_ops_write cpu 0 mr 0x5578f4000002 addr 0xfebf8004 value 0x1 size 4 name 'virtio-pci-common-virtio-net'
kvm_set_user_memory Slot#0 flags=0x0 gpa=0x0 size=0xc0000 ua=0x7f0000000000 ret=0
"""


def test_mmio_log_keeps_accesses_to_device_ranges_of_the_memory_view():
    flat = [
        Q.FlatRange(0x0, 0x1FFFFFFF, "ram", "pc.ram"),
        Q.FlatRange(0xFEBF8000, 0xFEBF8FFF, "i/o", "virtio-pci-common-virtio-net"),
        Q.FlatRange(0xFEE00000, 0xFEEFFFFF, "i/o", "apic-msi"),
    ]
    # serial is port I/O (not in this view); hpet is not mapped in this view
    assert T.parse_mmio_log(MMIO_LOG, flat) == [0xFEE00, 0xFEE01, 0xFEBF8]
    assert T.parse_mmio_log("", flat) == []


def test_mmio_tracing_arguments_and_switch():
    assert T.mmio_trace_args("/tmp/x/q.log") == ("-D", "/tmp/x/q.log", "-trace", "enable=kvm_set_user_memory")

    vm = FakeQmp()
    T.set_mmio_tracing(vm, True)
    assert vm.sent == [("trace-event-set-state", {"name": e, "enable": True}) for e in T.MMIO_EVENTS]


def test_mmio_records_name_the_miss_claim():
    result = T.replay(LAYOUT, [0xFEE00, 0xFEE01], segments=2)
    assert result.table.hit_fraction == 0.0
    records = T.records(result, {"trace": "mmio"}, scenario=T.MMIO_SCENARIO, claim=T.MMIO_CLAIM)
    assert {(r.scenario, r.claim) for r in records} == {("memslots.trace_mmio", "memslot-miss")}
    assert {r.filename() for r in records}.isdisjoint(r.filename() for r in T.records(result, {}))

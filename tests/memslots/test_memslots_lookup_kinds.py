"""Lookup kinds counted from the host's kvm trace events (memslot-priorities)."""

from __future__ import annotations

import pytest

from memqual.host.core.errors import CapabilityMissing
from memqual.host.memslots import lookup_kinds as LK
from memqual.host.memslots.layout import Layout, Slot

LAYOUT = Layout((Slot(0, 0, 0xA0), Slot(1, 0xC0, 0x20), Slot(2, 0x100, 0x1FF00)), name="pc-512m")
TRACE = """\
# tracer: nop
 qemu-1234 [000] .... 10.0: kvm_page_fault: vcpu 0 rip 0xffffffff81000000 address 0x0000000012345000 error_code 0x181
 qemu-1234 [000] .... 10.1: kvm_mmio: mmio write len 4 gpa 0xfebff000 val 0x1
 qemu-1234 [000] .... 10.2: kvm_mmio: mmio read len 4 gpa 0xfec00000 val 0x0
 qemu-1234 [000] .... 10.3: kvm_page_fault: vcpu 0 rip 0xc0000 address 0x00000000000c1000 error_code 0x81
 qemu-1234 [000] .... 10.4: kvm_page_fault: vcpu 0 rip 0x0 address 0x00000000febff000 error_code 0x181
 qemu-1234 [000] .... 10.5: kvm_exit: reason EPT_VIOLATION rip 0x0 info 0 0
"""


def test_each_event_is_sorted_by_the_slot_it_hits():
    counts = LK.count(TRACE, LAYOUT, seconds=2.0)
    assert counts.by_kind == {"miss": 2, "ram_hit": 1, "other_hit": 1, "fault_no_slot": 1}
    assert counts.per_second("miss") == 1.0
    assert counts.order()[0] == "miss"
    # Evidence the other way: a trace of RAM faults ranks RAM hits first.
    ram_only = LK.count("\n".join([TRACE.splitlines()[1]] * 2), LAYOUT, seconds=1.0)
    assert ram_only.order()[0] == "ram_hit"


def test_the_session_restores_the_event_knobs(tmp_path):
    for event in LK.EVENTS:
        knob = tmp_path / "events" / event / "enable"
        knob.parent.mkdir(parents=True)
        knob.write_text("0\n")
    (tmp_path / "trace").write_text("old lines\n")
    with pytest.raises(RuntimeError), LK.TraceSession(tmp_path) as session:
        assert all((tmp_path / "events" / e / "enable").read_text() == "1" for e in LK.EVENTS)
        assert session.read() == ""
        raise RuntimeError("the workload failed")
    assert all((tmp_path / "events" / e / "enable").read_text() == "0" for e in LK.EVENTS)


def test_no_kvm_events_is_a_missing_capability(monkeypatch, tmp_path):
    monkeypatch.setattr(LK, "TRACEFS", (tmp_path,))
    with pytest.raises(CapabilityMissing, match="kvm:kvm_mmio"):
        LK.tracefs_root()


def test_records_have_one_replicate_per_boot():
    per_boot = [LK.count(TRACE, LAYOUT, 2.0), LK.count(TRACE, LAYOUT, 4.0)]
    recs = {r.variant["kind"]: r for r in LK.records(per_boot, {"workload": "test"})}
    assert recs["miss"].replicates == [[1.0], [0.5]] and recs["miss"].scenario == LK.SCENARIO

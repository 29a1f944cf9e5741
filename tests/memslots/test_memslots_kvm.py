"""Unit tests of the /dev/kvm wrapper and the memslot harness, no /dev/kvm
needed: struct layouts and ioctl numbers against the kernel UAPI, the slot
geometry, the hand-assembled guest program, argument parsing, and the JSON
and records built from synthetic results.

The UAPI figures below were printed by a C program compiled against
linux/kvm.h (Debian 12 linux-libc-dev) with sizeof/offsetof; they are ABI
and do not change between kernels.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import math

import pytest
from disassemble import instructions, needs_objdump
from hypothesis import given, settings
from hypothesis import strategies as st

from memqual.host.cli import memslots_kvm as kvm_cli
from memqual.host.core import kvm as K
from memqual.host.core import kvm_uapi as uapi
from memqual.host.core.errors import BadInput, CapabilityMissing, MemqualError
from memqual.host.core.record import load
from memqual.host.memslots import kvm_bench as B
from memqual.host.memslots import kvm_guest, kvm_results

# --- ABI -------------------------------------------------------------------------
SIZES = {
    uapi.UserspaceMemoryRegion: 32,
    uapi.Regs: 144,
    uapi.Sregs: 312,
    uapi.Segment: 24,
    uapi.DTable: 16,
    uapi.Ioeventfd: 64,
    uapi.RunExit: 256,  # kvm_valid_regs follows the union at 32 + 256 in the kernel's kvm_run
}


@pytest.mark.parametrize("struct", list(SIZES), ids=lambda s: s.__name__)
def test_struct_sizes_match_uapi(struct: type[ctypes.Structure]) -> None:
    assert ctypes.sizeof(struct) == SIZES[struct]


OFFSETS = {
    uapi.UserspaceMemoryRegion: {"slot": 0, "flags": 4, "guest_phys_addr": 8, "memory_size": 16, "userspace_addr": 24},
    uapi.Regs: {"rax": 0, "rip": 128, "rflags": 136},
    uapi.Segment: {
        "base": 0,
        "limit": 8,
        "selector": 12,
        "type": 14,
        "present": 15,
        "dpl": 16,
        "db": 17,
        "s": 18,
        "l": 19,
        "g": 20,
        "avl": 21,
        "unusable": 22,
        "padding": 23,
    },
    uapi.DTable: {"base": 0, "limit": 8},
    uapi.Ioeventfd: {"datamatch": 0, "addr": 8, "len": 16, "fd": 20, "flags": 24},
    uapi.Sregs: {
        "cs": 0,
        "ds": 24,
        "tr": 144,
        "ldt": 168,
        "gdt": 192,
        "idt": 208,
        "cr0": 224,
        "cr2": 232,
        "cr3": 240,
        "cr4": 248,
        "cr8": 256,
        "efer": 264,
        "apic_base": 272,
        "interrupt_bitmap": 280,
    },
    uapi.Run: {
        "request_interrupt_window": 0,
        "immediate_exit": 1,
        "exit_reason": 8,
        "ready_for_interrupt_injection": 12,
        "if_flag": 13,
        "flags": 14,
        "cr8": 16,
        "apic_base": 24,
        "exit": 32,
        "kvm_valid_regs": 288,
    },
    uapi.RunIo: {"direction": 0, "size": 1, "port": 2, "count": 4, "data_offset": 8},
    uapi.RunMmio: {"phys_addr": 0, "data": 8, "len": 16, "is_write": 20},
    uapi.RunInternal: {"suberror": 0, "ndata": 4, "data": 8},
    uapi.RunFailEntry: {"hardware_entry_failure_reason": 0, "cpu": 8},
}


@pytest.mark.parametrize("struct", list(OFFSETS), ids=lambda s: s.__name__)
def test_field_offsets_match_uapi(struct: type[ctypes.Structure]) -> None:
    actual = {name: getattr(struct, name).offset for name in OFFSETS[struct]}
    assert actual == OFFSETS[struct]


IOCTLS = {
    "KVM_GET_API_VERSION": 0xAE00,
    "KVM_CREATE_VM": 0xAE01,
    "KVM_CHECK_EXTENSION": 0xAE03,
    "KVM_GET_VCPU_MMAP_SIZE": 0xAE04,
    "KVM_CREATE_VCPU": 0xAE41,
    "KVM_SET_USER_MEMORY_REGION": 0x4020AE46,
    "KVM_RUN": 0xAE80,
    "KVM_GET_REGS": 0x8090AE81,
    "KVM_SET_REGS": 0x4090AE82,
    "KVM_GET_SREGS": 0x8138AE83,
    "KVM_SET_SREGS": 0x4138AE84,
    "KVM_IOEVENTFD": 0x4040AE79,
}


@pytest.mark.parametrize("name", list(IOCTLS))
def test_kvm_ioctl_numbers(name: str) -> None:
    value, expected = getattr(K, name), IOCTLS[name]
    assert value == expected, f"{name} is {value:#x}, not {expected:#x}"


def test_ioc_encoding_against_other_subsystems() -> None:
    # FS_IOC_GETFLAGS = _IOR('f', 1, long), FS_IOC_SETFLAGS = _IOW('f', 2, long),
    # TCGETS2 = _IOR('T', 0x2A, struct termios2 /* 44 bytes */),
    # BLKGETSIZE64 = _IOR(0x12, 114, size_t).
    assert uapi.IOR(ord("f"), 1, 8) == 0x80086601
    assert uapi.IOW(ord("f"), 2, 8) == 0x40086602
    assert uapi.IOR(ord("T"), 0x2A, 44) == 0x802C542A
    assert uapi.IOR(0x12, 114, 8) == 0x80081272
    assert uapi.IO(0xAE, 0) == 0xAE00


def test_ioc_rejects_a_size_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="14 bits"):
        uapi.IOW(0xAE, 1, 1 << 14)


def test_capability_and_exit_numbers() -> None:
    assert (uapi.KVM_CAP_USER_MEMORY, uapi.KVM_CAP_NR_MEMSLOTS, uapi.KVM_CAP_MULTI_ADDRESS_SPACE) == (3, 10, 118)
    assert (uapi.KVM_EXIT_IO, uapi.KVM_EXIT_HLT, uapi.KVM_EXIT_MMIO, uapi.KVM_EXIT_SHUTDOWN) == (2, 5, 6, 8)
    assert (uapi.KVM_EXIT_FAIL_ENTRY, uapi.KVM_EXIT_INTERNAL_ERROR) == (9, 17)
    assert uapi.exit_name(6) == "KVM_EXIT_MMIO"
    assert uapi.exit_name(999) == "exit reason 999"


def test_flat_segments_are_4gib_32bit() -> None:
    code = K.flat_segment(0x08, code=True)
    data = K.flat_segment(0x10, code=False)
    assert (code.type, data.type) == (0xB, 0x3)
    for seg in (code, data):
        assert (seg.base, seg.limit, seg.present, seg.db, seg.s, seg.l, seg.g, seg.dpl) == (
            0,
            0xFFFFFFFF,
            1,
            1,
            1,
            0,
            1,
            0,
        )


# --- errors -------------------------------------------------------------------------
def test_ioctl_error_carries_errno_name() -> None:
    import errno

    exc = K.KvmIoctlError("KVM_SET_USER_MEMORY_REGION(slot=5)", errno.EEXIST)
    assert isinstance(exc, MemqualError)
    assert exc.errno_name == "EEXIST"
    assert str(exc).startswith("KVM_SET_USER_MEMORY_REGION(slot=5) failed: EEXIST")
    assert exc.exit_status == 1


def test_missing_device_is_a_capability_error(tmp_path) -> None:
    path = tmp_path / "kvm"
    with pytest.raises(CapabilityMissing, match="does not exist"):
        K.Kvm(str(path))


def test_device_that_is_not_kvm_is_refused_and_closed() -> None:
    import os

    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(K.KvmUnavailable, match="KVM_GET_API_VERSION"):
        K.Kvm("/dev/null")  # ioctl on /dev/null: ENOTTY
    assert len(os.listdir("/proc/self/fd")) == before


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


def test_guest_memory_is_unmapped_on_close() -> None:
    mem = K.GuestMemory(4 * K.PAGE_SIZE)
    address = mem.address
    assert _mapped(address)
    mem.write(8, b"abc")
    assert mem.read(8, 3) == b"abc"
    mem.close()
    assert not _mapped(address)
    with pytest.raises(ValueError):
        K.GuestMemory(100)


# --- geometry -------------------------------------------------------------------------
def _ranges(geo: kvm_guest.SlotGeometry, moved: bool = False) -> list[tuple[int, int]]:
    shift = K.PAGE_SIZE if moved else 0
    return [(geo.slot_gpa(i) + shift, geo.slot_gpa(i) + shift + geo.slot_size(i)) for i in range(geo.n)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), pages=st.integers(1, 600))
def test_geometry_slots_disjoint_gaps_free_moves_legal(n: int, pages: int) -> None:
    geo = kvm_guest.SlotGeometry(n, pages)
    for moved in (False, True):
        ranges = sorted(_ranges(geo, moved))
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(ranges))
        assert ranges[-1][1] <= geo.top_gpa
    ranges = _ranges(geo)
    for i in range(n):
        lo, hi = ranges[i]
        assert lo <= geo.touch_gpa(i) < hi  # the touch hits its own slot
        gap = geo.gap_gpa(i)
        assert not any(a <= gap < b for a, b in ranges)  # the MMIO frame is in no slot
        # host pages: the touch page of slot i is inside slot i's backing
        off = geo.touch_host_offset(i) - geo.slot_host_offset(i)
        assert off == geo.touch_gpa(i) - geo.slot_gpa(i)
    offsets = [(geo.slot_host_offset(i), geo.slot_host_offset(i) + geo.slot_size(i)) for i in range(n)]
    offsets.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(offsets))
    assert offsets[-1][1] == geo.host_size


def test_geometry_code_page_is_in_slot_0() -> None:
    geo = kvm_guest.SlotGeometry(3)
    assert geo.slot_gpa(0) == 0 and geo.slot_size(0) >= K.PAGE_SIZE + len(kvm_guest.GUEST_CODE)


def test_geometry_at_the_kernel_limit_stays_below_4gib() -> None:
    geo = kvm_guest.SlotGeometry(32764, 1)
    geo.check()
    assert geo.top_gpa < 1 << 32


def test_geometry_above_4gib_is_bad_input() -> None:
    with pytest.raises(BadInput, match="above 4 GiB: use fewer pages per slot"):
        kvm_guest.SlotGeometry(32764, 512).check()
    with pytest.raises(BadInput, match="not positive"):
        kvm_guest.SlotGeometry(0).check()


# --- the guest program -----------------------------------------------------------------
def _offsets() -> list[int]:
    out, pos = [], 0
    for code, _, _ in kvm_guest.GUEST_PROGRAM:
        out.append(pos)
        pos += len(code)
    return out


def test_guest_program_jumps_land_on_instruction_starts() -> None:
    starts = _offsets()
    by_asm = {asm.split()[0]: (off, code) for off, (code, asm, _) in zip(starts, kvm_guest.GUEST_PROGRAM, strict=True)}
    targets = {}
    for off, (code, asm, _) in zip(starts, kvm_guest.GUEST_PROGRAM, strict=True):
        if code[0] in (0x74, 0xEB):  # je rel8 / jmp rel8
            rel = int.from_bytes(code[1:2], "little", signed=True)
            targets[asm] = off + len(code) + rel
    assert (
        targets["je done (+8 -> offset 14)"] == starts[[a for _, a, _ in kvm_guest.GUEST_PROGRAM].index("mov eax, ebx")]
    )
    assert (
        targets["jmp loop (-12 -> offset 2)"]
        == starts[[a for _, a, _ in kvm_guest.GUEST_PROGRAM].index("test ecx, ecx")]
    )
    assert targets["jmp halt (-3 -> offset 21)"] == by_asm["hlt"][0]
    # the port the program reports on is REPORT_PORT
    mov_dx = next(code for code, asm, _ in kvm_guest.GUEST_PROGRAM if asm.startswith("mov dx"))
    assert int.from_bytes(mov_dx[2:4], "little") == kvm_guest.REPORT_PORT


@needs_objdump
def test_guest_program_disassembles_as_documented(tmp_path) -> None:
    mnemonics = [insn.split()[0] for insn in instructions(kvm_guest.GUEST_CODE, tmp_path)]
    documented = [asm.split()[0] for _, asm, _ in kvm_guest.GUEST_PROGRAM]
    assert mnemonics == documented


# --- model ------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 31, 32, 33, 509, 4095, 4096, 32764])
def test_balanced_tree_nodes_is_ceil_log2(n: int) -> None:
    nodes, source = kvm_guest.balanced_tree_nodes(n)
    assert nodes == math.ceil(math.log2(n + 1))
    assert source


def test_schedule_alternates_and_covers_every_pair() -> None:
    order = list(B.schedule((1, 32, 509), 3))
    assert [n for _, n in order] == [1, 32, 509, 509, 32, 1, 1, 32, 509]
    assert sorted(order) == sorted({(r, n) for r in range(3) for n in (1, 32, 509)})


# --- synthetic results -> JSON, text, records --------------------------------------------
def _probe(name: str, observed: str | None = None) -> B.Probe:
    return B.Probe(name, name, B.EXPECTED_ERRNO[name], observed or B.EXPECTED_ERRNO[name])


def _result(vcpu_ok: bool = True, overlap: str = "EEXIST", full: bool = False) -> B.BenchResult:
    config = B.BenchConfig(slots=(1, 32, 509), repeats=2)
    result = B.BenchResult(
        config=config,
        api_version=12,
        nr_memslots=509 if full else 32764,
        address_spaces=1,
        vcpu_mmap_size=12288,
        kvm_module="kvm_test",
        host_kernel="test",
        probes=[_probe(name) for name in B.EXPECTED_ERRNO if name != "overlap"] + [_probe("overlap", overlap)],
        model_source="test",
    )
    for r in range(2):
        for n in (1, 32, 509):
            v = B.VcpuSample(
                empty_pass_s=10e-6,
                first_touch_s=10e-6 + n * (5 + r) * 1e-6,
                warm_touch_s=10e-6 + n * 2e-6,
                same_slot_s=10e-6 + n * 1.5e-6,
                mmio_s=10e-6 + n * 20e-6,
                accesses=n,
                reported=(n, n, n, n),
                mmio_exits=n,
                mmio_mismatches=0 if vcpu_ok else 1,
                touched_ok=n,
                other_exits=0,
            )
            limit = _probe("limit") if full and n == 509 else None
            result.samples.append(B.RunSample(n, r, n * (60 + r) * 1e-6, n * 30e-6, n * 10e-6, v, limit))
    return result


def test_summary_has_the_documented_shape_and_medians() -> None:
    doc = kvm_results.summarize(_result())
    assert doc["nr_memslots"] == 32764
    assert doc["limit_errno"] == "EINVAL" and doc["overlap_errno"] == "EEXIST" and doc["misaligned_errno"] == "EINVAL"
    assert doc["probes_ok"] is True and doc["limit_tested_on_full_vm"] is False
    runs = {r["slots"]: r for r in doc["runs"]}
    assert sorted(runs) == [1, 32, 509]
    r32 = runs[32]
    assert r32["setup_s"] == pytest.approx(32 * 60.5e-6)  # median of 60 and 61 us per slot
    assert r32["spread"]["setup_s"] == pytest.approx([32 * 60e-6, 32 * 61e-6])
    assert r32["fault_us"] == pytest.approx(3.5)  # (5.5 - 2) us
    assert r32["slot_switch_us"] == pytest.approx(0.5)
    assert r32["mmio_exit_us"] == pytest.approx(20)
    assert r32["model_nodes"] == 6
    assert doc["fit"]["fault_us"]["points"] == 3
    # No slot switch with one slot: the 1-slot run has no such figure, and
    # its line is fitted on the other two counts only if there are three.
    assert "slot_switch_us" not in runs[1] and "slot_switch_us" not in doc["fit"]
    assert doc["vcpu"]["execution"].startswith("emulated")


def test_summary_prefers_the_full_vm_limit_probe() -> None:
    doc = kvm_results.summarize(_result(full=True))
    assert doc["limit_tested_on_full_vm"] is True
    assert {r["slots"]: r.get("limit_errno") for r in doc["runs"]}[509] == ["EINVAL"]


def test_unexpected_errno_and_bad_mmio_make_the_cli_fail() -> None:
    doc = kvm_results.summarize(_result(overlap="accepted"))
    assert doc["probes_ok"] is False
    assert kvm_cli.vcpu_checks_ok(kvm_results.summarize(_result(vcpu_ok=False))) is False
    assert kvm_cli.vcpu_checks_ok(kvm_results.summarize(_result())) is True


def test_text_report_names_probes_and_model() -> None:
    text = kvm_cli.render_text(kvm_results.summarize(_result(overlap="accepted")))
    assert "overlap: overlap -> accepted (expected EEXIST, UNEXPECTED)" in text
    assert "ceil(log2(n+1))" in text
    assert "509" in text


def test_records_round_trip(tmp_path) -> None:
    result = _result()
    paths = kvm_results.write_records(result, tmp_path)
    recs = [load(p) for p in paths]
    assert {r.scenario for r in recs} == {"memslots.kvm"}
    by_key = {(r.metric, r.variant["slots"]): r for r in recs}
    # every metric at every slot count, but no slot switch with one slot
    assert len(by_key) == len(recs) == 3 * len(kvm_results.RECORD_METRICS) - 1
    assert ("slot_switch_us", 1) not in by_key and ("slot_switch_us", 32) in by_key
    setup = by_key[("setup_s_per_slot", 32)]
    assert setup.samples == pytest.approx([60e-6, 61e-6]) and setup.unit == "s" and setup.better == "lower"
    assert by_key[("mmio_exit_us", 509)].extra["model_nodes"] == 9
    assert setup.environment["kvm_module"] == "kvm_test"


# --- arguments -----------------------------------------------------------------------------
def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kvm_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    config = kvm_cli.config_from_args(_parse())
    assert config.slots == (1, 32, 509, 32764)
    assert (config.repeats, config.slot_pages, config.vcpu, config.device) == (3, 1, True, "/dev/kvm")


def test_options() -> None:
    args = _parse("--slots", "32, 1,32", "--repeats", "5", "--slot-pages", "2", "--no-vcpu", "--json", "--records", "d")
    config = kvm_cli.config_from_args(args)
    assert config.slots == (32, 1) and config.repeats == 5 and config.slot_pages == 2 and not config.vcpu
    assert args.json and args.records == "d"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slots", "1,abc"], "--slots: 'abc' is not a whole number: give counts like 1,32,509,32764"),
        (["--slots", "0"], "--slots: 0 is not positive"),
        (["--slots", ""], "--slots: '' is not a whole number"),
        (["--repeats", "0"], "--repeats 0 is not positive: give 1 or more"),
        (["--slot-pages", "-1"], "--slot-pages -1 is not positive"),
    ],
)
def test_bad_arguments_say_what_to_do(argv: list[str], message: str) -> None:
    with pytest.raises(BadInput) as info:
        kvm_cli.config_from_args(_parse(*argv))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value) and info.value.exit_status == 2


def test_slot_count_above_4gib_is_refused_before_opening_kvm() -> None:
    config = B.BenchConfig(slots=(32764,), slot_pages=512, device="/nonexistent/kvm")
    with pytest.raises(BadInput, match="above 4 GiB"):
        B.run_bench(config)


def test_missing_device_through_the_harness_is_capability_missing() -> None:
    with pytest.raises(CapabilityMissing, match="/nonexistent/kvm does not exist"):
        B.run_bench(B.BenchConfig(slots=(1,), device="/nonexistent/kvm"))


# --- the reference model on the harness's layout ---------------------------------------
def test_model_walk_on_the_bench_layout() -> None:
    walk = kvm_guest.model_walk(kvm_guest.SlotGeometry(32))
    if "touch_nodes_mean" not in walk:
        pytest.skip(f"reference model not usable here: {walk['source']}")
    assert walk["lookups"] == 32
    # a balanced tree of 32 slots: at most 2 * ceil(log2(33)) nodes (red-black height bound)
    assert 1 <= walk["touch_nodes_mean"] <= walk["touch_nodes_max"] <= 2 * 6
    assert 1 <= walk["mmio_nodes_mean"] <= walk["mmio_nodes_max"] <= 2 * 6


def test_only_an_unrunnable_guest_counts_as_a_missing_capability() -> None:
    import errno

    assert B._is_unsupported(B.GuestPassError("KVM_EXIT_FAIL_ENTRY", unsupported=True))
    assert not B._is_unsupported(B.GuestPassError("a slot access left KVM"))
    assert B._is_unsupported(K.KvmIoctlError("KVM_RUN", errno.EFAULT))
    assert not B._is_unsupported(K.KvmIoctlError("KVM_SET_USER_MEMORY_REGION(slot=1)", errno.EEXIST))


def test_a_model_disagreement_is_a_failure_not_a_note(monkeypatch) -> None:
    """The reference model answering wrongly on the bench's layout is a bug:
    it propagates instead of turning into a note (and a skipped check)."""
    from memqual.host.memslots import model as model_mod

    def wrong(name, layout, gfns, expected):
        raise model_mod.ModelDisagreement(f"{name} found slot 3 for gfn 0x1, the layout says None")

    monkeypatch.setattr(model_mod, "run_structure", wrong)
    with pytest.raises(model_mod.ModelDisagreement):
        kvm_guest.model_walk(kvm_guest.SlotGeometry(4))


def test_vcpu_failures_after_the_capability_probe_are_failures(monkeypatch) -> None:
    """The probe decides before any measurement whether the guest can run;
    a KVM_RUN failure in a measured pass afterwards raises (no skip)."""
    import errno

    calls = {"n": 0}

    def run_once(kvm, n, repeat, config, nr, with_vcpu):
        calls["n"] += 1
        if with_vcpu and repeat >= 0:
            raise K.KvmIoctlError("KVM_RUN", errno.EFAULT)
        return B.RunSample(n, repeat, 1e-3, 1e-3, 1e-3)

    class FakeKvm:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def check_extension(self, cap):
            return 32764 if cap == uapi.KVM_CAP_NR_MEMSLOTS else 1

        def api_version(self):
            return 12

        def vcpu_mmap_size(self):
            return 12288

    monkeypatch.setattr(K, "Kvm", FakeKvm)
    monkeypatch.setattr(B, "probe_errors", lambda kvm, nr: [])
    monkeypatch.setattr(B, "run_once", run_once)
    monkeypatch.setattr(B, "probe_vcpu", lambda kvm, timeout_s=60.0: None)  # the guest can run
    with pytest.raises(K.KvmIoctlError, match="KVM_RUN"):
        B.run_bench(B.BenchConfig(slots=(1,), repeats=1))
    # The probe says it cannot: no vCPU pass is attempted, the slots are still timed.
    monkeypatch.setattr(B, "probe_vcpu", lambda kvm, timeout_s=60.0: "entry failure")
    result = B.run_bench(B.BenchConfig(slots=(1,), repeats=1))
    assert result.vcpu_error == "entry failure" and result.samples[0].vcpu is None

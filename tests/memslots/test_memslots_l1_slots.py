"""The slot operations in L1 (guest/kvm_slots.c and
host/memslots/l1_slots.py): the C program's guest code and geometry
against kvm_guest.py's, its arguments in kvm_bench's order, the parsing of
fixed outputs, and small real runs on this machine's /dev/kvm (skipped
with the reason where it cannot run the guest), including a build that
aims the MMIO pass into the slots, where the checks must fail."""

from __future__ import annotations

import json
from pathlib import Path

import guest_program
import pytest
from local_shell import LocalShell
from lookup_kvm import runnable  # noqa: F401  (the fixture the real runs use)

from memqual.host.cli.memslots_kvm import vcpu_checks_ok
from memqual.host.core.environment import Environment
from memqual.host.core.errors import BadInput, CapabilityMissing, GuestError, Timeout
from memqual.host.memslots import kvm_results, l1_program
from memqual.host.memslots import l1_slots as S
from memqual.host.memslots.kvm_bench import EXPECTED_ERRNO, BenchConfig, schedule
from memqual.host.memslots.kvm_guest import GUEST_CODE, SlotGeometry

SMALL = S.L1SlotsConfig(BenchConfig(slots=(1, 8, 32), repeats=2), deadline_s=60)


def build(directory: Path, name: str, *defines: str) -> str:
    return guest_program.build("kvm_slots", directory, name, *defines)


program = guest_program.program_fixture("kvm_slots")
call = guest_program.call


# --- the program against kvm_guest.py, no /dev/kvm -------------------------------------
def test_the_guest_code_is_kvm_guests(program) -> None:
    assert bytes.fromhex(call(program, "program").stdout.strip()) == GUEST_CODE


@pytest.mark.parametrize(("n", "pages"), [(1, 1), (2, 1), (32, 3), (509, 1), (32764, 1), (1000, 7)])
def test_the_geometry_is_slot_geometrys(program, n: int, pages: int) -> None:
    got = json.loads(call(program, "geometry", str(n), "slot-pages", str(pages)).stdout)
    geo = SlotGeometry(n, pages)
    assert got == {
        "slots": n,
        "stride": geo.stride,
        "host_size": geo.host_size,
        "top_gpa": geo.top_gpa,
        "last_slot_gpa": geo.slot_gpa(n - 1),
        "last_gap_gpa": geo.gap_gpa(n - 1),
        "last_touch_offset": geo.touch_host_offset(n - 1),
        "slot0_size": geo.slot_size(0),
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["bench"],
        ["bench", "run", "8", "0"],  # no warm-up
        ["bench", "warmup", "8"],  # no run
        ["bench", "warmup", "8", "run", "8"],
        ["bench", "warmup", "x", "run", "8", "0"],
        ["bench", "slot-pages", "0", "warmup", "8", "run", "8", "0"],
        ["bench", "warmup", "8", "run", "600000", "0", "slot-pages", "8"],  # above 4 GiB
        ["geometry"],
        ["program", "extra"],
        ["nonsense"],
    ],
)
def test_bad_usage_is_one_line_and_status_2(program, argv: list[str]) -> None:
    out = call(program, *argv)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith("kvm_slots: ")


def test_the_arguments_are_kvm_benchs_order() -> None:
    config = S.L1SlotsConfig(BenchConfig(slots=(509, 1, 32), repeats=2, slot_pages=2, vcpu=False), deadline_s=90)
    argv = config.argv("/tmp/kvm_slots")
    assert argv[:9] == ["/tmp/kvm_slots", "bench", "slot-pages", "2", "deadline", "90", "no-vcpu", "warmup", "1"]
    runs = [(int(argv[i + 2]), int(argv[i + 1])) for i in range(9, len(argv), 3) if argv[i] == "run"]
    assert runs == list(schedule((509, 1, 32), 2)) and len(argv) == 9 + 3 * len(runs)


# --- parsing fixed outputs ------------------------------------------------------------------
KVM_LINE = {
    "line": "kvm",
    "api_version": 12,
    "nr_memslots": 32764,
    "address_spaces": 1,
    "vcpu_mmap_size": 12288,
    "kvm_module": "kvm_amd",
    "release": "6.1.0-57-amd64",
}


def output(config: S.L1SlotsConfig, vcpu: dict[str, object] | None = None, **run: object) -> str:
    lines = [KVM_LINE]
    lines += [{"line": "probe", "name": name, "observed": errno} for name, errno in EXPECTED_ERRNO.items()]
    lines.append({"line": "vcpu", "error": None})
    for repeat, n in schedule(config.bench.slots, config.bench.repeats):
        passes = vcpu or {
            "empty_ns": 1000,
            "first_ns": 1000 + 6000 * n,
            "warm_ns": 1000 + 100 * n,
            "same_ns": 1000 + 100 * n,
            "mmio_ns": 1000 + 5000 * n,
            "reported": [n] * 4,
            "mmio_exits": n,
            "mmio_mismatches": 0,
            "touched_ok": n,
            "other_exits": 0,
        }
        line = {"line": "run", "slots": n, "repeat": repeat, "setup_ns": 20000 * n, "move_ns": 40000 * n}
        lines.append({**line, "delete_ns": 23000 * n, "limit": None, "vcpu": passes, **run})
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def test_the_lines_are_kvm_benchs_result() -> None:
    result = S.parse(output(SMALL), SMALL)
    assert (result.nr_memslots, result.kvm_module, result.host_kernel) == (32764, "kvm_amd", "6.1.0-57-amd64")
    assert [p.name for p in result.probes] == list(EXPECTED_ERRNO) and all(p.ok for p in result.probes)
    assert result.probes[0].description == "slot id 32764 (= KVM_CAP_NR_MEMSLOTS)"
    assert [(s.repeat, s.slots) for s in result.samples] == list(schedule((1, 8, 32), 2))
    doc = kvm_results.summarize(result)
    eight = next(r for r in doc["runs"] if r["slots"] == 8)
    assert eight["setup_s_per_slot"] == pytest.approx(20e-6) and eight["fault_us"] == pytest.approx(5.9)
    assert doc["probes_ok"] and vcpu_checks_ok(doc) and set(result.model_walks) == {1, 8, 32}


def test_a_wrong_errno_or_count_is_what_the_checks_see() -> None:
    wrong = output(SMALL).replace('"observed": "EEXIST"', '"observed": "accepted"')
    assert not kvm_results.summarize(S.parse(wrong, SMALL))["probes_ok"]
    missed = output(SMALL).replace('"mmio_exits": 8,', '"mmio_exits": 7,')
    assert not vcpu_checks_ok(kvm_results.summarize(S.parse(missed, SMALL)))


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda t: t.replace('"setup_ns": 20000', '"setup_ns": -1'), "setup_ns=-1, not a count"),
        (lambda t: t.replace('"kvm_amd"', '"kvm_amd\\u001b[2J"'), "kvm_module="),
        (lambda t: t.replace('"EINVAL"', '"EWHATEVER"', 1), "observed=EWHATEVER"),
        (lambda t: "\n".join(t.splitlines()[:-1]), "printed 5 runs and 6 probes, not the 6 runs"),
        (lambda t: t.replace('"name": "overlap"', '"name": "limit"'), "not the 6 runs and the 6 probes asked"),
        (lambda t: t.replace('"reported": [8, 8, 8, 8]', '"reported": [8, 8, true, -1]'), "not four counts"),
        (
            lambda t: t.replace('"vcpu": {"empty_ns": 1000, "first_ns": 49000', '"vcpu": null, "x": {"e": 1'),
            "guest passes in 4 runs, not in every",
        ),
        (lambda t: "\n".join(t.splitlines()[1:]), "before what /dev/kvm said"),
        (lambda t: t + "garbage\n", "not a line of kvm_slots: garbage"),
        (lambda t: "", "printed nothing"),
    ],
    ids=[
        "negative",
        "control bytes",
        "unknown errno",
        "a run short",
        "a probe twice",
        "a bool count",
        "a run without passes",
        "no kvm line",
        "garbage",
        "nothing",
    ],
)
def test_what_it_does_not_print_is_an_error(spoil, message: str) -> None:
    with pytest.raises(GuestError, match=message):
        S.parse(spoil(output(SMALL)), SMALL)


def test_records_of_this_machine_are_memslots_kvm() -> None:
    result = S.parse(output(SMALL), SMALL)
    assert {r.scenario for r in kvm_results.records(result)} == {"memslots.kvm"}


def test_boots_pool_into_more_repeats() -> None:
    one = S.parse(output(SMALL), SMALL)
    pooled = S.pooled([one, one])
    assert pooled.config.repeats == 4
    assert sorted({s.repeat for s in pooled.samples}) == [0, 1, 2, 3] and len(pooled.probes) == 12


def test_records_carry_the_host_they_ran_on() -> None:
    env = Environment(host_kernel="6.1.0-57-amd64", host_under_test="6.1.0-57-amd64 in TCG+SVM, L2 accel kvm")
    result = S.parse(output(SMALL), SMALL)
    result.environment = env.with_clock("icount:0", 1)
    (setup,) = [r for r in kvm_results.records(result) if r.metric == "setup_s_per_slot" and r.variant == {"slots": 8}]
    assert setup.scenario == "memslots.kvm_l1" and setup.environment["host_under_test"] == env.host_under_test
    assert setup.environment["clock"] == "icount:0" and setup.environment["kvm_module"] == "kvm_amd"
    assert setup.samples == pytest.approx([20e-6, 20e-6])


# --- real runs on this machine's /dev/kvm ----------------------------------------------
@pytest.mark.usefixtures("runnable")
def test_a_real_run_is_checked_as_kvm_benchs(program) -> None:
    result = S.run(LocalShell(), SMALL, program=program)
    doc = kvm_results.summarize(result)
    assert doc["probes_ok"] and vcpu_checks_ok(doc), doc["probes"]
    assert [r["slots"] for r in doc["runs"]] == [1, 8, 32] and result.vcpu_error is None
    for run in doc["runs"]:
        assert all(run[k] > 0 for k in ("setup_s_per_slot", "move_s_per_slot", "delete_s_per_slot"))
        assert run["repeats"] == 2 and run["vcpu_checks"]["touched_ok"] == [run["slots"]] * 2


@pytest.mark.usefixtures("runnable")
def test_a_run_without_the_vcpu_times_the_slots_alone(program) -> None:
    config = S.L1SlotsConfig(BenchConfig(slots=(4,), repeats=1, vcpu=False), deadline_s=60)
    (sample,) = S.run(LocalShell(), config, program=program).samples
    assert sample.vcpu is None and sample.setup_s > 0


@pytest.mark.usefixtures("runnable")
def test_an_mmio_pass_aimed_into_the_slots_fails_the_checks(tmp_path: Path) -> None:
    """Built to aim the MMIO pass at the slots' own pages: the writes stay
    in the guest, so no MMIO exit comes, and the checks say so."""
    aimed = build(tmp_path, "aimed", "-DMMIO_INTO_SLOTS=1")
    doc = kvm_results.summarize(S.run(LocalShell(), SMALL, program=aimed))
    assert doc["probes_ok"] and not vcpu_checks_ok(doc)
    assert {tuple(r["vcpu_checks"]["mmio_exits"]) for r in doc["runs"]} == {(0, 0)}


@pytest.mark.parametrize(
    ("status", "kind"),
    [(2, BadInput), (3, CapabilityMissing), (4, Timeout), (1, S.L1SlotsFailed), (9, GuestError)],
)
def test_statuses_become_memquals_errors(status: int, kind: type) -> None:
    error = l1_program.failure(status, "noise\nkvm_slots: what went wrong \x1b[2J\n", "kvm_slots", S.L1SlotsFailed)
    assert type(error) is kind and "what went wrong" in str(error) and "\x1b" not in str(error)


@pytest.mark.usefixtures("runnable")
def test_a_real_host_that_cannot_or_a_deadline_ends_it(program) -> None:
    too_many = S.L1SlotsConfig(BenchConfig(slots=(32765,), repeats=1, vcpu=False), deadline_s=60)
    with pytest.raises(CapabilityMissing, match="KVM_CAP_NR_MEMSLOTS"):
        S.run(LocalShell(), too_many, program=program)
    slow = S.L1SlotsConfig(BenchConfig(slots=(32764,), repeats=50, vcpu=False), deadline_s=1)
    with pytest.raises(Timeout, match="the deadline of 1 s passed during KVM_SET_USER_MEMORY_REGION"):
        S.run(LocalShell(), slow, program=program)

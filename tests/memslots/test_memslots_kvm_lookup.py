"""The per-access lookup measurement (host/memslots/kvm_lookup.py): the
guest loop against objdump, the layout, the statistics and the records from
synthetic VMs, and a small real run where /dev/kvm works (skipped with the
reason otherwise), including a check that must fail when a miss lands in a
slot."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from disassemble import instructions, needs_objdump

from memqual.host.core import kvm as K
from memqual.host.core import kvm_uapi as uapi
from memqual.host.core.errors import BadInput
from memqual.host.memslots import kvm_bench as B
from memqual.host.memslots import kvm_guest, kvm_lookup_results
from memqual.host.memslots import kvm_lookup as L


@needs_objdump
@pytest.mark.parametrize("write", [True, False])
def test_lookup_program_disassembles_as_documented(tmp_path, write: bool) -> None:
    lines = instructions(L.lookup_program(write, 3), tmp_path)
    access = "mov    DWORD PTR [esi],ebx" if write else "mov    ebx,ebx"
    assert [" ".join(x.split()) for x in lines] == [
        " ".join(x.split())
        for x in [
            "xor    ebx,ebx",
            "test   ecx,ecx",
            "je     0x10",
            "inc    ebx",
            access,
            access,
            access,
            "dec    ecx",
            "jmp    0x2",
            "mov    eax,ebx",
            "mov    dx,0x501",
            "out    dx,eax",
            "hlt",
            "jmp    0x17",
        ]
    ]


def test_null_loop_has_the_same_length_and_jumps() -> None:
    for unroll in (1, 8, 50):
        write, null = L.lookup_program(True, unroll), L.lookup_program(False, unroll)
        assert len(write) == len(null)
        assert sum(a != b for a, b in zip(write, null, strict=True)) == unroll  # only the ModRM byte of each access
        assert len(write) + L.NULL_ENTRY <= 2 * L.NULL_ENTRY  # both copies fit in the code page
    with pytest.raises(BadInput):
        L.lookup_program(True, 0)


@pytest.mark.parametrize("n", [1, 2, 32, 509, 32764])
def test_geometry_targets(n: int) -> None:
    geo = L.LookupConfig().geometry(n)
    targets = geo.targets()
    assert targets["ram_hit"] < geo.ram_bytes and targets["ram_hit"] >= 2 * L.NULL_ENTRY
    assert targets["miss"] >= geo.ram_bytes
    assert geo.top_gpa <= kvm_guest.GPA_CEILING
    if n == 1:
        assert "small_hit" not in targets
    else:
        small = targets["small_hit"]
        assert geo.small_gpa(geo.target_slot) == small and targets["miss"] == small + L.PAGE
        # the miss is in no slot: not RAM, and between small slots
        slots = [(0, geo.ram_bytes)] + [(geo.small_gpa(i), geo.small_gpa(i) + L.PAGE) for i in range(1, n)]
        assert not any(lo <= targets["miss"] < hi for lo, hi in slots)
        assert geo.small_host_offset(n - 1) + L.PAGE == geo.host_size


def test_config_refuses_what_cannot_run() -> None:
    with pytest.raises(BadInput, match="above 4 GiB"):
        L.LookupConfig(ram_mib=4000, slots=(32764,)).check()
    with pytest.raises(BadInput, match="KVM_CAP_NR_MEMSLOTS"):
        L.LookupConfig(slots=(40000,), ram_mib=64).check(32764)
    with pytest.raises(BadInput):
        L.LookupConfig(replicates=0).check()


def _synthetic(
    per_doubling: float, noise: list[float], slots=(1, 32, 509, 32764), vm_effect: float = 0.0
) -> L.LookupResult:
    """VMs whose miss and small-hit costs grow by ``per_doubling`` ns per
    doubling of N over a RAM hit that does not grow; ``noise`` is a
    per-replicate offset and ``vm_effect`` a per-doubling drift that hits
    every access of a VM alike (load, caches), which pairing must cancel."""
    config = L.LookupConfig(slots=slots, replicates=len(noise), rounds=3, iterations=100)
    result = L.LookupResult(config=config, nr_memslots=32764, kvm_module="kvm_test", host_kernel="6.x")
    for r, offset in enumerate(noise):
        for n in slots:
            common = offset + vm_effect * math.log2(n)
            ram = 180.0 + common
            cost = 200.0 + per_doubling * math.log2(n) + common
            kinds = [k for k in L.KINDS if n > 1 or k != "small_hit"]
            access = {k: [(ram if k == "ram_hit" else cost) + d for d in (-1, 0, 1)] for k in kinds}
            result.samples.append(
                L.VmSample(
                    slots=n,
                    replicate=r,
                    access_ns=access,
                    over_ram_ns={
                        k: [a - h for a, h in zip(access[k], access["ram_hit"], strict=True)]
                        for k in kinds
                        if k != "ram_hit"
                    },
                    null_ns_per_iteration=[8000.0] * 3,
                    raw_ns={k: [v + 900 for v in access[k]] for k in kinds},
                    wall_over_cpu=1.1,
                    setup_s=0.01,
                    checks={},
                )
            )
    result.model_nodes = {n: {"miss": 5, "ram_hit": 2} for n in slots}
    return result


def slope(result: L.LookupResult, kind: str, paired: bool | None = None) -> dict[str, Any]:
    """``slope_summary`` where the data has a slope to give."""
    fit = kvm_lookup_results.slope_summary(result, kind, paired)
    assert fit is not None, f"no slope for {kind}"
    return fit


def test_slope_recovers_a_known_growth_and_says_when_it_is_resolved() -> None:
    fit = slope(_synthetic(4.0, [0.0, 1.0, -1.0]), "miss")
    assert fit["paired_with_ram_hit"] and fit["mean_ns"] == pytest.approx(4.0)
    assert fit["ci95_ns"][0] - 1e-9 <= 4.0 <= fit["ci95_ns"][1] + 1e-9 and fit["resolved"]
    assert len(fit["slopes_ns"]) == 3
    assert slope(_synthetic(4.0, [0.0, 1.0, -1.0]), "ram_hit")["mean_ns"] == pytest.approx(0.0)
    small = slope(_synthetic(4.0, [0.0, 1.0, -1.0]), "small_hit")
    assert small["slots"] == [32, 509, 32764]  # no small slot at N = 1
    # Replicates that disagree by a slope's worth each: not resolved.
    noisy = _synthetic(0.0, [0.0, 0.0, 0.0])
    for v in noisy.samples:
        if v.replicate == 1:
            v.over_ram_ns["miss"] = [x + 30 * math.log2(v.slots) for x in v.over_ram_ns["miss"]]
    assert not slope(noisy, "miss")["resolved"]


def test_pairing_with_the_ram_hit_cancels_what_hits_every_access_alike() -> None:
    """A drift of -3 ns per doubling on every access of a VM (seen here
    under load) shows in the unpaired slope and not in the paired one."""
    result = _synthetic(1.0, [0.0, 2.0, -2.0], vm_effect=-3.0)
    assert slope(result, "miss")["mean_ns"] == pytest.approx(1.0)
    assert slope(result, "miss", paired=False)["mean_ns"] == pytest.approx(-2.0)
    assert slope(result, "ram_hit")["mean_ns"] == pytest.approx(-3.0)


def test_records_shape() -> None:
    result = _synthetic(2.0, [0.0, 3.0, -2.0])
    records = kvm_lookup_results.records(result)
    points = [r for r in records if r.metric == "access_ns"]
    assert len(points) == 3 * 4 - 1
    miss32 = next(r for r in points if r.variant == {"kind": "miss", "slots": 32})
    assert (miss32.scenario, miss32.unit, miss32.better) == ("memslots.kvm_lookup", "ns", "lower")
    assert miss32.n_replicates == 3 and all(len(g) == 3 for g in miss32.replicates)
    assert miss32.settings == result.config.settings()
    assert {"median_ns", "ci95_ns", "resolved", "subtraction", "model_rbtree_nodes"} <= set(miss32.extra)
    slopes = [r for r in records if r.metric == "ns_per_doubling"]
    assert sorted(r.variant["kind"] for r in slopes) == sorted(L.KINDS)
    for r in slopes:
        assert r.replicates == [[s] for s in r.extra["fit"]["slopes_ns"]]
        assert r.variant.keys() == {"kind"}
        assert (r.extra["fit_over_null"] is None) == (r.variant["kind"] == "ram_hit")
    assert "over_ram_hit" in miss32.extra


@pytest.fixture
def kvm(kvm: K.Kvm) -> K.Kvm:
    """conftest's /dev/kvm, which must also run the lookup guest: it reports
    through an ioeventfd, on a vCPU."""
    if not kvm.check_extension(uapi.KVM_CAP_IOEVENTFD):
        pytest.skip("/dev/kvm has no KVM_CAP_IOEVENTFD")
    reason = B.probe_vcpu(kvm)  # the capability, checked before the attempt
    if reason is not None:
        pytest.skip(reason)
    return kvm


SMALL = L.LookupConfig(slots=(1, 8), replicates=1, rounds=2, iterations=50, ram_mib=4)


def test_real_vm_checks_every_pass(kvm) -> None:
    sample = L.run_vm(kvm, 8, 0, SMALL)
    assert set(sample.access_ns) == set(L.KINDS)
    assert all(len(v) == SMALL.rounds for v in sample.access_ns.values())
    assert sample.checks["eventfd_misses"] == sample.checks["expected_misses"] > 0
    assert sample.checks["ram_word"] == sample.checks["small_word"] == SMALL.iterations
    assert all(x > 0 for x in sample.raw_ns["miss"])


def test_a_miss_that_lands_in_a_slot_fails(kvm, monkeypatch) -> None:
    """Point the miss at the small slot: its writes hit memory, the
    ioeventfd never fires, and the run fails instead of timing a hit as a
    miss."""

    def targets(self):
        small = self.small_gpa(self.target_slot)
        return {"ram_hit": self.ram_bytes // 2, "small_hit": small, "miss": small}

    monkeypatch.setattr(L.LookupGeometry, "targets", targets)
    with pytest.raises(L.LookupCheckFailed, match="ioeventfd counted 0"):
        L.run_vm(kvm, 8, 0, SMALL)


def test_small_run_end_to_end(kvm) -> None:
    result = L.run_lookup(dataclasses.replace(SMALL, replicates=2))
    doc = kvm_lookup_results.summarize(result)
    assert set(doc["points"]["miss"]) == {"1", "8"} and set(doc["points"]["small_hit"]) == {"8"}
    assert set(doc["per_doubling"]) == {"miss", "ram_hit"}
    assert len(result.samples) == 4


def test_lookup_cli_checks_the_device_first(tmp_path, capsys) -> None:
    from memqual.host.cli import main as cli

    plain = tmp_path / "not-kvm"
    plain.write_text("")
    status = cli.main(["memslots", "kvm", "--lookup", "--device", str(plain), "--slots", "1"])
    assert status == 2
    assert "not a character device" in capsys.readouterr().err

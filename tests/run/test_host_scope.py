"""A host patch qualifies what it touches (host/run/host_scope.py): the
files of a patch against the scenario table's host_paths, table-driven
over the real rows; and what ``memqual run --host-patch`` built carried
through the run into comparison.json and comparison.html."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from fake_avocado import ksm_record, run_args
from kernel_tree import unpacked_tree
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.core import host_code, scenario
from memqual.host.core.profiles import AB, QUICK
from memqual.host.judge import host_under_test_plan as plan
from memqual.host.run import host_scope as hs
from memqual.host.run import job as runjob
from memqual.host.run import patch_scope as ps
from memqual.images.built_kernels import BuiltKernel
from memqual.images.kernel_arms import PatchArms
from memqual.images.kernel_patches import Patch

# The balloon's rows in the ab profile whose tests a host under test runs
# (its own guests' clock; free page reporting's RSS watched in L1), and the
# one it cannot (the floor's stall window the host paces)
BALLOON_RUN = ("balloon.deflate", "balloon.free_page_reporting", "balloon.inflate", "balloon.request_size")
BALLOON_DROPPED = ("balloon.floor",)
# KVM's rows in the ab profile: the guests' exits and nested faults, the
# balloon's hand-over, also on L1's huge page pool, the slot operations in
# L1; the /dev/kvm memslot benchmarks of this machine are left out
KVM_RUN = (*BALLOON_RUN, "fault.anon", "hugetlbfs.balloon", "memslots.kvm_l1")
KVM_DROPPED = (*BALLOON_DROPPED, "memslots.kvm", "memslots.kvm_lookup")
KSM_RUN = ("ksm.merge", "ksm.volatile_scan")  # on L1's ksmd
KSM_DROPPED = ("ksm.many_guests",)  # this machine's KSM
# What an unscoped host patch's run skips in the ab profile
AB_DROPPED = (*KVM_DROPPED, *KSM_DROPPED, "memslots.trace_mmio")


@pytest.mark.parametrize(
    ("files", "only", "kind", "scenarios", "dropped", "reason"),
    [
        # KVM alone: the fault and the balloon's hand-over, never KSM's,
        # whose ksmd runs none of it
        (("arch/x86/kvm/mmu/mmu.c",), (), ps.SCOPED, KVM_RUN, KVM_DROPPED, ""),
        (("virt/kvm/kvm_main.c", "include/linux/kvm_host.h"), (), ps.SCOPED, KVM_RUN, KVM_DROPPED, ""),
        (("arch/x86/kvm/svm/nested.c",), ("fault",), ps.SCOPED, ("fault.anon",), (), ""),
        # ksmd: the host's KSM rows, not the guest's own ksmd (ksm.guest_merge)
        (("mm/ksm.c",), (), ps.SCOPED, KSM_RUN, KSM_DROPPED, ""),
        (("lib/xxhash.c",), ("ksm",), ps.SCOPED, KSM_RUN, KSM_DROPPED, ""),  # the checksum of every page ksmd covers
        # the anonymous fault path on the host: the fault and what gives pages back or takes them
        (("mm/gup.c",), (), ps.SCOPED, (*BALLOON_RUN, "fault.anon"), BALLOON_DROPPED, ""),
        (("mm/madvise.c",), (), ps.SCOPED, (*BALLOON_RUN, "hugetlbfs.balloon"), BALLOON_DROPPED, ""),
        # hugetlbfs: the balloon on L1's pool
        (("mm/hugetlb.c",), (), ps.SCOPED, ("hugetlbfs.balloon",), (), ""),
        # documentation beside code: only the code scopes the run
        (("Documentation/admin-guide/mm/ksm.rst", "mm/ksm.c"), (), ps.SCOPED, KSM_RUN, KSM_DROPPED, ""),
        # a file no row names: everything --only selects, naming what a host under test skips
        (("kernel/sched/core.c",), (), ps.EVERYTHING, (), AB_DROPPED, "kernel/sched/core.c is in no scenario's"),
        (("mm/ksm.c", "include/linux/mm.h"), ("ksm",), ps.EVERYTHING, (), KSM_DROPPED, "include/linux/mm.h is in no"),
        (("arch/x86/kvm/Kconfig",), (), ps.EVERYTHING, (), AB_DROPPED, "can change the config both host kernels have"),
        ((), (), ps.EVERYTHING, (), AB_DROPPED, "touches no file"),
        # refused: what no kernel builds, or host code only unselected rows exercise
        (("Documentation/virt/kvm/api.rst",), (), ps.NOTHING, (), (), "no host kernel builds any of it"),
        (("MAINTAINERS",), ("fault",), ps.NOTHING, (), (), "no host kernel builds"),
        (("arch/x86/kvm/mmu/mmu.c",), ("ksm",), ps.NOTHING, (), (), "--only ksm in the ab profile runs none of them"),
        (("mm/ksm.c",), ("fault", "balloon"), ps.NOTHING, (), (), "only hugetlbfs.ksm, ksm.advisor"),
        (("mm/hugetlb.c",), ("ksm",), ps.NOTHING, (), (), "only hugetlbfs.balloon, hugetlbfs.ksm exercise"),
        # KVM's memslot code with --only memslots: the slot operations in L1
        (
            ("virt/kvm/kvm_main.c",),
            ("memslots",),
            ps.SCOPED,
            ("memslots.kvm_l1",),
            ("memslots.kvm", "memslots.kvm_lookup"),
            "",
        ),
        # refused: only rows whose tests a host under test cannot run
        (
            ("virt/kvm/kvm_main.c",),
            ("kvm",),
            ps.NOTHING,
            (),
            ("memslots.kvm", "memslots.kvm_lookup"),
            "memslots.kvm_lookup (it drives this machine's /dev/kvm; in L1 it is `memqual memslots kvm --lookup",
        ),
        (
            ("kernel/sched/core.c",),
            ("kvm",),
            ps.NOTHING,
            (),
            ("memslots.kvm", "memslots.kvm_lookup"),
            "but a host under test runs none of the scenarios --only kvm in the ab profile selects",
        ),
    ],
)
def test_host_patch_scope_by_the_files_it_touches(
    files: tuple[str, ...],
    only: tuple[str, ...],
    kind: str,
    scenarios: tuple[str, ...],
    dropped: tuple[str, ...],
    reason: str,
) -> None:
    scope = hs.host_scope_of(files, scenario.table(), AB, only)
    assert scope.kind == kind, scope.reason
    assert tuple(sorted(c.scenario for c in scope.chosen)) == tuple(sorted(scenarios))
    assert tuple(sorted(d.scenario for d in scope.dropped)) == tuple(sorted(dropped))
    assert reason in scope.reason and scope.side == ps.HOST and scope.controls == ()
    assert all(d.reason in scope.line() for d in scope.dropped)  # each left out with why
    if kind == ps.SCOPED:
        assert scope.line().startswith("the host patch touches host code ")
        assert "--all-scenarios" in scope.line() and all(name in scope.line() for name in scenarios)
        for chosen in scope.chosen:  # why each was kept: the files its host_paths name
            row = scenario.find(chosen.scenario)
            assert row is not None and chosen.files and all(row.exercises_on_host(f) for f in chosen.files)
        assert set(scope.tests) <= plan.tests()  # only tests a host under test runs
    elif kind == ps.NOTHING:
        assert scope.line().startswith("nothing to qualify: ") and scope.test_scope() is None
        # --all-scenarios leaves out what a host under test cannot run too: no use saying it
        assert ("--all-scenarios" in scope.line()) == (not dropped)
    else:
        assert scope.line().startswith("running every scenario") and scope.test_scope() is None


def test_the_profile_decides_which_rows_a_host_patch_runs() -> None:
    """In the quick profile KSM's untagged rows run too (those a host under
    test can run), hugetlbfs.ksm (slow) still not; a guest patch of
    mm/ksm.c chose the guest's own ksmd."""
    scope = hs.host_scope_of(("mm/ksm.c",), scenario.table(), QUICK)
    assert [c.scenario for c in scope.chosen] == ["ksm.advisor", "ksm.integrity", "ksm.merge", "ksm.volatile_scan"]
    assert [d.scenario for d in scope.dropped] == ["ksm.many_guests"]
    assert [c.scenario for c in ps.scope_of(("mm/ksm.c",), scenario.table(), AB).chosen] == ["ksm.guest_merge"]


def test_a_scoped_host_run_names_its_tests_and_no_control_rides_along() -> None:
    scope = hs.host_scope_of(("mm/ksm.c",), scenario.table(), AB)
    tests = scope.test_scope("e2e")
    assert tests is not None
    assert tests.blocks == (
        "e2e/test_ksm.py:KsmTest.test_merge$",
        "e2e/test_ksm.py:KsmTest.test_volatile_scan_4k$",
    )
    assert tests.checks == ("e2e/test_boot.py", "e2e/test_ksm.py")
    record = scope.to_json()
    assert record["side"] == "host" and record["controls"] == [] and record["scenarios"]["ksm.merge"] == ["mm/ksm.c"]
    many = scenario.find("ksm.many_guests")
    assert many is not None and record["dropped"] == {"ksm.many_guests": many.off_a_host_under_test}
    # a guest patch's record says its side too, and drops nothing
    guest = ps.scope_of(("mm/ksm.c",), scenario.table(), AB).to_json()
    assert guest["side"] == "guest" and "dropped" not in guest


def test_every_row_names_host_paths_of_the_groups_or_none_on_purpose() -> None:
    """Only the rows whose primaries no host code computes name none: the
    guest's own ksmd and the MMIO trace replayed through memqual's model."""
    bare = sorted(row.name for row in scenario.table() if not row.host_paths)
    assert bare == ["ksm.guest_merge", "memslots.trace_mmio"]
    groups = set(host_code.joined(host_code.KVM, host_code.ANON_FAULT, host_code.GIVE_BACK))
    groups |= set(host_code.KSMD) | set(host_code.HUGETLB)
    for row in scenario.table():
        assert set(row.host_paths) <= groups, row.name
        assert len(set(row.host_paths)) == len(row.host_paths), row.name


def test_a_host_path_outside_the_tree_is_a_mistake_of_the_row() -> None:
    with pytest.raises(ValueError, match="kernel path '/virt/kvm/'"):
        scenario.Scenario("x.y", host_paths=("/virt/kvm/",))


@pytest.mark.skipif(
    unpacked_tree() is None, reason="no unpacked kernel tree (a kept base) under /var/tmp/memqual-kbuild"
)
def test_every_host_path_is_in_the_kernel_tree() -> None:
    """Each row's host_paths name files or folders of Debian's
    linux-source-6.1, the host kernels' default source."""
    tree = unpacked_tree()
    assert tree is not None
    for row in scenario.table():
        for pattern in row.host_paths:
            found = list(tree.glob(pattern.rstrip("/"))) if "*" in pattern or "?" in pattern else [tree / pattern]
            assert any(p.exists() for p in found), f"{row.name}: {pattern}"


def _built(tmp_path: Path, name: str, source: str) -> BuiltKernel:
    return BuiltKernel(name, "6.1.192", tmp_path / name, source, "0" * 64, (), (), "gcc", "0" * 16)


def _host_patch_run(tmp_path: Path, second_source: str = "") -> hs.HostPatchRun:
    """What run --host-patch would have built for a patch of mm/ksm.c (no build)."""
    source = "linux-source-6.1 6.1.192-3"
    patch = Patch(tmp_path / "0001-ksm.patch", b"", "f" * 64, "mm/ksm: scan \x1b[2J less", ("mm/ksm.c",))
    arms = PatchArms(
        _built(tmp_path, f"6.1.192-memqual-{'a' * 16}", source),
        _built(tmp_path, f"6.1.192-memqual-{'b' * 16}", second_source or source),
        (patch,),
        (),
        ("kernel/mm/ksm.o: differs",),
    )
    scope = hs.host_scope_of(("mm/ksm.c",), scenario.table(), AB)
    return hs.HostPatchRun(arms, scope, ("debian:6.1",), ("images/host.config",))


def test_the_axis_names_the_patch_by_file_and_sha256_on_its_source(tmp_path: Path) -> None:
    run = _host_patch_run(tmp_path)
    assert run.axis() == "host patch: 0001-ksm.patch (sha256 ffffffffffff), on linux-source-6.1 6.1.192-3"
    assert run.arm_names() == (
        f"A host 6.1.192-memqual-{'a' * 16}",
        f"B host 6.1.192-memqual-{'b' * 16} (+ mm/ksm: scan \x1b[2J less)",
    )
    two = _host_patch_run(tmp_path, "/src/linux@v6.2")
    assert two.axis().endswith("on linux-source-6.1 6.1.192-3 (B from /src/linux@v6.2)")
    none = dataclasses.replace(two, arms=dataclasses.replace(two.arms, patches=()))
    assert none.axis() == "host kernel source: linux-source-6.1 6.1.192-3 against /src/linux@v6.2"
    assert none.arm_names()[1].endswith("(+ a second source)")
    record = run.to_json()
    assert record["axis"] == run.axis() and record["scope"]["side"] == "host"
    assert record["patches"][0]["text"] == "host-patch/1-0001-ksm.patch"
    assert record["host_kernel"] == [run.arms.a.name, run.arms.b.name] and record["sources"] == ["debian:6.1"]


def test_a_host_patch_run_is_named_by_its_patch_in_comparison_json_and_html(tmp_path, fake) -> None:
    """What run --host-patch built reaches the comparison through the run's
    config (host/cli/host_patch.py hands it over, as run --patch its
    PatchRun): comparison.json's ``host_patch`` is its record, its axis
    and subject name the arms, and comparison.html says both; no
    host-patch.json is read back.  Its scope limits the blocks' tests."""
    fake.plan(
        tests=[
            {"name": "e2e/test_ksm.py:KsmTest.test_merge", "status": "PASS", "records": ksm_record(4.0)},
            {"name": "e2e/test_fault.py:FaultTest.test_anon", "status": "PASS", "records": ksm_record(4.0)},
            {"name": "e2e/test_boot.py:Boot.test_ssh", "status": "PASS", "once": True},
        ]
    )
    run = _host_patch_run(tmp_path)
    hosts = ["--host-kernel", run.arms.a.name, "--host-kernel", run.arms.b.name]
    config = dataclasses.replace(
        run_command.config_from_args(run_args(tmp_path, *hosts)),
        scope=run.scope.test_scope("e2e"),
        host_patch=run,
    )
    out = io.StringIO()
    runjob.run(config, Console(file=out, width=200))
    blocks = fake.calls()[1]
    assert "e2e/test_ksm.py:KsmTest.test_merge$" in blocks["argv"]
    assert not any("test_fault" in word for word in blocks["argv"])
    ran = out.getvalue()
    assert "host patch: 0001-ksm.patch (sha256 ffffffffffff), on linux-source-6.1 6.1.192-3" in ran
    assert not (config.output / "host-patch.json").exists()
    compared = json.loads((config.output / "comparison.json").read_text())
    assert compared["host_patch"] == json.loads(json.dumps(run.to_json()))
    assert compared["host_patch"]["axis"].startswith("host patch: 0001-ksm.patch (sha256 ffffffffffff)")
    assert [compared["arms"][x]["host"]["kernel"] for x in "AB"] == [run.arms.a.name, run.arms.b.name]
    assert "patch" not in compared  # the guest patch's key stays a guest patch's
    page = (config.output / "comparison.html").read_text()
    assert "The host patch under test" in page and "The patch under test" not in page
    assert "host patch: 0001-ksm.patch (sha256 ffffffffffff), on linux-source-6.1 6.1.192-3" in page
    assert f"B host 6.1.192-memqual-{'b' * 16} (+ mm/ksm: scan \\x1b[2J less)" in page and "\x1b" not in page
    assert "host-patch/1-0001-ksm.patch" in page and "the host patch touches host code ksm." in page

"""A patch qualifies what it touches (host/run/patch_scope.py): the files
of a patch against the scenario table's kernel_paths, table-driven over
the real rows, and a scoped run's avocado jobs limited to those tests."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from fake_avocado import guest_kernel_args, ksm_record, run_args
from kernel_tree import unpacked_tree
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.core import scenario
from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.profiles import AB, QUICK
from memqual.host.run import ab_run
from memqual.host.run import job as runjob
from memqual.host.run import patch_scope as ps

BALLOON_AB = (
    "balloon.deflate",
    "balloon.floor",
    "balloon.free_page_reporting",
    "balloon.inflate",
    "balloon.request_size",
    "hugetlbfs.balloon",
)
CONTROLS = ("memslots.kvm", "memslots.kvm_lookup")


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("virt/kvm/", "virt/kvm/kvm_main.c", True),
        ("virt/kvm/", "virt/kvm/pfncache/x.c", True),  # a folder: everything below it
        ("virt/kvm/", "virt/kvmx.c", False),
        ("mm/ksm.c", "mm/ksm.c", True),
        ("mm/ksm.c", "mm/ksm.c.orig", False),
        ("drivers/virtio/virtio_*.c", "drivers/virtio/virtio_mem.c", True),
        ("drivers/net/*", "drivers/net/x/y.c", False),  # * stays inside one folder, as in MAINTAINERS
        ("include/*/ksm.h", "include/linux/ksm.h", True),
        ("mm/page_?eporting.c", "mm/page_reporting.c", True),
        ("a.c", "xa.c", False),
    ],
)
def test_kernel_paths_read_as_maintainers_f_lines(pattern: str, path: str, matches: bool) -> None:
    assert scenario.kernel_path_matches(pattern, path) is matches


@pytest.mark.parametrize(
    ("files", "kind", "scenarios", "reason"),
    [
        # the balloon patch of docs/patches/: its driver's scenarios, in the ab profile
        (("drivers/virtio/virtio_balloon.c",), ps.SCOPED, BALLOON_AB, ""),
        # a header under include/ that one row names
        (("include/linux/ksm.h",), ps.SCOPED, ("ksm.guest_merge",), ""),
        (("include/uapi/linux/virtio_balloon.h", "mm/page_reporting.c"), ps.SCOPED, BALLOON_AB, ""),
        # documentation beside code: only the code scopes the run
        (("Documentation/admin-guide/mm/ksm.rst", "mm/ksm.c"), ps.SCOPED, ("ksm.guest_merge",), ""),
        (("mm/memory_hotplug.c",), ps.SCOPED, ("memslots.trace_mmio",), ""),
        # a file no row names: everything (one such file is enough)
        (("mm/page_alloc.c",), ps.EVERYTHING, (), "mm/page_alloc.c is in no scenario's kernel_paths"),
        (("drivers/virtio/virtio_balloon.c", "mm/page_alloc.c"), ps.EVERYTHING, (), "mm/page_alloc.c is in no"),
        (("include/linux/mm.h",), ps.EVERYTHING, (), "include/linux/mm.h is in no"),  # a header every guest includes
        (("virt/kvm/kvm_main.c",), ps.EVERYTHING, (), "in no scenario's"),  # the host's KVM: no guest row
        # a Kconfig (even one a row's folder holds) or scripts/: the config of every scenario may move
        (("mm/Kconfig",), ps.EVERYTHING, (), "mm/Kconfig can change the config"),
        (("drivers/virtio/Kconfig", "drivers/virtio/virtio_balloon.c"), ps.EVERYTHING, (), "drivers/virtio/Kconfig"),
        (("Documentation/Kconfig",), ps.EVERYTHING, (), "can change the config"),
        (("scripts/kconfig/conf.c",), ps.EVERYTHING, (), "can change the config"),
        # no file: everything (the A/A of an empty change)
        ((), ps.EVERYTHING, (), "touches no file"),
        # only what no guest kernel builds: nothing to qualify
        (("Documentation/mm/balloon.rst",), ps.NOTHING, (), "no guest kernel builds"),
        (("MAINTAINERS", "Documentation/virt/kvm/api.rst"), ps.NOTHING, (), "no guest kernel builds"),
        # virtio-mem's rows do not run in the ab profile's blocks: everything
        (("drivers/virtio/virtio_mem.c",), ps.EVERYTHING, (), "do not run in the ab profile"),
    ],
)
def test_patch_scope_by_the_files_it_touches(
    files: tuple[str, ...], kind: str, scenarios: tuple[str, ...], reason: str
) -> None:
    scope = ps.scope_of(files, scenario.table(), AB)
    assert scope.kind == kind, scope.reason
    assert tuple(sorted(c.scenario for c in scope.chosen)) == scenarios
    assert reason in scope.reason
    if kind == ps.SCOPED:
        assert scope.controls == CONTROLS  # the negative controls ride along
        assert "--all-scenarios" in scope.line() and all(name in scope.line() for name in scenarios)
        for chosen in scope.chosen:  # why each was kept: the files it names
            row = scenario.find(chosen.scenario)
            assert row is not None and chosen.files and all(row.exercises(f) for f in chosen.files)
    else:
        assert scope.test_scope() is None and scope.controls == ()


def test_the_profile_decides_which_rows_can_run() -> None:
    """virtio-mem's rows run in the quick profile (they have no ab tag)."""
    scope = ps.scope_of(("drivers/virtio/virtio_mem.c",), scenario.table(), QUICK)
    assert scope.kind == ps.SCOPED
    assert [c.scenario for c in scope.chosen] == ["virtio_mem.memslots", "virtio_mem.resize"]


def test_a_scoped_run_names_its_tests_and_checks_by_file() -> None:
    scope = ps.scope_of(("drivers/virtio/virtio_balloon.c",), scenario.table(), AB)
    tests = scope.test_scope("e2e")
    assert tests is not None
    assert "e2e/test_balloon.py:BalloonTiming.test_inflate_deflate_1g$" in tests.blocks
    assert "e2e/test_memslots_kvm.py:MemslotsKvm.test_lookup_cost_by_slot_count$" in tests.blocks  # a control
    assert not any("test_ksm" in ref for ref in tests.blocks)
    assert tests.checks == (
        "e2e/test_balloon.py",
        "e2e/test_balloon_driver.py",
        "e2e/test_boot.py",
        "e2e/test_hugetlbfs.py",
    )
    assert tests.references("once") == tests.checks and tests.references("blocks") == tests.blocks
    record = scope.to_json()
    assert record["kind"] == "scoped" and record["controls"] == list(CONTROLS)
    assert record["scenarios"]["balloon.inflate"] == ["drivers/virtio/virtio_balloon.c"]


def test_every_rows_test_and_the_kernel_checks_are_where_the_references_point() -> None:
    """A scoped run names tests by Scenario.e2e: each must be a method of
    its class in e2e/, or avocado would find nothing to run."""
    for row in scenario.table():
        if not row.e2e:
            continue
        stem, _, rest = row.e2e.partition(":")
        cls, _, method = rest.partition(".")
        text = (REPO_ROOT / "e2e" / f"{stem}.py").read_text()
        assert re.search(rf"class {cls}\b", text) and f"def {method}(" in text, row.name
    assert "tags=boot,kernel-checks" in (REPO_ROOT / "e2e" / ps.KERNEL_CHECKS_FILE).read_text()


@pytest.mark.skipif(
    unpacked_tree() is None, reason="no unpacked kernel tree (a kept base) under /var/tmp/memqual-kbuild"
)
def test_every_kernel_path_is_in_the_kernel_tree() -> None:
    """Each row's kernel_paths name files or folders of Debian's
    linux-source-6.1 (a kept base tree of memqual kernel build)."""
    tree = unpacked_tree()
    assert tree is not None
    for row in scenario.table():
        for pattern in row.kernel_paths:
            found = list(tree.glob(pattern.rstrip("/"))) if "*" in pattern or "?" in pattern else [tree / pattern]
            assert any(p.exists() for p in found), f"{row.name}: {pattern}"


def _patch_run(tmp_path: Path) -> ps.PatchRun:
    """What run --patch would have built for a patch of mm/ksm.c (no build)."""
    from memqual.images.built_kernels import BuiltKernel
    from memqual.images.kernel_arms import PatchArms
    from memqual.images.kernel_patches import Patch

    def built(name: str) -> BuiltKernel:
        return BuiltKernel(name, "6.18.0", tmp_path / name, "debian:6.18", "0" * 64, (), (), "gcc", "0" * 16)

    patch = Patch(tmp_path / "0001-ksm.patch", b"", "1" * 64, "mm/ksm: scan \x1b[2J less", ("mm/ksm.c",))
    arms = PatchArms(built(f"6.18.0-{'a' * 16}"), built(f"6.18.0-{'b' * 16}"), (patch,), ("CONFIG_KSM: y -> n",))
    return ps.PatchRun(arms, ps.scope_of(("mm/ksm.c",), scenario.table(), AB))


def test_a_patch_run_limits_its_jobs_to_the_scope_and_names_its_arms(tmp_path, fake, monkeypatch) -> None:
    """The scope reaches avocado: the once-per-arm job names the checks'
    files, the blocks job the kept tests, both still under the ab filters.
    And what run --patch built is handed to the run (host/cli/kernel.py):
    comparison.json's ``patch`` is its record and the arms are named by
    it, with no OUTPUT/patch.json read back."""
    fake.plan(
        tests=[
            {"name": "e2e/test_ksm.py:KsmTest.test_guest_ksm", "status": "PASS", "records": ksm_record(4.0)},
            {"name": "e2e/test_ksm.py:KsmTest.test_volatile_scan_4k", "status": "PASS", "records": ksm_record(4.0)},
            {"name": "e2e/test_boot.py:Boot.test_ssh", "status": "PASS", "once": True},
        ]
    )
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    patch = _patch_run(tmp_path)
    config = dataclasses.replace(
        run_command.config_from_args(run_args(tmp_path, *guest_kernel_args(tmp_path))),
        scope=patch.scope.test_scope("e2e"),
        patch=patch,
    )
    out = io.StringIO()
    runjob.run(config, Console(file=out, width=120))
    once, blocks = fake.calls()[:2]
    assert "e2e/test_boot.py" in once["argv"] and "e2e/test_ksm.py" in once["argv"]
    assert str(tmp_path / "e2e") not in once["argv"] + blocks["argv"]  # not the whole folder
    assert "e2e/test_ksm.py:KsmTest.test_guest_ksm$" in blocks["argv"]
    assert "--filter-by-tags=ab,-slow,-boot,-hosts,-host-under-test" in blocks["argv"]
    ran = out.getvalue()
    assert "KsmTest.test_guest_ksm;b1-A: PASS" in ran and "test_volatile_scan_4k" not in ran
    assert not (config.output / "patch.json").exists()
    compared = json.loads((config.output / "comparison.json").read_text())
    assert compared["patch"] == json.loads(json.dumps(patch.to_json()))
    assert compared["patch"]["scope"]["kind"] == ps.SCOPED
    assert compared["patch"]["config_diff"] == ["CONFIG_KSM: y -> n"]
    page = (config.output / "comparison.html").read_text()
    assert f"B 6.18.0-{'b' * 16} (+ mm/ksm: scan \\x1b[2J less)" in page and "\x1b" not in page

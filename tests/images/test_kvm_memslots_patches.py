"""The KVM memslot search patches of the host under test
(images/kvm-memslots/README.md): what each patch names and changes, read
as ``memqual kernel build --patch`` reads it, and that each applies with
``patch -p1`` on Debian's linux-source-6.1 6.1.192, 0001 first.  The
source is a kept base tree of ``memqual kernel build`` when there is one
(two files copied: fast), else the two files streamed out of the source
.deb in the cache (about 15 s, once for the module: the only way to know
the patch applies is the source it is for); the apply tests skip without
either."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memqual.host.core.paths import REPO_ROOT
from memqual.host.memslots.structures import STRUCTURES
from memqual.images.kernel_patches import read_patch

PATCHES = REPO_ROOT / "images" / "kvm-memslots"
TOUCHED = ("include/linux/kvm_host.h", "virt/kvm/kvm_main.c")
KBUILD = Path("/var/tmp/memqual-kbuild")
SOURCE_DEB = "linux-source-6.1_6.1.192-3_all.deb"


@dataclasses.dataclass(frozen=True)
class Case:
    file: str
    structure: str
    cache: int  # KVM_MEMSLOT_CACHE after the patch: 1 keeps 6.1's last-used slots
    slots_cap: str  # KVM_MEM_SLOTS_NUM after the patch
    subject: str


COUNTED = Case("0001-kvm-count-memslot-lookups.patch", "rbtree", 1, "SHRT_MAX", "KVM: count memslot lookups")
CASES = (
    COUNTED,
    Case("0002-kvm-memslots-2011-array.patch", "linear", 0, "512", "KVM: search memslots as the 2011 array"),
    Case(
        "0003-kvm-memslots-weight-balanced-tree.patch",
        "tree2011",
        0,
        "SHRT_MAX",
        "KVM: search memslots as the 2011 weight-balanced tree",
    ),
    Case(
        "0004-kvm-memslots-sorted-by-size.patch", "reorder", 0, "512", "KVM: search memslots as an array sorted by size"
    ),
)


def added(text: str, pattern: str) -> list[str]:
    """The groups of ``pattern`` on the patch's added lines."""
    return [m.group(1) for line in text.splitlines() if line.startswith("+") for m in [re.search(pattern, line)] if m]


def test_every_patch_in_the_folder_is_a_case() -> None:
    assert sorted(p.name for p in PATCHES.glob("*.patch")) == sorted(c.file for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.structure)
def test_each_patch_reads_as_a_kernel_build_reads_it(case: Case) -> None:
    patch = read_patch(PATCHES / case.file)
    assert patch.subject == case.subject
    assert patch.files == TOUCHED


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.structure)
def test_each_patch_names_its_structure_as_the_model_does(case: Case) -> None:
    text = (PATCHES / case.file).read_text()
    names = added(text, r'kvm_memslot_search\[\] = "([^"]+)"')
    assert names == [case.structure]
    assert case.structure in STRUCTURES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.structure)
def test_only_0001_keeps_the_cache_and_the_arrays_cap_the_slots(case: Case) -> None:
    text = (PATCHES / case.file).read_text()
    assert added(text, r"#define KVM_MEMSLOT_CACHE (\d)") == [str(case.cache)]
    assert added(text, r"#define KVM_MEM_SLOTS_NUM (\w+)") == ([] if case.slots_cap == "SHRT_MAX" else [case.slots_cap])


def test_the_counters_are_writable_and_the_name_is_not() -> None:
    text = (PATCHES / COUNTED.file).read_text()
    params = dict(re.findall(r"^\+module_param_named\((memslot_\w+), \w+, ulong, (0\d+)\);", text, re.M))
    assert params == {"memslot_lookups": "0644", "memslot_nodes": "0644", "memslot_misses": "0644"}
    assert "+module_param_cb(memslot_search, &memslot_search_ops, NULL, 0444);" in text


def _kept_tree() -> Path | None:
    try:
        trees = [p / "linux" for p in sorted(KBUILD.glob("base-*"))]
    except OSError:
        return None
    for tree in trees:
        try:
            if "SUBLEVEL = 192\n" in (tree / "Makefile").read_text() and all((tree / f).is_file() for f in TOUCHED):
                return tree
        except OSError:
            continue
    return None


def _source_deb() -> Path | None:
    deb = Path.home() / ".cache" / "memqual" / "debs" / SOURCE_DEB
    return deb if deb.is_file() and shutil.which("dpkg-deb") and shutil.which("xz") else None


def _from_deb(deb: Path, into: Path) -> None:
    inner = "./usr/src/linux-source-6.1.tar.xz"
    members = [f"linux-source-6.1/{f}" for f in TOUCHED]
    script = 'dpkg-deb --fsys-tarfile "$1" | tar -xO "$2" | xz -dc | tar -x -C "$3" --strip-components=1 "$4" "$5"'
    subprocess.run(["sh", "-c", script, "sh", str(deb), inner, str(into), *members], check=True, timeout=300)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two files the patches touch, as Debian's 6.1.192 has them."""
    into = tmp_path_factory.mktemp("linux-6.1.192")
    tree = _kept_tree()
    deb = _source_deb()
    if tree is not None:
        for name in TOUCHED:
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / name, into / name)
    elif deb is not None:
        _from_deb(deb, into)
    else:
        pytest.skip(f"no kept 6.1.192 base tree under {KBUILD} and no {SOURCE_DEB} in the cache")
    return into


def _patch(tree: Path, case: Case, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["patch", "-p1", "--batch", "--forward", *extra, "-i", str(PATCHES / case.file)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.structure)
def test_each_patch_applies_on_the_source_after_0001(case: Case, source: Path, tmp_path: Path) -> None:
    tree = tmp_path / "linux"
    shutil.copytree(source, tree)
    if case is not COUNTED:
        first = _patch(tree, COUNTED)
        assert first.returncode == 0, first.stdout + first.stderr
    result = _patch(tree, case, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "offset" not in result.stdout and "fuzz" not in result.stdout, result.stdout


def test_a_search_patch_does_not_apply_without_0001(source: Path, tmp_path: Path) -> None:
    tree = tmp_path / "linux"
    shutil.copytree(source, tree)
    result = _patch(tree, CASES[1], "--dry-run")
    assert result.returncode != 0

"""The KVM memslot search patches of the host under test
(images/kvm-memslots/README.md): what each patch names and changes, read
as ``memqual kernel build --patch`` reads it; that each applies with
``patch -p1`` on Debian's linux-source-6.1 6.1.192, 0001 first; and that
the search of 0002-0004, their own C functions compiled in user space
(kvm_memslots_harness.c), finds the slot the model finds and counts the
nodes the model counts, over random registrations, deletions and lookups
and the shipped layouts.  The source is a kept base tree of ``memqual
kernel build`` when there is one (two files copied: fast), else the two
files streamed out of the source .deb in the cache (about 15 s, once for
the module: the only way to know the patch applies is the source it is
for); those tests skip without either, or without a C compiler."""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memqual.host.core.paths import REPO_ROOT
from memqual.host.memslots.layout import SHIPPED_LAYOUTS, Slot, load_layout
from memqual.host.memslots.slot_index import SlotIndex
from memqual.host.memslots.structures import STRUCTURES
from memqual.images.kernel_patches import read_patch

PATCHES = REPO_ROOT / "images" / "kvm-memslots"
TOUCHED = ("include/linux/kvm_host.h", "virt/kvm/kvm_main.c")
HARNESS = Path(__file__).resolve().parent / "kvm_memslots_harness.c"
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
    assert params == {n: "0644" for n in ("memslot_lookups", "memslot_nodes", "memslot_misses", "memslot_miss_nodes")}
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


# Each search patch's functions the harness pastes in: its search (in
# kvm_host.h) and the update of its structure (in kvm_main.c).
EXTRACTED = {
    "linear": ("LINEAR", ("kvm_array_replace",)),
    "tree2011": ("TREE2011", ("kvm_wbt_above", "kvm_wbt_rebuild")),
    "reorder": ("REORDER", ("kvm_reorder_replace",)),
}
SEARCHES = tuple(c for c in CASES if c.structure in EXTRACTED)


def c_function(source: str, name: str) -> str:
    """The definition of ``name`` in kernel C: from its declaration's first
    line to the closing brace in column 0."""
    match = re.search(rf"^static [^;{{]*?\b{name}\(", source, re.M | re.S)
    assert match is not None, f"no definition of {name}"
    return source[match.start() : source.index("\n}\n", match.start()) + 3]


@pytest.fixture(scope="module")
def harnesses(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The harness built for each search patch, from the patched source."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    built = {}
    for case in SEARCHES:
        folder = tmp_path_factory.mktemp(case.structure)
        tree = folder / "linux"
        shutil.copytree(source, tree)
        for patch in (COUNTED, case):
            result = _patch(tree, patch)
            assert result.returncode == 0, result.stdout + result.stderr
        define, functions = EXTRACTED[case.structure]
        header = (tree / TOUCHED[0]).read_text()
        main = (tree / TOUCHED[1]).read_text()
        pasted = [c_function(header, "__search_memslots"), *(c_function(main, f) for f in functions)]
        (folder / "extracted.c").write_text("\n".join(pasted))
        binary = folder / "harness"
        subprocess.run(
            [cc, "-O1", "-Wall", "-Werror", f"-D{define}", f"-I{folder}", "-o", str(binary), str(HARNESS)],
            check=True,
            timeout=60,
        )
        built[case.structure] = binary
    return built


def replay(harness: Path, model: SlotIndex, steps: list[tuple[str, Slot | int]]) -> None:
    """Run ``steps`` (insert a slot, delete an id, look up a gfn) through the
    kernel's code and the model; every lookup's slot and nodes must agree."""
    lines, expected = [], []
    for op, arg in steps:
        if op == "I":
            assert isinstance(arg, Slot)
            model.insert(arg)
            lines.append(f"I {arg.id} {arg.base_gfn} {arg.npages}")
        elif op == "D":
            assert isinstance(arg, int)
            model.delete(arg)
            lines.append(f"D {arg}")
        else:
            assert isinstance(arg, int)
            slot, nodes = model.lookup(arg)
            lines.append(f"L {arg}")
            expected.append(f"{-1 if slot is None else slot} {nodes}")
    out = subprocess.run([harness], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = out.stdout.splitlines()
    assert len(got) == len(expected)
    first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), None)
    assert first is None, f"lookup {first}: kernel {got[first]}, model {expected[first]}"


def random_steps(seed: int, count: int = 400) -> list[tuple[str, Slot | int]]:
    """Registrations (ids reused after deletion, sizes often equal, for the
    ties), deletions and lookups in and between the slots."""
    rng = random.Random(seed)
    live: dict[int, tuple[int, int]] = {}
    free = list(range(40))
    rng.shuffle(free)
    steps: list[tuple[str, Slot | int]] = []
    for _ in range(count):
        roll = rng.random()
        if free and (roll < 0.45 or not live):
            sid = free.pop()
            size = rng.choice([1, 4, 4, 16, 16, 100, rng.randint(1, 300)])
            base = rng.randrange(0, 20000)
            if all(base + size <= b or base >= b + n for b, n in live.values()):
                live[sid] = (base, size)
                steps.append(("I", Slot(id=sid, base_gfn=base, npages=size)))
            else:
                free.append(sid)
        elif roll < 0.65 and live:
            sid = rng.choice(sorted(live))
            del live[sid]
            free.append(sid)
            steps.append(("D", sid))
        else:
            steps.append(("L", rng.randrange(0, 20400)))
    return steps


@pytest.mark.parametrize("case", SEARCHES, ids=lambda c: c.structure)
def test_the_kernel_search_counts_what_the_model_counts(case: Case, harnesses: dict[str, Path]) -> None:
    for seed in range(20):
        replay(harnesses[case.structure], STRUCTURES[case.structure](), random_steps(seed))


@pytest.mark.parametrize("case", SEARCHES, ids=lambda c: c.structure)
@pytest.mark.parametrize("name", SHIPPED_LAYOUTS)
def test_the_kernel_search_counts_what_the_model_counts_on_a_shipped_layout(
    case: Case, name: str, harnesses: dict[str, Path]
) -> None:
    """Each slot's first and last frame and the frame after it (a miss, or
    the next slot), registered in the layout's order."""
    slots = load_layout(name).slots
    steps: list[tuple[str, Slot | int]] = [("I", slot) for slot in slots]
    for slot in slots:
        steps += [("L", slot.base_gfn), ("L", slot.end_gfn - 1), ("L", slot.end_gfn)]
    steps.append(("L", 0))
    replay(harnesses[case.structure], STRUCTURES[case.structure](), steps)


def test_the_comparison_fails_when_the_kernel_counts_otherwise(harnesses: dict[str, Path]) -> None:
    """The same steps replayed against another structure's model disagree:
    the comparison can tell the structures apart."""
    with pytest.raises(AssertionError, match="lookup"):
        replay(harnesses["linear"], STRUCTURES["reorder"](), random_steps(1))

"""memqual run --host-patch (host/cli/host_patch.py): host kernels A and B
built with images/host.config, handed to the run as --host-kernel twice with
the patch's scope and record, named in OUTPUT/host-patch.json; bad input,
and a patch that can move none of the selected scenarios, refused before
any build.  No kernel is built here: the builder is a fake."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from one_line_errors import in_process

from memqual.host.cli import host_patch, kernel, run
from memqual.host.cli.command import parser_for
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT
from memqual.images import kernel_arms, kernel_build
from memqual.images.built_kernels import BuiltKernel
from memqual.images.kernel_arms import PatchArms
from memqual.images.kernel_patches import read_patch
from memqual.images.kernel_sources import HOST_SOURCE

KVM_PATCH = (
    "Subject: [PATCH] KVM: x86/mmu: skip the walk\n---\n--- a/arch/x86/kvm/mmu/mmu.c\n+++ b/arch/x86/kvm/mmu/mmu.c\n"
    "@@ -1 +1 @@\n-int walk = 1;\n+int walk = 0;\n"
)
MM_PATCH = "--- a/mm/memory.c\n+++ b/mm/memory.c\n@@ -1 +1 @@\n-int fault;\n+int faults;\n"
DOCS_PATCH = "--- a/Documentation/virt/kvm/api.rst\n+++ b/Documentation/virt/kvm/api.rst\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """The inputs a case names by key: two patches, a fragment, bad ones."""
    made = {
        "kvm.patch": KVM_PATCH,
        "mm.patch": MM_PATCH,
        "docs.patch": DOCS_PATCH,
        "notes.txt": "no diff here\n",
        "extra.config": "CONFIG_KSM=y\n",
        "bad.config": "CONFIG_KSM=$(reboot)\n",
    }
    for name, text in made.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "src").mkdir()
    return {name.split(".")[0]: str(tmp_path / name) for name in [*made, "src", "missing.patch"]}


def _argv(tmp_path: Path, files: dict[str, str], words: list[str]) -> list[str]:
    """``memqual run`` with each {name} of ``words`` as that file's path."""
    return ["run", "--output", str(tmp_path / "out"), *(w.format(**files) for w in words)]


@pytest.fixture
def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any build fails the test: a refusal comes before the builder."""

    def called(*args: object, **kwargs: object) -> Any:
        pytest.fail(f"a build was started: {args}")

    monkeypatch.setattr(kernel_arms, "arms", called)
    monkeypatch.setattr(kernel_build, "build", called)


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--host-patch", "{kvm}", "--host-kernel", "6.1.0-57-amd64"], "or --host-kernel, not both"),
        ([*["--host-kernel-source", "{src}"] * 2, "--host-kernel", "6.12.111+deb12-amd64"], "not both"),
        (["--host-patch", "{kvm}", "--patch", "{mm}"], "one kernel axis"),
        (["--host-patch", "{kvm}", "--kernel-source", "{src}"], "one kernel axis"),
        (["--host-kernel-source", "{src}"], "one --host-kernel-source compares nothing"),
        (["--host-patch", "{kvm}", *["--host-kernel-source", "{src}"] * 3], "at most twice"),
        (["--host-patch", "{missing}"], "--host-patch .*missing.patch: no such file"),
        (["--host-patch", "{kvm}", "--host-patch", "{src}"], "--host-patch .*src: no such file"),
        (["--host-patch", "{notes}"], "--host-patch .*notes.txt: no unified diff"),
        (["--host-patch", "{kvm}", "--host-kernel-config", "{missing}"], "--host-kernel-config .*no such"),
        (["--host-patch", "{kvm}", "--host-kernel-config", "{bad}"], "--host-kernel-config .*bad.config:1"),
        (["--host-kernel-config", "{extra}"], "--host-kernel-config is for the host kernels"),
        # the run's own options, checked with the two host kernels stood in for
        (["--host-patch", "{kvm}", "--rounds", "0"], "--rounds must be at least 1"),
        (["--host-patch", "{kvm}", "--budget", "5"], "--budget applies to --until-decided only"),
        # a patch that can move none of the scenarios the run would run
        (["--host-patch", "{docs}"], "^memqual: error: nothing to qualify: .*no host kernel builds any of it"),
        (["--host-patch", "{kvm}", "--only", "ksm"], "nothing to qualify: only .*fault.anon.* --only ksm in the ab"),
        # ... or only scenarios whose tests a host under test skips, each named with why
        (
            ["--host-patch", "{kvm}", "--only", "kvm"],
            "nothing to qualify: only memslots.kvm, memslots.kvm_lookup .* a host under test runs none of them: "
            "memslots.kvm \\(it drives this machine's /dev/kvm from memqual's Python; in L1 memslots.kvm_l1 runs the "
            "same slot operations\\); "
            "memslots.kvm_lookup \\(it drives this machine's /dev/kvm; in L1 it is `memqual memslots kvm --lookup "
            "--host-kernel KERNEL`\\)$",
        ),
        (
            ["--host-patch", "{kvm}", "--only", "kvm", "--all-scenarios"],
            "--all-scenarios given, but a host under test runs none of the scenarios --only kvm .*"
            "memslots.kvm \\(it drives this machine's /dev/kvm",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_before_any_build(
    tmp_path: Path,
    files: dict[str, str],
    no_build: None,
    memqual_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    said: str,
) -> None:
    monkeypatch.setenv("MEMQUAL_STATE_DIR", str(tmp_path / "state"))
    result = in_process(_argv(tmp_path, files, words), {}, monkeypatch, capsys)
    assert result["status"] == 2, result
    lines = result["stderr"].splitlines()
    assert len(lines) == 1 and re.search(said, lines[0]), lines
    assert not (tmp_path / "out").exists()


def _built(tmp_path: Path, name: str, source: str) -> BuiltKernel:
    return BuiltKernel(name, "6.1.192", tmp_path / name, source, "0" * 64, (), (), "gcc", name[-16:])


class FakeArms:
    """``kernel_arms.arms`` as the build would answer: A and B by name, the
    patches read as the build reads them; each call kept."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.calls: list[tuple[list[str], list[str], list[str]]] = []

    def __call__(self, sources: list[str], patches: list[str], fragments: list[str], **kwargs: object) -> PatchArms:
        self.calls.append((list(sources), list(patches), list(fragments)))
        a = _built(self.tmp_path, f"6.1.192-memqual-{'a' * 16}", sources[0])
        b = dataclasses.replace(_built(self.tmp_path, f"6.1.192-memqual-{'b' * 16}", sources[-1]), build_s=95.4)
        return PatchArms(
            dataclasses.replace(a, cached=True),
            b,
            tuple(read_patch(p) for p in patches),
            ("CONFIG_KSM: n -> y",),
            ("arch/x86/kvm/kvm.ko: differs",),
        )


def _args(argv: list[str]) -> argparse.Namespace:
    """``memqual run`` with both patch options, parsed."""
    options = [kernel.RUN_PATCH, host_patch.RUN_HOST_PATCH]
    return parser_for(run.COMMAND, options=options).parse_args(argv)


@pytest.fixture
def fake_arms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeArms:
    fake = FakeArms(tmp_path)
    monkeypatch.setattr(kernel_arms, "arms", fake)
    return fake


@pytest.mark.parametrize(
    ("words", "sources", "scoped"),
    [
        ([], [HOST_SOURCE], True),  # the memslot host kernels' source
        (["--host-kernel-source", "{src}"], ["{src}"], True),
        # two sources whose differences are not listed: every scenario
        (["--host-kernel-source", "{src}", "--host-kernel-source", "debian:6.12"], ["{src}", "debian:6.12"], False),
    ],
)
def test_the_run_is_given_the_two_host_kernels_built_with_host_config(
    tmp_path: Path,
    files: dict[str, str],
    fake_arms: FakeArms,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    sources: list[str],
    scoped: bool,
) -> None:
    argv = _argv(
        tmp_path,
        files,
        ["--host-patch", "{kvm}", "--host-patch", "{mm}", "--host-kernel-param", "kvm.mmio_caching=0"],
    )
    args = _args([*argv, "--host-kernel-config", files["extra"], *(w.format(**files) for w in words)])
    seen: list[argparse.Namespace] = []

    def inner(given: argparse.Namespace) -> int:
        seen.append(given)
        return 0

    assert host_patch.run_with_host_patch(args, inner) == 0
    (given,) = seen
    assert given.host_kernel == [f"6.1.192-memqual-{'a' * 16}", f"6.1.192-memqual-{'b' * 16}"]
    assert given.host_kernel_param == ["kvm.mmio_caching=0"] and given.output == str(tmp_path / "out")
    assert not given.patch and not given.guest_kernel  # the guest side is the run's own default
    # the existing host-kernel path takes them: two hosts, two arms, the parameter on both
    config = run.config_from_args(given)
    assert [h.kernel.name for h in config.hosts] == given.host_kernel and len(config.pairing) == 2
    assert all(h.params == ("kvm.mmio_caching=0",) for h in config.hosts)
    ((built_sources, patches, fragments),) = fake_arms.calls
    assert built_sources == [s.format(**files) for s in sources]
    assert patches == [files["kvm"], files["mm"]]  # in order
    assert fragments == [str(kernel_build.HOST_CONFIG), files["extra"]]  # host.config first, the user's on top
    out = capsys.readouterr().out.splitlines()
    # the run is handed what was built and the scope, as run --patch hands over its PatchRun
    assert config.scope == given.test_scope and config.host_patch is given.host_patch_run
    assert config.host_patch.scope.line() == out[0] and config.patch is None  # said before the build
    if scoped:  # the KVM and fault path patches' scope: no KSM
        assert out[0].startswith("the host patch touches host code balloon.deflate, ") and "fault.anon" in out[0]
        assert given.test_scope is not None and "e2e/test_fault.py:FaultTest.test_anon$" in given.test_scope.blocks
        assert "ksm." not in out[0] and not any("test_ksm" in t for t in given.test_scope.blocks)
    else:
        assert out[0].startswith("running every scenario: two sources") and given.test_scope is None
    assert f"host A: 6.1.192-memqual-{'a' * 16} ({built_sources[0]}; cached)" in out
    assert f"host B: 6.1.192-memqual-{'b' * 16} ({built_sources[-1]}; built in 95 s)" in out
    assert any(line.startswith("host patch: KVM: x86/mmu: skip the walk (arch/x86/kvm/mmu/mmu.c;") for line in out)
    assert "config differences between host A and B: CONFIG_KSM: n -> y" in out
    assert "built differences between host A and B: arch/x86/kvm/kvm.ko: differs" in out


def test_host_patch_json_names_the_kernels_the_patches_and_their_texts(
    tmp_path: Path, files: dict[str, str], fake_arms: FakeArms
) -> None:
    args = _args(_argv(tmp_path, files, ["--host-patch", "{kvm}", "--host-patch", "{mm}"]))
    assert host_patch.run_with_host_patch(args, lambda given: 0) == 0
    out = tmp_path / "out"
    record = json.loads((out / "host-patch.json").read_text())
    assert record["host_kernel"] == [record["a"]["name"], record["b"]["name"]] == args.host_kernel
    assert record["sources"] == [HOST_SOURCE] and record["a"]["source"] == HOST_SOURCE
    assert record["config_fragments"] == [str(kernel_build.HOST_CONFIG)]
    assert record["config_diff"] == ["CONFIG_KSM: n -> y"] and record["built_diff"] == ["arch/x86/kvm/kvm.ko: differs"]
    assert record["scope"] == args.host_patch_run.scope.to_json() and record["scope"]["side"] == "host"
    assert record["scope"]["scenarios"]["fault.anon"] == ["arch/x86/kvm/mmu/mmu.c", "mm/memory.c"]
    assert record["axis"] == (
        f"host patches: kvm.patch (sha256 {hashlib.sha256(KVM_PATCH.encode()).hexdigest()[:12]}), "
        f"mm.patch (sha256 {hashlib.sha256(MM_PATCH.encode()).hexdigest()[:12]}), on {HOST_SOURCE}"
    )
    kvm, mm = record["patches"]
    assert (kvm["subject"], kvm["files"]) == ("KVM: x86/mmu: skip the walk", ["arch/x86/kvm/mmu/mmu.c"])
    assert (mm["subject"], mm["files"]) == ("mm.patch", ["mm/memory.c"])
    assert kvm["sha256"] == hashlib.sha256(KVM_PATCH.encode()).hexdigest()
    assert [p["text"] for p in record["patches"]] == ["host-patch/1-kvm.patch", "host-patch/2-mm.patch"]
    assert [(out / p["text"]).read_text() for p in record["patches"]] == [KVM_PATCH, MM_PATCH]
    assert not (out / "patch.json").exists()  # the guest patch's record is run --patch's alone


def test_a_patch_that_does_not_apply_is_named_as_a_host_patch(
    tmp_path: Path, files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(*args: object, **kwargs: object) -> PatchArms:
        raise BadInput("--patch kvm.patch does not apply: arch/x86/kvm/mmu/mmu.c hunk #1 (at line 1) fails")

    monkeypatch.setattr(kernel_arms, "arms", fails)
    args = _args(_argv(tmp_path, files, ["--host-patch", "{kvm}"]))
    with pytest.raises(BadInput, match=r"^--host-patch kvm.patch does not apply"):
        host_patch.run_with_host_patch(args, lambda given: 0)


def test_without_a_host_patch_the_run_is_untouched(tmp_path: Path) -> None:
    args = _args(["run", "--host-kernel", "6.1.0-57-amd64"])
    before = dict(vars(args))
    assert host_patch.run_with_host_patch(args, lambda given: 7) == 7
    assert vars(args) == before


def test_the_default_source_is_the_memslot_host_kernels_and_help_says_it(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (REPO_ROOT / "images/kvm-memslots/README.md").read_text()
    assert f"memqual kernel build {HOST_SOURCE} --config images/host.config" in readme
    assert kernel_build.HOST_CONFIG == (REPO_ROOT / "images/host.config").resolve()
    assert "CONFIG_KVM_AMD=m" in kernel_build.HOST_CONFIG.read_text()
    with pytest.raises(SystemExit):
        _args(["run", "--help"])
    assert f"default {HOST_SOURCE}" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("words", "line", "scoped"),
    [
        # --only narrows the scope: of the fault path's and KVM's rows, the fault's
        (["--host-patch", "{kvm}", "--only", "fault"], "the host patch touches host code fault.anon exercise (", True),
        # what a host under test skips is left out, and said
        (
            ["--host-patch", "{kvm}", "--only", "fault", "--only", "balloon"],
            "the host patch touches host code balloon.deflate, balloon.free_page_reporting, balloon.inflate, "
            "balloon.request_size, fault.anon exercise (of those --only fault balloon selects): running those; not "
            "run, as a host under test cannot "
            "run them: balloon.floor (the floor is the guest's own (its driver's and its reclaim's), and its probe "
            "stops at a stall of this machine's wall clock seen by polls from here, each one L1's work); ",
            True,
        ),
        # --all-scenarios: every scenario --only selects, even for a patch of documentation
        (["--host-patch", "{docs}", "--all-scenarios"], "running every scenario: --all-scenarios given", False),
        (["--host-patch", "{kvm}", "--all-scenarios", "--only", "ksm"], "running every scenario --only ksm", False),
    ],
)
def test_only_narrows_the_scope_and_all_scenarios_lifts_it(
    tmp_path: Path,
    files: dict[str, str],
    fake_arms: FakeArms,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    line: str,
    scoped: bool,
) -> None:
    args = _args(_argv(tmp_path, files, words))
    assert host_patch.run_with_host_patch(args, lambda given: 0) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(line)
    assert (args.test_scope is not None) is scoped
    if scoped:  # the fault's test, and none a host under test skips
        assert "e2e/test_fault.py:FaultTest.test_anon$" in args.test_scope.blocks
        assert not any("BalloonFloor" in b for b in args.test_scope.blocks)
        # free page reporting runs there, its RSS watched in L1
        reporting = any("FreePageReporting.test_reporting_on" in b for b in args.test_scope.blocks)
        assert reporting == ("balloon" in words)

"""memqual run --qemu-patch (host/cli/qemu_patch.py): QEMUs A and B built
from one source, A with the base patches, B with those and the patch,
handed to the run as --qemu twice and named in OUTPUT/qemu-patch.json; bad
input refused before any build.  No QEMU is built here: the builder is a
fake (tests/images/test_qemu_build.py builds a fake source for real)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from one_line_errors import in_process

from memqual.host.cli import host_patch, kernel, qemu_patch, run
from memqual.host.cli.command import parser_for
from memqual.host.core.errors import BadInput
from memqual.images import qemu_build, qemu_sources
from memqual.images.built_qemus import BuiltQemu
from memqual.images.kernel_patches import read_patch

FIX = "Subject: [PATCH] target/i386: once\n---\n--- a/target/i386/x.c\n+++ b/target/i386/x.c\n@@ -1 +1 @@\n-a\n+b\n"
COST = "Subject: [PATCH] virtio-balloon: cost\n---\n--- a/hw/virtio/b.c\n+++ b/hw/virtio/b.c\n@@ -1 +1 @@\n-c\n+d\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    made = {"fix.patch": FIX, "cost.patch": COST, "notes.txt": "no diff here\n"}
    for name, text in made.items():
        (tmp_path / name).write_text(text)
    return {name.split(".")[0]: str(tmp_path / name) for name in [*made, "missing.patch"]}


def _argv(tmp_path: Path, files: dict[str, str], words: list[str]) -> list[str]:
    return ["run", "--output", str(tmp_path / "out"), *(w.format(**files) for w in words)]


def _args(argv: list[str]) -> argparse.Namespace:
    options = [kernel.RUN_PATCH, host_patch.RUN_HOST_PATCH, qemu_patch.RUN_QEMU_PATCH]
    return parser_for(run.COMMAND, options=options).parse_args(argv)


def keep(seen: list[argparse.Namespace]) -> Callable[[argparse.Namespace], int]:
    """The run, standing in: what it was given kept."""

    def inner(given: argparse.Namespace) -> int:
        seen.append(given)
        return 0

    return inner


class FakeBuild:
    """``qemu_build.build`` as it would answer: a build named by its
    patches; each call kept."""

    def __init__(self, tmp_path: Path, fails: str = "") -> None:
        self.tmp_path = tmp_path
        self.fails = fails
        self.calls: list[tuple[str | None, list[str]]] = []

    def __call__(self, version: str | None, patch_paths: list[str], **kwargs: Any) -> BuiltQemu:
        self.calls.append((version, [str(p) for p in patch_paths]))
        if self.fails and any(Path(p).name == self.fails for p in patch_paths):
            raise BadInput(f"--patch {self.fails} does not apply: hw/virtio/b.c hunk #1 (at line 1) fails")
        key = f"{len(self.calls):012x}"
        patches = tuple(read_patch(p).record() for p in patch_paths)
        return BuiltQemu(
            f"7.2.22-{key}", self.tmp_path / key, "7.2.22", "qemu 1:7.2+dfsg-7", "0" * 64, patches, (), "gcc", key
        )


def resolved(version: str | None, cache: Path) -> str:
    """``qemu_sources.resolve`` without the archive: the version as Debian's."""
    return f"1:{version or 'system'}+dfsg-7"


@pytest.fixture
def fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBuild:
    fake = FakeBuild(tmp_path)
    monkeypatch.setattr(qemu_build, "build", fake)
    monkeypatch.setattr(qemu_sources, "resolve", resolved)
    return fake


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--qemu-patch", "{cost}", "--qemu", "7.2"], "give --qemu-patch or --qemu, not both"),
        (["--qemu-patch", "{cost}", "--patch", "{fix}"], "give one patch axis"),
        (["--qemu-patch", "{missing}"], "--qemu-patch .*missing.patch: no such file"),
        (["--qemu-patch", "{notes}"], "--qemu-patch .*notes.txt: no unified diff"),
        (["--qemu-patch", "{cost}", "--qemu-base-patch", "{missing}"], "--qemu-base-patch .*missing.patch: no such"),
        (["--qemu-source", "7.2"], "are for --qemu-patch's QEMUs"),
        (["--qemu-base-patch", "{fix}"], "are for --qemu-patch's QEMUs"),
        # the run's own options, checked with the two QEMUs stood in for
        (["--qemu-patch", "{cost}", "--rounds", "0"], "--rounds must be at least 1"),
        (["--qemu-patch", "{cost}", "--budget", "5"], "--budget applies to --until-decided only"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_any_build(
    tmp_path: Path,
    files: dict[str, str],
    memqual_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    said: str,
) -> None:
    def called(*args: object, **kwargs: object) -> Any:
        pytest.fail(f"a build was started: {args}")

    monkeypatch.setattr(qemu_build, "build", called)
    monkeypatch.setenv("MEMQUAL_STATE_DIR", str(tmp_path / "state"))
    result = in_process(_argv(tmp_path, files, words), {}, monkeypatch, capsys)
    assert result["status"] == 2, result
    lines = result["stderr"].splitlines()
    assert len(lines) == 1 and re.search(said, lines[0]), lines
    assert not (tmp_path / "out").exists()


def test_a_with_the_base_b_with_base_and_patch_run_as_two_qemus(
    tmp_path: Path, files: dict[str, str], fake_build: FakeBuild, capsys: pytest.CaptureFixture[str]
) -> None:
    words = ["--qemu-base-patch", "{fix}", "--qemu-patch", "{cost}", "--qemu-source", "7.2", "--only", "balloon"]
    args = _args(_argv(tmp_path, files, words))
    seen: list[argparse.Namespace] = []
    assert qemu_patch.run_with_qemu_patch(args, keep(seen)) == 0
    (given,) = seen
    # one source version, looked up once, for both
    assert fake_build.calls == [("1:7.2+dfsg-7", [files["fix"]]), ("1:7.2+dfsg-7", [files["fix"], files["cost"]])]
    assert given.qemu == ["7.2.22-000000000001", "7.2.22-000000000002"]
    config = run.config_from_args(given)
    assert len(config.pairing) == 2  # two QEMUs, one kernel: the QEMUs are the axis
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "running as --qemu 7.2.22-000000000001 --qemu 7.2.22-000000000002"
    assert any(line.startswith("QEMU B: 7.2.22-000000000002 (memqual build") and "+ cost.patch" in line for line in out)
    record = json.loads((tmp_path / "out" / "qemu-patch.json").read_text())
    assert record["a"]["name"] == given.qemu[0] and record["b"]["name"] == given.qemu[1]
    assert [p["subject"] for p in record["base_patches"]] == ["target/i386: once"]
    assert [p["subject"] for p in record["patches"]] == ["virtio-balloon: cost"]
    texts = sorted(p.name for p in (tmp_path / "out" / "qemu-patch").iterdir())
    assert texts == ["1-fix.patch", "2-cost.patch"]


@pytest.mark.parametrize(("fails", "option"), [("fix.patch", "--qemu-base-patch"), ("cost.patch", "--qemu-patch")])
def test_a_patch_that_does_not_apply_is_named_by_its_option(
    tmp_path: Path, files: dict[str, str], monkeypatch: pytest.MonkeyPatch, fails: str, option: str
) -> None:
    monkeypatch.setattr(qemu_build, "build", FakeBuild(tmp_path, fails=fails))
    monkeypatch.setattr(qemu_sources, "resolve", resolved)
    args = _args(_argv(tmp_path, files, ["--qemu-base-patch", "{fix}", "--qemu-patch", "{cost}"]))
    with pytest.raises(BadInput, match=f"^{option} {fails} does not apply"):
        qemu_patch.run_with_qemu_patch(args, lambda given: 0)


def test_without_a_qemu_patch_the_run_is_untouched(tmp_path: Path) -> None:
    args = _args(["run", "--qemu", "7.2"])
    seen: list[argparse.Namespace] = []
    assert qemu_patch.run_with_qemu_patch(args, keep(seen)) == 0
    assert seen[0].qemu == ["7.2"]


def test_a_patch_changed_during_the_builds_is_refused(
    tmp_path: Path, files: dict[str, str], fake_build: FakeBuild, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner = fake_build.__call__

    def edits_then_builds(version: str | None, patch_paths: list[str], **kwargs: Any) -> BuiltQemu:
        if len(patch_paths) == 2:  # B's build reads the file after someone changed it
            Path(files["cost"]).write_text(COST.replace("+d", "+e"))
        return inner(version, patch_paths, **kwargs)

    monkeypatch.setattr(qemu_build, "build", edits_then_builds)
    args = _args(_argv(tmp_path, files, ["--qemu-base-patch", "{fix}", "--qemu-patch", "{cost}"]))
    with pytest.raises(BadInput, match="a patch file changed while QEMU was built"):
        qemu_patch.run_with_qemu_patch(args, lambda given: 0)
    assert not (tmp_path / "out" / "qemu-patch.json").exists()


def test_a_source_the_archive_lacks_is_named_as_qemu_source(
    tmp_path: Path, files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def lacks(version: str | None, cache: Path) -> str:
        raise BadInput(f"--version {version}: the archive's qemu sources are 1:7.2+dfsg-7: give one of them")

    monkeypatch.setattr(qemu_sources, "resolve", lacks)
    args = _args(_argv(tmp_path, files, ["--qemu-patch", "{cost}", "--qemu-source", "9.9"]))
    with pytest.raises(BadInput, match="^--qemu-source 9.9: the archive's qemu sources are"):
        qemu_patch.run_with_qemu_patch(args, lambda given: 0)

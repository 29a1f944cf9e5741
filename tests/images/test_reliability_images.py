"""The image cache is checked on use: a damaged manifest or a file that no
longer matches its sha256 is one line naming the fix; a tampered agent is
built again; ``--modules`` that is no modules tree fails before anything is
hashed; builds of one entry are serialised."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from image_tools import needs_host_tools

from memqual.host.cli import main as cli
from memqual.images.build import CacheDamaged, Image, KernelSource, build


@needs_host_tools
def test_modules_that_are_no_modules_tree_fail_before_any_hashing(kernel: KernelSource, capsys) -> None:
    assert kernel.bzimage is not None
    started = time.monotonic()
    status = cli.main(["image", "build", "--kernel", str(kernel.bzimage), "--modules", "/usr"])
    assert time.monotonic() - started < 2
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert "/usr is no kernel modules tree" in err


@needs_host_tools
def test_a_damaged_manifest_is_one_line(kernel: KernelSource, capsys) -> None:
    image = build(kernel)
    (image.directory / "manifest.json").write_text("{not json")
    with pytest.raises(CacheDamaged, match=r"manifest.json is damaged .*memqual image build --force"):
        build(kernel)
    assert kernel.bzimage is not None and kernel.modules_dir is not None
    status = cli.main(["image", "build", "--kernel", str(kernel.bzimage), "--modules", str(kernel.modules_dir)])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err
    build(kernel, force=True)  # the fix the message names
    assert build(kernel).cached


@needs_host_tools
def test_a_manifest_of_the_wrong_shape_is_one_line(kernel: KernelSource) -> None:
    image = build(kernel)
    (image.directory / "manifest.json").write_text(json.dumps(["a", "list"]))
    with pytest.raises(CacheDamaged, match="is damaged"):
        build(kernel)


@needs_host_tools
def test_a_cached_file_that_changed_is_caught(kernel: KernelSource) -> None:
    image = build(kernel)
    with open(image.initrd, "ab") as handle:
        handle.write(b"tampered")
    with pytest.raises(CacheDamaged, match="does not match its manifest's sha256"):
        build(kernel)


@needs_host_tools
def test_two_builds_of_one_entry_make_one_image(kernel: KernelSource) -> None:
    results: list[Image] = []
    threads = [threading.Thread(target=lambda: results.append(build(kernel))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == 2
    a, b = results
    assert a.key.read_bytes() == b.key.read_bytes()
    assert sorted(p.name for p in a.directory.parent.iterdir() if not p.name.startswith(".")) == [a.directory.name]


@pytest.mark.usefixtures("memqual_cache")
def test_a_tampered_agent_is_built_again() -> None:
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build guest agents")
    from memqual.images.agents import build_agent

    first = build_agent("mem_probe")
    good = first.read_bytes()
    first.write_bytes(b"#!/bin/sh\necho evil\n")
    again = build_agent("mem_probe")
    assert again == first and again.read_bytes() == good

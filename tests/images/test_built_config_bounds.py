"""A built kernel's .config, which its build (maybe a patch's) wrote, is
read within bounds: bytes that are no UTF-8, or more of them than a
.config has, are one BadInput line (exit 2), not a UnicodeDecodeError
traceback in ``memqual run --patch``'s config comparison."""

from __future__ import annotations

from pathlib import Path

import pytest

from memqual.host.core.errors import BadInput
from memqual.images import built_kernels, kernel_arms


def _built(directory: Path, config: bytes) -> built_kernels.BuiltKernel:
    directory.mkdir()
    (directory / "config").write_bytes(config)
    return built_kernels.BuiltKernel(
        name=f"6.18.0-{'0' * 16}",
        release="6.18.0",
        directory=directory,
        source="test",
        source_sha256="0" * 64,
        patches=(),
        config_fragments=(),
        compiler="gcc",
        key="0" * 16,
    )


def test_a_non_utf8_config_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _built(tmp_path / "a", b"CONFIG_A=y\n")
    b = _built(tmp_path / "b", b'CONFIG_LOCALVERSION="\xff\xfe"\n')
    monkeypatch.setattr(kernel_arms, "build", lambda source, patches, *_a, **_k: b if patches else a)
    monkeypatch.setattr(kernel_arms, "read_patch", lambda path: object())
    with pytest.raises(BadInput, match=r"b/config: not UTF-8 text \(byte 21\), so no kernel \.config") as caught:
        kernel_arms.arms(["src"], ["x.patch"])
    assert "\n" not in str(caught.value)


def test_an_oversize_config_is_refused_before_it_is_read(tmp_path: Path) -> None:
    built = _built(tmp_path / "k", b"")
    with (built.directory / "config").open("wb") as out:
        out.truncate(built_kernels.CONFIG_MAX + 1)
    with pytest.raises(BadInput, match="more than a kernel .config may have"):
        built.config_text()


def test_a_utf8_config_reads_as_before(tmp_path: Path) -> None:
    assert _built(tmp_path / "k", b"CONFIG_A=y\n").config_text() == "CONFIG_A=y\n"

"""QEMU by version (memqual.images.qemu, memqual.host.core.qemu_binary): the
archive's offer, the hash check, the all-or-nothing unpack, which QEMU
runs and with what; apt and dpkg are faked, nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from fake_qemu_archive import QEMU7, QEMU10, FakeArchive

from memqual.host.cli.main import main
from memqual.host.core import qemu_binary
from memqual.host.core.environment import Environment
from memqual.host.core.errors import BadInput
from memqual.host.core.qemu import MachineConfig, command_line
from memqual.host.report.environment_line import environment_line
from memqual.images import packages
from memqual.images import qemu as archive


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("MEMQUAL_CACHE", str(root))
    monkeypatch.delenv(qemu_binary.ENV_QEMU, raising=False)
    return root


def leftovers(cache: Path) -> list[str]:
    root = cache / "qemu"
    # A fetch's lock file stays (a lock's file is never removed: another run may hold it open).
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) if root.exists() else []


def test_upstream_version() -> None:
    assert archive.upstream_version(QEMU10) == "10.0.2"
    assert archive.upstream_version(QEMU7) == "7.2"
    assert archive.upstream_version("8.2.1-1") == "8.2.1"


def test_list_uses_private_lists(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeArchive(monkeypatch, cache)
    offers = archive.available(cache)
    assert [(o.version, o.suite) for o in offers] == [("10.0.2", "bookworm-backports"), ("7.2", "bookworm")]
    update = fake.commands[0]
    assert update[0] == "apt-get" and update[-1] == "update"
    # The system's apt state is never the target: every option points into the cache.
    for option in update[1:-1:2]:
        assert "=" not in option
    for value in update[2:-1:2]:
        key, place = value.split("=", 1)
        # As root the lists are fetched where apt's sandbox user can write, then copied in.
        assert place.startswith(str(cache) if key != "Dir::State::Lists" or os.geteuid() else "/tmp/mq-apt-"), value
    assert "bookworm-backports" in (cache / "qemu-apt/backports.list").read_text()
    assert list((cache / "qemu-apt/lists").glob("*_Packages"))


def test_fetch_unpacks_whole_with_its_modules_and_firmware(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeArchive(monkeypatch, cache)
    unpacked = archive.fetch("10.0.2", cache)
    assert unpacked.archive.package_version == QEMU10
    manifest = json.loads((unpacked.root / archive.MANIFEST).read_text())
    assert set(manifest["debs"]) == {
        f"{p}_{v.replace(':', '%3a')}_amd64.deb"
        for p, v in [
            ("qemu-system-x86", QEMU10),
            ("qemu-system-common", QEMU10),
            ("qemu-system-data", QEMU10),
            ("seabios", "1.16.3-2~bpo12+1"),
        ]
    }
    assert leftovers(cache) == [unpacked.root.name]
    choice = qemu_binary.describe(unpacked.binary)
    assert choice.version == "10.0.2"
    assert choice.origin.startswith(f"Debian bookworm-backports {QEMU10}")
    assert choice.env()["QEMU_MODULE_DIR"] == str(unpacked.module_dir)
    # The command line and the process get the archive QEMU's own parts.
    monkeypatch.setenv(qemu_binary.ENV_QEMU, str(unpacked.binary))
    argv = command_line(MachineConfig(), "tcg", Path("k"), Path("i"), None, Path("c"), None)
    assert argv[:3] == [str(unpacked.binary), "-L", str(unpacked.firmware_dir)]
    assert "-nodefaults" in argv
    env = qemu_binary.runtime_env(unpacked.binary)
    assert env is not None and env["QEMU_MODULE_DIR"] == str(unpacked.module_dir)


def test_binnmu_version_pairs_with_its_arch_all_data(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeArchive(monkeypatch, cache)
    unpacked = archive.fetch("7.2", cache)
    debs = json.loads((unpacked.root / archive.MANIFEST).read_text())["debs"]
    assert "qemu-system-data_1%3a7.2+dfsg-7+deb12u18_amd64.deb" in debs


def test_unknown_version_is_one_line_naming_the_offer(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeArchive(monkeypatch, cache)
    with pytest.raises(BadInput, match=r"no QEMU 9\.9: it has 10\.0\.2, 7\.2"):
        archive.fetch("9.9", cache)
    assert leftovers(cache) == []


def test_corrupt_download_is_refused_and_removed(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeArchive(monkeypatch, cache)
    fake.corrupt.add("qemu-system-common")
    with pytest.raises(BadInput, match="sha256 is not the signed lists'"):
        archive.fetch("10.0.2", cache)
    assert leftovers(cache) == []
    assert not list((cache / "debs").glob("qemu-system-common_*"))


def test_list_without_hash_is_refused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeArchive(monkeypatch, cache)
    monkeypatch.setattr(packages, "archive_sha256", lambda *a, **k: "")
    with pytest.raises(BadInput, match="no SHA256"):
        archive.fetch("10.0.2", cache)
    assert leftovers(cache) == []


def test_packages_without_a_qemu_leave_nothing_half_unpacked(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeArchive(monkeypatch, cache)
    fake.no_binary = True
    with pytest.raises(BadInput, match="not a QEMU"):
        archive.fetch("10.0.2", cache)
    assert leftovers(cache) == []


def test_a_binary_that_does_not_say_qemu_is_not_kept(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeArchive(monkeypatch, cache)
    original = fake.unpack_deb

    def unpack(deb: Path, target: Path) -> None:
        original(deb, target)
        binary = target / "usr/bin/qemu-system-x86_64"
        if binary.exists():
            binary.write_text("#!/bin/sh\necho hello\n")

    monkeypatch.setattr(packages, "unpack_deb", unpack)
    with pytest.raises(BadInput, match="does not say it is QEMU"):
        archive.fetch("10.0.2", cache)
    assert leftovers(cache) == []


def test_download_passes_private_options_to_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """packages.download, the kernels' machinery, takes the private lists."""
    seen: list[list[str]] = []
    body = b"deb"

    def run(argv: list[str], cwd: Path | None = None) -> str:
        seen.append(argv)
        if argv[:2] == ["apt-cache", "-o"] and "show" in argv:
            return f"SHA256: {hashlib.sha256(body).hexdigest()}\n"
        if "download" in argv:
            assert cwd is not None
            (cwd / "p_1.0_amd64.deb").write_bytes(body)
            return ""
        raise AssertionError(argv)

    monkeypatch.setattr(packages, "_run", run)
    options = ("-o", "Dir::State::Lists=/x")
    deb = packages.download("p", tmp_path, "1.0", options)
    assert deb.read_bytes() == body
    assert all(argv[1:3] == list(options) for argv in seen), seen


def test_path_that_is_no_qemu(tmp_path: Path) -> None:
    fake = tmp_path / "qemu"
    fake.write_text("#!/bin/sh\necho nope\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(BadInput, match="is no QEMU"):
        qemu_binary.resolve(str(fake), tmp_path)
    with pytest.raises(BadInput, match="no executable file"):
        qemu_binary.resolve(str(tmp_path / "missing"), tmp_path)


def test_user_build_by_path(tmp_path: Path) -> None:
    build = tmp_path / "qemu-system-x86_64"
    build.write_text("#!/bin/sh\necho 'QEMU emulator version 9.1.50 (v9.1.0-123)'\n")
    build.chmod(0o755)
    choice = qemu_binary.resolve(str(build), tmp_path)
    assert (choice.version, choice.origin) == ("9.1.50", f"your build {build}")
    assert choice.module_dir is None and choice.firmware_args() == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["boot", "--qemu", "a b", "--", "true"], "is no QEMU version"),
        (["boot", "--qemu", "./no-such-qemu", "--", "true"], "no executable file"),
        (["boot", "--qemu", "/etc/hostname", "--", "true"], "/etc/hostname"),
        (["doctor", "--qemu", "1.0", "--qemu", "2.0"], "--qemu given twice"),
    ],
)
def test_bad_qemu_is_one_line_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], cache: Path
) -> None:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        status = int(exc.code or 0)
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert os.environ.get(qemu_binary.ENV_QEMU) is None


def test_environment_and_header_name_the_origin() -> None:
    env = Environment(qemu="10.0.2", qemu_origin=f"Debian bookworm-backports {QEMU10} (cache /c)")
    assert env.to_json()["qemu_origin"].startswith("Debian bookworm-backports")
    line = environment_line(env.to_json())
    assert f"QEMU 10.0.2 (Debian bookworm-backports {QEMU10})" in line.text


def test_a_killed_unpack_is_cleared_by_the_next_fetch(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeArchive(monkeypatch, cache)
    stale = cache / "qemu" / ".unpack-1_10.0.2-abcd1234"  # its fetch's lock is free: its run is gone
    stale.mkdir(parents=True)
    unpacked = archive.fetch("10.0.2", cache)
    assert leftovers(cache) == [unpacked.root.name]

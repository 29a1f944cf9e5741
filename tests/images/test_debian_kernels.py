"""Debian kernels by name: the archive's list, the package of a release,
and an unknown version refused with the nearest ones (apt-cache faked)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from memqual.host.core.errors import BadInput
from memqual.images import packages, releases

PKGNAMES = """linux-image-amd64
linux-image-6.1.0-57-amd64
linux-image-6.1.0-57-amd64-dbg
linux-image-6.1.0-57-cloud-amd64
linux-image-6.12-amd64
linux-image-6.12.111+deb12-amd64
linux-image-6.12.111+deb12-amd64-unsigned
linux-image-6.12.100+deb12-amd64-unsigned
linux-image-6.12.9+deb12-amd64
"""


@pytest.fixture()
def fake_apt(monkeypatch, tmp_path: Path):
    calls: list[list[str]] = []

    def run(argv: list[str], cwd: Path | None = None) -> str:
        calls.append(argv)
        if argv[:2] == ["apt-cache", "pkgnames"]:
            return PKGNAMES
        if argv[:2] == ["apt-cache", "policy"]:
            known = set(PKGNAMES.split())
            return (
                "  Candidate: 1.0\n" if argv[2] in known and not argv[2].endswith("-dbg") else "  Candidate: (none)\n"
            )
        raise AssertionError(argv)

    monkeypatch.setattr(packages, "_run", run)
    return calls


def test_the_list_holds_releases_only_in_version_order(fake_apt, tmp_path: Path) -> None:
    assert packages.available_kernels(tmp_path) == [
        "6.1.0-57-amd64",
        "6.1.0-57-cloud-amd64",
        "6.12.9+deb12-amd64",
        "6.12.100+deb12-amd64",
        "6.12.111+deb12-amd64",
    ]


@pytest.mark.parametrize(
    "given, package",
    [
        ("6.12.111+deb12-amd64", "linux-image-6.12.111+deb12-amd64"),
        ("linux-image-6.12.111+deb12-amd64", "linux-image-6.12.111+deb12-amd64"),
        ("6.12.100+deb12-amd64", "linux-image-6.12.100+deb12-amd64-unsigned"),  # only the unsigned one exists
        ("linux-image-6.1.0-57-amd64", "linux-image-6.1.0-57-amd64"),
    ],
)
def test_a_release_or_a_package_name_gives_the_package(fake_apt, tmp_path: Path, given: str, package: str) -> None:
    assert packages.kernel_package(given, tmp_path) == package


def test_an_unknown_version_names_the_nearest(fake_apt, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"no Debian kernel '6.12.112\+deb12-amd64': nearest available: 6.12.111\+deb12"):
        packages.kernel_package("6.12.112+deb12-amd64", tmp_path)
    with pytest.raises(BadInput, match="nearest available"):
        packages.kernel_package("6.12-amd64", tmp_path)  # a meta package is no kernel


def test_releases_are_ordered_by_debians_rules_tilde_first() -> None:
    """``~`` sorts before anything, even the end of the string (a release
    candidate or a backport before the release); letters before other
    characters; numbers by value.  dpkg --compare-versions agrees, where
    it is installed."""
    ordered = [
        "6.1.0-9-amd64",
        "6.1.0-10-amd64",
        "6.12.1~bpo12+1-amd64",
        "6.12.1~rc1-amd64",
        "6.12.1-amd64",
        "6.12.1+deb12-amd64",
        "6.12.9+deb12-amd64",
        "6.12.100+deb12-amd64",
    ]
    assert sorted(reversed(ordered), key=releases.release_order) == ordered
    if shutil.which("dpkg"):
        for lower, higher in zip(ordered, ordered[1:], strict=False):
            assert subprocess.run(["dpkg", "--compare-versions", lower, "lt", higher], check=False).returncode == 0


def test_a_name_that_is_no_version_sorts_last_by_its_text() -> None:
    names = ["/tmp/b/bzImage", "6.1.0-57-amd64:init_on_free=1", "6.12.1~rc1-amd64", "6.1.0-57-amd64"]
    assert sorted(names, key=releases.release_order) == [
        "6.1.0-57-amd64",
        "6.12.1~rc1-amd64",
        "/tmp/b/bzImage",
        "6.1.0-57-amd64:init_on_free=1",
    ]

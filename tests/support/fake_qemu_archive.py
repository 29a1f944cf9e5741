"""Debian's archive as images/qemu.py reads it: apt-cache, apt-get download
and dpkg -x, scripted."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from memqual.images import packages

QEMU10 = "1:10.0.2+ds-2+deb13u1~bpo12+1"
QEMU7 = "1:7.2+dfsg-7+deb12u18+b3"
MADISON = {
    "qemu-system-x86": [(QEMU10, "bookworm-backports"), (QEMU7, "bookworm")],
    "qemu-system-common": [(QEMU10, "bookworm-backports"), (QEMU7, "bookworm")],
    "qemu-system-data": [(QEMU10, "bookworm-backports"), ("1:7.2+dfsg-7+deb12u18", "bookworm")],
    "seabios": [("1.16.3-2~bpo12+1", "bookworm-backports"), ("1.16.2-1", "bookworm")],
}


FAKE_BINARY = "#!/bin/sh\necho 'QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2)'\n"


def deb_content(package: str, version: str) -> bytes:
    return f"{package}={version}".encode()


class FakeArchive:
    """apt-cache, apt-get download and dpkg -x, as far as images.qemu uses them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
        self.cache = cache
        self.corrupt: set[str] = set()
        self.no_binary = False
        self.commands: list[list[str]] = []
        monkeypatch.setattr(packages, "run_apt", self.run_apt)
        monkeypatch.setattr(packages, "archive_sha256", self.sha256)
        monkeypatch.setattr(packages, "download", self.download)
        monkeypatch.setattr(packages, "unpack_deb", self.unpack_deb)

    def run_apt(self, argv: list[str], cwd: Path | None = None) -> str:
        self.commands.append(argv)
        if argv[0] == "apt-get" and argv[-1] == "update":
            options = dict(o.split("=", 1) for o in argv[2:-1:2])
            lists = Path(options["Dir::State::Lists"])  # as root: a folder apt's sandbox user can reach
            lists.mkdir(parents=True, exist_ok=True)
            (lists / "deb.debian.org_debian_dists_bookworm-backports_main_binary-amd64_Packages").write_text("")
            return ""
        if argv[0] == "apt-cache" and "madison" in argv:
            package = argv[-1]
            return "".join(
                f"{package} | {v} | http://deb.debian.org/debian {s}/main amd64 Packages\n"
                for v, s in MADISON.get(package, [])
            )
        raise AssertionError(f"unexpected {argv}")

    def sha256(self, package: str, version: str, apt_options: tuple[str, ...] = ()) -> str:
        assert any("Dir::State::Lists=" in o for o in apt_options), "the private lists were not used"
        return hashlib.sha256(deb_content(package, version)).hexdigest()

    def download(
        self, package: str, cache: Path, version: str | None = None, apt_options: tuple[str, ...] = ()
    ) -> Path:
        assert version is not None
        path = cache / "debs" / f"{package}_{version.replace(':', '%3a')}_amd64.deb"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = deb_content(package, version)
        path.write_bytes(body + b"-truncated" if package in self.corrupt else body)
        return path

    def unpack_deb(self, deb: Path, target: Path) -> None:
        if deb.name.startswith("qemu-system-x86_") and not self.no_binary:
            binary = target / "usr/bin/qemu-system-x86_64"
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_text(FAKE_BINARY)
            binary.chmod(0o755)
        if deb.name.startswith("qemu-system-common_"):
            (target / "usr/lib/x86_64-linux-gnu/qemu").mkdir(parents=True, exist_ok=True)
            (target / "usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so").write_text("")
        if deb.name.startswith("qemu-system-data_"):
            (target / "usr/share/qemu").mkdir(parents=True, exist_ok=True)

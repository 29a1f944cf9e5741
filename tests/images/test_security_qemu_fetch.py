"""QEMU by version as root: ``apt-get update`` of the private lists runs in
apt's sandbox (its ``_apt`` user writes lists/partial, inside a root-owned
0711 folder it can reach), never "unsandboxed as root"; and two fetches of
one version at once never remove each other's tree."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fake_qemu_archive import FakeArchive

from memqual.host.core.errors import BadInput
from memqual.images import packages
from memqual.images import qemu as archive

LIST = "deb.debian.org_debian_dists_bookworm-backports_main_binary-amd64_Packages"
needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="apt's sandbox needs root (and setpriv to mimic it)"
)


def _sandbox_uid() -> int:
    try:
        return pwd.getpwnam("_apt").pw_uid
    except KeyError:
        pytest.skip("no _apt user: apt here has no download sandbox")


def _cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    return cache


def _stderr_of_apt(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.CompletedProcess[str]]:
    seen: list[subprocess.CompletedProcess[str]] = []
    real_run = subprocess.run

    def run(argv, **kwargs):
        proc = real_run(argv, **kwargs)
        seen.append(proc)
        return proc

    monkeypatch.setattr(packages.subprocess, "run", run)
    return seen


@needs_sandbox
def test_the_private_lists_are_updated_in_apts_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake apt-get does what apt's update does: its sandbox user writes
    into Dir::State::Lists/partial, and apt warns and goes on as root where
    that user cannot (the warning the real one gives)."""
    uid = _sandbox_uid()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(
        f"""#!/bin/sh
for a in "$@"; do case "$a" in Dir::State::Lists=*) lists="${{a#Dir::State::Lists=}}" ;; esac; done
mkdir -p "$lists/partial"
if ! setpriv --reuid={uid} --regid=65534 --clear-groups sh -c 'echo "Package: x" > "$0/partial/{LIST}"' "$lists" \
    2>/dev/null; then
  echo "W: Download is performed unsandboxed as root as file '$lists/partial/{LIST}' couldn't be accessed by user \
'_apt'. - pkgAcquire::Run (13: Permission denied)" >&2
  echo "Package: x" > "$lists/partial/{LIST}"
fi
mv "$lists/partial/{LIST}" "$lists/{LIST}" && chown 0:0 "$lists/{LIST}"  # apt gives root what it verified
ln -s /etc/shadow "$lists/planted_Packages"
"""
    )
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    seen = _stderr_of_apt(monkeypatch)
    cache = _cache(tmp_path)
    archive.private_apt(cache).update("bookworm")
    update = [p for p in seen if p.args[0] == "apt-get"]
    assert update and "unsandboxed" not in update[0].stderr, update[0].stderr
    lists = cache / "qemu-apt" / "lists"
    assert (lists / LIST).read_text() == "Package: x\n" and os.stat(lists / LIST).st_uid == 0
    assert not (lists / "planted_Packages").exists()  # only regular files of root's are taken
    assert not list(Path("/tmp").glob("mq-apt-*/partial"))  # the sandbox's folder is gone
    # Again, over the lists of the first update: replaced whole.
    archive.private_apt(cache).update("bookworm")
    assert (lists / LIST).is_file() and len(
        [p for p in (cache / "qemu-apt").iterdir() if p.name.startswith("lists.")]
    ) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox question arises for root only")
def test_real_apt_get_update_of_the_private_lists_is_sandboxed(tmp_path: Path, monkeypatch) -> None:
    """The real apt-get: no "unsandboxed" warning (about 3 s here)."""
    seen = _stderr_of_apt(monkeypatch)
    cache = _cache(tmp_path)
    try:
        archive.private_apt(cache).update()
    except BadInput as exc:
        pytest.skip(f"the archive cannot be reached: {exc}")
    update = [p for p in seen if p.args[0] == "apt-get"]
    assert update and update[0].returncode == 0
    assert "unsandboxed" not in update[0].stderr, update[0].stderr
    assert archive.private_apt(cache).fresh()


def test_two_fetches_of_one_version_at_once_unpack_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _cache(tmp_path)
    monkeypatch.setenv("MEMQUAL_CACHE", str(cache))
    fake = FakeArchive(monkeypatch, cache)
    real_unpack = fake.unpack_deb
    unpacks: list[Path] = []
    inside = threading.Event()

    def slow_unpack(deb: Path, target: Path) -> None:
        if deb.name.startswith("qemu-system-x86_"):
            unpacks.append(target)
            inside.set()
            time.sleep(0.3)  # the other fetch starts meanwhile (the event says it may)
        real_unpack(deb, target)

    monkeypatch.setattr(packages, "unpack_deb", slow_unpack)
    results: dict[str, object] = {}

    def fetch(name: str) -> None:
        try:
            results[name] = archive.fetch("10.0.2", cache)
        except Exception as exc:  # reported below
            results[name] = exc

    first = threading.Thread(target=fetch, args=("first",))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=fetch, args=("second",))
    second.start()
    first.join(60)
    second.join(60)
    one, two = results["first"], results["second"]
    assert isinstance(one, archive.UnpackedQemu) and isinstance(two, archive.UnpackedQemu), results
    assert len(unpacks) == 1  # the second waited for the first, then took its tree
    assert one.binary == two.binary and one.binary.is_file()

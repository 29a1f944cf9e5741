"""``apt-get download`` as root: in apt's sandbox (the ``_apt`` user), a
cached .deb accepted only by a hash, a fetch that gives no .deb or two, or
a link instead of one, refused in one line.  A fake apt-get stands in for
the archive; it writes its .deb as the sandbox user, as apt does."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from memqual.host.core.errors import BadInput
from memqual.images import packages

PACKAGE, VERSION = "mq-test", "1.0-1"
DEB = f"{PACKAGE}_{VERSION}_amd64.deb"
CONTENT = b"!<arch>\n the archive's bytes\n"


def _sandbox_uid() -> int:
    try:
        return pwd.getpwnam("_apt").pw_uid
    except KeyError:
        pytest.skip("no _apt user: apt here has no download sandbox")


needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="apt's sandbox needs root (and setpriv to mimic it)"
)


@pytest.fixture
def fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """apt-get on PATH: ``download`` writes what $FAKE_APT_MODE says into
    its working directory as the sandbox user, failing as apt's sandbox
    would where that user cannot write; every call is logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    script = bin_dir / "apt-get"
    uid = _sandbox_uid() if os.geteuid() == 0 else os.geteuid()
    script.write_text(
        f"""#!/bin/sh
echo "$@" >> {log}
as_sandbox() {{ if [ "$(id -u)" = 0 ]; then setpriv --reuid={uid} --regid=65534 --clear-groups "$@"; else "$@"; fi; }}
case "$FAKE_APT_MODE" in
  none) exit 0 ;;
  two) as_sandbox sh -c 'printf x > {DEB} && printf y > {PACKAGE}_0.9-1_amd64.deb' || exit 100 ;;
  link) ln -s /etc/passwd {DEB} ;;
  *) as_sandbox sh -c 'printf "%s" "$0" > {DEB}' "{CONTENT.decode()}" || {{ echo "E: cannot write" >&2; exit 100; }} ;;
esac
"""
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(packages, "_candidate", lambda package: VERSION)
    return log


def _cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    return cache


def _no_sha256(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "_archive_sha256", lambda package, version: "")


@needs_sandbox
def test_root_downloads_in_apts_sandbox_into_the_private_cache(tmp_path, fake_apt, monkeypatch) -> None:
    _no_sha256(monkeypatch)
    cache = _cache(tmp_path)
    made: list[str] = []
    real_mkdtemp = packages.tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(packages.tempfile, "mkdtemp", mkdtemp)
    deb = packages.download(PACKAGE, cache)
    assert deb == cache / "debs" / DEB and deb.read_bytes() == CONTENT
    assert not deb.is_symlink() and os.stat(deb).st_uid == 0  # root's copy, not the sandbox user's file
    assert made and not any(os.path.exists(d) for d in made)  # the download directories are gone


def test_a_cached_deb_nothing_vouches_for_is_not_taken_by_its_name(tmp_path, fake_apt, monkeypatch) -> None:
    _no_sha256(monkeypatch)
    cache = _cache(tmp_path)
    (cache / "debs").mkdir()
    (cache / "debs" / DEB).write_bytes(b"planted, same name\n")
    deb = packages.download(PACKAGE, cache)
    assert deb.read_bytes() == CONTENT and fake_apt.read_text().count("download") == 1
    # fetched by memqual: its own record vouches for it next time, no fetch
    assert packages.download(PACKAGE, cache) == deb and fake_apt.read_text().count("download") == 1
    deb.write_bytes(b"changed after the fetch\n")
    assert packages.download(PACKAGE, cache).read_bytes() == CONTENT
    assert fake_apt.read_text().count("download") == 2


def test_a_cached_deb_with_the_lists_sha256_is_taken_without_a_fetch(tmp_path, fake_apt, monkeypatch) -> None:
    import hashlib

    monkeypatch.setattr(packages, "_archive_sha256", lambda package, version: hashlib.sha256(CONTENT).hexdigest())
    cache = _cache(tmp_path)
    (cache / "debs").mkdir()
    (cache / "debs" / DEB).write_bytes(CONTENT)
    assert packages.download(PACKAGE, cache).read_bytes() == CONTENT
    assert not fake_apt.exists()


@pytest.mark.parametrize("mode, count", [("none", "0"), ("two", "2")])
def test_no_deb_or_two_is_one_bad_input_line(tmp_path, fake_apt, monkeypatch, mode, count) -> None:
    _no_sha256(monkeypatch)
    monkeypatch.setenv("FAKE_APT_MODE", mode)
    cache = _cache(tmp_path)
    with pytest.raises(BadInput, match=f"gave {count} .deb files") as raised:
        packages.download(PACKAGE, cache)
    assert "\n" not in str(raised.value)
    assert [p.name for p in (cache / "debs").iterdir() if not p.name.endswith(".lock")] == ["apt-answers.json"]


def test_a_link_left_by_the_download_is_not_taken_into_the_cache(tmp_path, fake_apt, monkeypatch) -> None:
    _no_sha256(monkeypatch)
    monkeypatch.setenv("FAKE_APT_MODE", "link")
    cache = _cache(tmp_path)
    with pytest.raises(BadInput, match="cannot be read"):
        packages.download(PACKAGE, cache)
    assert [p.name for p in (cache / "debs").iterdir() if not p.name.endswith(".lock")] == ["apt-answers.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox question arises for root only")
def test_real_apt_get_downloads_sandboxed(tmp_path, monkeypatch) -> None:
    """The real apt-get: no "unsandboxed" warning.  A small package."""
    seen: list[subprocess.CompletedProcess[str]] = []
    real_run = subprocess.run

    def run(argv, **kwargs):
        proc = real_run(argv, **kwargs)
        seen.append(proc)
        return proc

    monkeypatch.setattr(packages.subprocess, "run", run)
    cache = _cache(tmp_path)
    try:
        deb = packages.download("hello", cache)
    except BadInput as exc:
        pytest.skip(f"the archive cannot be reached: {exc}")
    assert deb.is_file() and deb.name.startswith("hello_")
    fetch = [p for p in seen if p.args[:2] == ["apt-get", "download"]]
    assert fetch and "unsandboxed" not in fetch[0].stderr

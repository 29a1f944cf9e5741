"""Every folder a MEMQUAL_* variable names goes through host/core/trust.py
where it is handed out: another user's folder, one others may write, a
shared sticky one (but for the sockets' folder, which makes its own private
folder in it, as in /tmp), another user's link, or a folder to be made
inside another user's is refused in one line, before anything is made or
changed there.

Ownership tests chown to ``nobody`` and so need root (memqual's lab case)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from other_user import needs_root, nobody_uid

from memqual.host.core import paths, settings
from memqual.host.core.errors import BadInput
from memqual.host.ksm.state import HostState
from memqual.images import kernel_env

pytestmark = needs_root


def _cache(tmp_path: Path) -> object:
    return paths.cache_dir()


def _sockets(tmp_path: Path) -> object:
    made = paths.short_tempdir()
    paths.release_tempdir(made)
    return made


def _state(tmp_path: Path) -> object:
    (tmp_path / "ksm").mkdir(exist_ok=True)
    (tmp_path / "thp").mkdir(exist_ok=True)
    state = HostState(None, tmp_path / "ksm", tmp_path / "thp")
    assert state.try_lock()
    state.unlock()
    return state.state_dir


def _kbuild(tmp_path: Path) -> object:
    return kernel_env.kbuild_parent()


def _records(tmp_path: Path) -> object:
    from memqual.e2e.base import GuestTest

    # the property alone, on what it reads: an Avocado test is not made outside a job
    return vars(GuestTest)["outdir"].fget(SimpleNamespace(outputdir=str(tmp_path / "avocado")))


# Every MEMQUAL_* variable that names a folder, and what hands it out.
FOLDERS: dict[str, Callable[[Path], object]] = {
    settings.CACHE: _cache,
    settings.SOCKET_DIR: _sockets,
    settings.STATE_DIR: _state,
    settings.KBUILD_DIR: _kbuild,
    settings.OUTPUT_DIR: _records,
}


def test_every_folder_variable_is_here() -> None:
    named = {v for k, v in vars(settings).items() if k.isupper() and isinstance(v, str) and v.startswith("MEMQUAL_")}
    # the rest name files, programs, words or numbers (test_trust_programs.py has the programs)
    folders = {name for name in named if name.endswith(("_DIR", "CACHE"))}
    assert folders == set(FOLDERS)


def _good(tmp_path: Path) -> Path:
    good = tmp_path / "good"
    good.mkdir(mode=0o700, exist_ok=True)
    return good


def _untrusted(kind: str, tmp_path: Path) -> Path:
    """A folder of ``kind`` below root's private tmp_path."""
    folder = tmp_path / kind
    if kind == "another user's":
        folder.mkdir(mode=0o755)
        os.chown(folder, nobody_uid(), -1)
    elif kind == "writable by others":
        folder.mkdir()
        os.chmod(folder, 0o777)
    elif kind == "shared sticky":
        folder.mkdir()
        os.chmod(folder, 0o1777)
    elif kind == "another user's link":
        folder.symlink_to(_good(tmp_path))
        os.lchown(folder, nobody_uid(), -1)
    elif kind == "made inside another user's":
        bob = tmp_path / "bob"
        bob.mkdir(mode=0o755)
        os.chown(bob, nobody_uid(), -1)
        folder = bob / "new"
    return folder


KINDS = ("another user's", "writable by others", "shared sticky", "another user's link", "made inside another user's")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variable", sorted(FOLDERS))
def test_an_untrusted_folder_is_refused_in_one_line_and_left_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, kind: str
) -> None:
    monkeypatch.delenv(settings.DEBUG, raising=False)
    for other in FOLDERS:  # the others at good folders of their own
        monkeypatch.setenv(other, str(tmp_path / f"ok-{other.lower()}"))
        if other == settings.SOCKET_DIR:
            (tmp_path / f"ok-{other.lower()}").mkdir()
    folder = _untrusted(kind, tmp_path)
    monkeypatch.setenv(variable, str(folder))
    before = (os.lstat(folder).st_mode, sorted(os.listdir(folder))) if folder.exists() else None
    if kind == "shared sticky" and variable == settings.SOCKET_DIR:
        _sockets(tmp_path)  # as /tmp: nobody else can rename the private folder made there
        return
    with pytest.raises(BadInput) as caught:
        FOLDERS[variable](tmp_path)
    assert "\n" not in str(caught.value) and str(folder) in str(caught.value)
    after = (os.lstat(folder).st_mode, sorted(os.listdir(folder))) if folder.exists() else None
    assert after == before  # nothing made in it, its mode kept
    assert os.path.exists(folder) == (before is not None)


@pytest.mark.parametrize("variable", sorted(FOLDERS))
def test_a_folder_of_ones_own_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    for other in FOLDERS:
        monkeypatch.setenv(other, str(tmp_path / f"ok-{other.lower()}"))
    (tmp_path / f"ok-{settings.SOCKET_DIR.lower()}").mkdir()
    FOLDERS[variable](tmp_path)


def test_a_kernel_build_folder_made_by_memqual_is_0711_and_one_made_by_others_keeps_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(settings.KBUILD_DIR, str(tmp_path / "made"))
    made = kernel_env.kbuild_parent()
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o711  # the build user passes through to its own folders
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv(settings.KBUILD_DIR, str(private))
    with pytest.raises(BadInput, match="the build user cannot enter it .*chmod o\\+x"):
        kernel_env.kbuild_parent()
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700


@pytest.mark.parametrize("where", ["/proc/x", "/proc/self/status/x", "/dev/null"])
def test_a_kernel_build_folder_that_cannot_be_one_is_one_line(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    monkeypatch.setenv(settings.KBUILD_DIR, where)
    with pytest.raises(BadInput) as caught:
        kernel_env.kbuild_parent()
    assert "\n" not in str(caught.value) and where in str(caught.value)

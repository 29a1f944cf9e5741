"""Root trusts nothing it did not write: the cache and the state directory
must be the running user's and writable by nobody else; state and lock
files are never followed through a symlink; knobs are written back only
under the known sysfs roots; QEMU option values cannot smuggle options;
the user network is restricted; ``memslots kvm --device`` opens only KVM.

Ownership tests chown to ``nobody`` and so need root (memqual's lab case)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from other_user import needs_root, nobody_uid

from memqual.host.cli import main as cli
from memqual.host.core.errors import BadInput
from memqual.host.core.knobs import StaleRestore, Sysfs
from memqual.host.core.paths import REPO_ROOT, cache_dir
from memqual.host.core.trust import Untrusted, trusted_dir
from memqual.host.ksm.state import HostState, restore_stale


def _tree(root: Path) -> dict[str, Path]:
    ksm, thp, state = root / "ksm", root / "thp", root / "state"
    ksm.mkdir(parents=True)
    thp.mkdir()
    state.mkdir(mode=0o755)
    for name, value in {"run": "0", "pages_to_scan": "100", "sleep_millisecs": "20"}.items():
        (ksm / name).write_text(value + "\n")
    (thp / "enabled").write_text("always [madvise] never\n")
    return {"ksm": ksm, "thp": thp, "state": state}


def _leave_state(tree: dict[str, Path], **changes: object) -> HostState:
    """A state file as a killed run leaves it, with ``changes`` to its JSON."""
    state = HostState(tree["state"], tree["ksm"], tree["thp"])
    assert state.try_lock()
    state.save(state.new_snapshot(with_thp=True))
    state.unlock()
    if changes:
        data = json.loads(state.state_path.read_text())
        data.update(changes)
        state.state_path.write_text(json.dumps(data))
    (tree["ksm"] / "pages_to_scan").write_text("4321\n")
    return state


def _restore(tree: dict[str, Path]) -> StaleRestore | None:
    return restore_stale(tree["state"], tree["ksm"], tree["thp"])


# -- the cache --------------------------------------------------------------------
@needs_root
def test_a_cache_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chown(cache, nobody_uid(), -1)
    monkeypatch.setenv("MEMQUAL_CACHE", str(cache))
    with pytest.raises(Untrusted, match=r"belongs to uid \d+, not to you"):
        cache_dir()


def test_a_cache_others_may_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    monkeypatch.setenv("MEMQUAL_CACHE", str(cache))
    with pytest.raises(Untrusted, match="writable by others .*chmod go-w"):
        cache_dir()


@needs_root
def test_xdg_cache_home_and_home_are_checked_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMQUAL_CACHE", raising=False)
    xdg = tmp_path / "xdg"
    (xdg / "memqual").mkdir(parents=True)
    os.chown(xdg / "memqual", nobody_uid(), -1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    with pytest.raises(Untrusted):
        cache_dir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    os.chmod(home / ".cache", 0o755)
    monkeypatch.setenv("HOME", str(home))
    created = cache_dir()
    assert created == home / ".cache" / "memqual"
    assert stat.S_IMODE(os.stat(created).st_mode) == 0o700  # created private


@needs_root
def test_the_cli_refuses_a_foreign_cache_in_one_line(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, nobody_uid(), -1)
    env = {**os.environ, "MEMQUAL_CACHE": str(cache), "MEMQUAL_STATE_DIR": str(tmp_path / "state")}
    env.pop("MEMQUAL_DEBUG", None)
    out = subprocess.run(
        [sys.executable, "-m", "memqual.host.cli.main", "image", "build"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("memqual: error: cache directory")
    assert list(cache.iterdir()) == []  # nothing written into it


def test_a_symlinked_cache_is_checked_at_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.mkdir()
    os.chmod(target, 0o777)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(Untrusted):
        trusted_dir(tmp_path / "link", "cache directory")


# -- the state directory ----------------------------------------------------------------
def test_a_symlinked_state_file_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    state = _leave_state(tree)
    elsewhere = tmp_path / "planted.json"
    state.state_path.rename(elsewhere)
    state.state_path.symlink_to(elsewhere)
    with pytest.raises(BadInput, match="is a symlink: refused"):
        _restore(tree)
    assert (tree["ksm"] / "pages_to_scan").read_text() == "4321\n"


def test_a_symlinked_lock_file_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tree["state"] / "ksm.lock").symlink_to(victim)
    state = HostState(tree["state"], tree["ksm"], tree["thp"])
    with pytest.raises(BadInput, match="is a symlink"):
        state.try_lock()
    assert victim.read_text() == "precious\n"


@needs_root
def test_a_state_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _leave_state(tree)
    os.chown(tree["state"], nobody_uid(), -1)
    with pytest.raises(Untrusted, match="state directory .* belongs to uid"):
        _restore(tree)
    assert (tree["ksm"] / "pages_to_scan").read_text() == "4321\n"


def test_a_state_dir_others_may_write_is_refused_by_the_cli(tmp_path: Path, capsys) -> None:
    tree = _tree(tmp_path)
    _leave_state(tree)
    os.chmod(tree["state"], 0o777)
    status = cli.main(["ksm", "restore", "--state-dir", str(tree["state"]), "--sysfs", str(tree["ksm"])])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "writable by others" in err
    assert (tree["ksm"] / "pages_to_scan").read_text() == "4321\n"


def test_a_state_file_naming_a_root_outside_sysfs_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    target = tmp_path / "etc"
    target.mkdir()
    (target / "pages_to_scan").write_text("keep\n")
    _leave_state(tree, ksm_root=str(target))
    with pytest.raises(BadInput, match="is not .*refusing to write knobs there"):
        _restore(tree)
    assert (target / "pages_to_scan").read_text() == "keep\n"


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b", "", ".hidden"])
def test_a_state_file_naming_a_knob_that_is_no_plain_name_is_refused(tmp_path: Path, name: str) -> None:
    tree = _tree(tmp_path)
    _leave_state(tree, ksm={"run": "0", name: "x"})
    with pytest.raises(BadInput, match="not plain sysfs attributes"):
        _restore(tree)


def test_a_state_file_naming_an_unknown_thp_knob_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _leave_state(tree, thp={"enabled": "never", "khugepaged_defrag": "0"})
    with pytest.raises(BadInput, match="khugepaged_defrag are not memqual's"):
        _restore(tree)


def test_the_default_roots_are_the_kernels(tmp_path: Path) -> None:
    state = HostState(tmp_path / "state")
    assert (state.ksm.root, state.thp.root) == (Path("/sys/kernel/mm/ksm"), Path("/sys/kernel/mm/transparent_hugepage"))


def test_a_good_state_file_still_restores(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _leave_state(tree)
    result = _restore(tree)
    assert result is not None and "ksm/pages_to_scan" in result.written
    assert (tree["ksm"] / "pages_to_scan").read_text() == "100\n"


def test_state_temp_names_are_unpredictable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted ksm-state.tmp symlink is never written through."""
    tree = _tree(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tree["state"] / "ksm-state.tmp").symlink_to(victim)
    _leave_state(tree)
    assert victim.read_text() == "precious\n"


def test_a_symlinked_sysfs_knob_is_not_written_through(tmp_path: Path) -> None:
    root = tmp_path / "ksm"
    root.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (root / "run").symlink_to(victim)
    with pytest.raises(OSError):
        Sysfs(root).write("run", "1")
    assert victim.read_text() == "precious\n"


# -- QEMU options -------------------------------------------------------------------------
def test_commas_in_paths_cannot_add_qemu_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memqual.host.core.qemu import MachineConfig, command_line

    monkeypatch.setenv("MEMQUAL_QEMU", "/bin/true")
    evil = tmp_path / "a,server=on,wait=off"
    argv = command_line(MachineConfig(), "tcg", Path("/k"), Path("/i"), evil / "qmp.sock", evil / "console.log", 2222)
    chardevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-chardev"]
    assert f"file,id=console,path={str(evil).replace(',', ',,')}/console.log" in chardevs
    assert f"socket,id=qmp,path={str(evil).replace(',', ',,')}/qmp.sock" in chardevs


def test_the_user_network_is_restricted_but_forwards_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    from memqual.host.core.qemu import MachineConfig, command_line

    monkeypatch.setenv("MEMQUAL_QEMU", "/bin/true")
    argv = command_line(MachineConfig(), "tcg", Path("/k"), Path("/i"), Path("/q"), Path("/c"), 2222)
    netdev = argv[argv.index("-netdev") + 1]
    assert "restrict=on" in netdev.split(",") and "hostfwd=tcp:127.0.0.1:2222-:22" in netdev


# -- memslots kvm --device ------------------------------------------------------------------
@pytest.mark.parametrize("device", ["/dev/null", "/etc/hostname", "/tmp", "/dev/zero"])
def test_memslots_kvm_device_must_be_kvm(device: str, capsys) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} is not here")
    status = cli.main(["memslots", "kvm", "--device", device, "--slots", "1", "--repeats", "1", "--no-vcpu"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "KVM device" in err


def test_memslots_kvm_device_check_accepts_kvm() -> None:
    from memqual.host.cli.memslots_kvm import check_kvm_device

    if not os.path.exists("/dev/kvm"):
        pytest.skip("no /dev/kvm here")
    check_kvm_device("/dev/kvm")

"""memqual.host.ksm against a fake sysfs tree: no root, no real KSM, seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memqual.host.core.errors import CapabilityMissing, Timeout
from memqual.host.core.knobs import RestoreFailed, selected
from memqual.host.ksm.controller import KsmController, check_capability
from memqual.host.ksm.state import HostState, restore_stale
from memqual.host.ksm.sysfs import write_order

REPO = Path(__file__).resolve().parents[2]

KSM_KNOBS = {
    "run": "0",
    "pages_to_scan": "100",
    "sleep_millisecs": "20",
    "smart_scan": "1",
    "advisor_mode": "[none] scan-time",
    "max_page_sharing": "256",
    "merge_across_nodes": "1",
    "use_zero_pages": "0",
}
KSM_COUNTERS = {
    "full_scans": "0",
    "pages_shared": "5",
    "pages_sharing": "50",
    "pages_unshared": "7",
    "pages_volatile": "3",
    "pages_skipped": "11",
    "pages_scanned": "1000",
    "general_profit": "4096",
}
THP = {"enabled": "always [madvise] never", "defrag": "always defer defer+madvise [madvise] never"}


def make_tree(root: Path) -> dict[str, Path]:
    ksm = root / "ksm"
    thp = root / "thp"
    ksm.mkdir(parents=True)
    thp.mkdir()
    for name, value in KSM_KNOBS.items():
        (ksm / name).write_text(value + "\n")
        (ksm / name).chmod(0o644)
    for name, value in KSM_COUNTERS.items():
        (ksm / name).write_text(value + "\n")
        (ksm / name).chmod(0o444)
    for name, value in THP.items():
        (thp / name).write_text(value + "\n")
    proc = root / "proc"
    (proc / "36").mkdir(parents=True)
    # comm ksmd, ppid 2, flags with PF_KTHREAD; utime 150, stime 50 ticks
    (proc / "36" / "stat").write_text("36 (ksmd) S 2 0 0 0 -1 2097216 0 0 0 0 150 50 0 0 25 5 1 0 24 0 0\n")
    (proc / "36" / "schedstat").write_text("2500000000 171880 2\n")
    (proc / "77").mkdir()
    (proc / "77" / "stat").write_text("77 (qemu (x86)) S 1 0 0 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 99 0 0\n")
    (proc / "77" / "ksm_merging_pages").write_text("1234\n")
    (proc / "77" / "ksm_stat").write_text("ksm_rmap_items 2000\nksm_process_profit 42\nksm_mergeable: yes\n")
    (proc / "77" / "smaps_rollup").write_text("Rss: 100 kB\nAnonHugePages:     2048 kB\n")
    state = root / "state"
    return {"ksm": ksm, "thp": thp, "proc": proc, "state": state}


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    return make_tree(tmp_path)


def controller(tree: dict[str, Path], **kw) -> KsmController:
    kw.setdefault("lock_timeout_s", 2.0)
    return KsmController(
        ksm_root=tree["ksm"],
        thp_root=tree["thp"],
        state_dir=tree["state"],
        proc_root=tree["proc"],
        euid=lambda: 0,
        install_signal_handlers=False,
        **kw,
    )


def read(path: Path) -> str:
    return path.read_text().strip()


def test_selected_and_order() -> None:
    assert selected("always [madvise] never\n") == "madvise"
    assert selected("100\n") == "100"
    assert write_order(["run", "pages_to_scan", "advisor_mode", "smart_scan"]) == [
        "advisor_mode",
        "pages_to_scan",
        "smart_scan",
        "run",
    ]


def test_snapshot_then_restore_on_exit(tree) -> None:
    with controller(tree) as ksm:
        assert not (tree["state"] / "ksm-state.json").exists(), "no change yet, no snapshot"
        ksm.set(pages_to_scan=4000, sleep_millisecs=10, run=1)
        ksm.set_thp(enabled="never")
        saved = json.loads((tree["state"] / "ksm-state.json").read_text())
        assert saved["ksm"]["pages_to_scan"] == "100"
        assert saved["ksm"]["advisor_mode"] == "none"
        assert "full_scans" not in saved["ksm"], "counters are not knobs"
        assert saved["thp"] == {"enabled": "madvise", "defrag": "madvise"}
        assert read(tree["ksm"] / "run") == "1"
        assert read(tree["thp"] / "enabled") == "never"
        ksm.set(pages_to_scan=8000)  # a second change keeps the first snapshot
        assert json.loads((tree["state"] / "ksm-state.json").read_text())["ksm"]["pages_to_scan"] == "100"
    assert read(tree["ksm"] / "pages_to_scan") == "100"
    assert read(tree["ksm"] / "sleep_millisecs") == "20"
    assert read(tree["ksm"] / "run") == "0"
    assert read(tree["thp"] / "enabled") == "madvise"
    assert not (tree["state"] / "ksm-state.json").exists()


def test_restore_on_exception(tree) -> None:
    with pytest.raises(ZeroDivisionError):
        with controller(tree) as ksm:
            ksm.set(smart_scan=0, run=1)
            raise ZeroDivisionError("the body failed")
    assert read(tree["ksm"] / "smart_scan") == "1"
    assert read(tree["ksm"] / "run") == "0"


def test_counters_and_process(tree) -> None:
    with controller(tree) as ksm:
        c = ksm.counters()
        assert (c.pages_shared, c.pages_sharing, c.pages_skipped, c.general_profit) == (5, 50, 11, 4096)
        assert ksm.ksmd_pid() == 36
        assert c.ksmd_cpu_s == pytest.approx(2.5)  # schedstat wins over ticks
        (tree["proc"] / "36" / "schedstat").unlink()
        assert ksm.counters().ksmd_cpu_s == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))
        p = ksm.process(77)
        assert p.merging_pages == 1234
        assert p.stat_int("ksm_rmap_items") == 2000
        assert p.stat["ksm_mergeable"] == "yes"
        assert p.anon_huge_kib == 2048


def test_wait_full_scans_deadline(tree) -> None:
    with controller(tree) as ksm:
        t0 = time.monotonic()
        with pytest.raises(Timeout, match="full_scans went 0 -> 0"):
            ksm.wait_full_scans(2, timeout_s=0.3)
        assert time.monotonic() - t0 < 2.0


def test_wait_full_scans_returns_when_counter_moves(tree) -> None:
    import threading

    def bump() -> None:
        for i in range(1, 4):
            time.sleep(0.05)
            # rename, not write_text: a reader must never see an empty file
            # (sysfs hands out whole values)
            tmp = tree["ksm"] / ".full_scans.tmp"
            tmp.write_text(f"{i}\n")
            tmp.chmod(0o444)
            os.replace(tmp, tree["ksm"] / "full_scans")

    with controller(tree) as ksm:
        threading.Thread(target=bump, daemon=True).start()
        reading = ksm.wait_full_scans(3, timeout_s=5)
        assert reading.full_scans == 3


def test_restore_after_crash(tree) -> None:
    """A child takes the snapshot, changes knobs and dies by SIGKILL; the
    next start (restore_stale) puts the knobs back."""
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from memqual.host.ksm.controller import KsmController
        k = KsmController(ksm_root=Path({str(tree["ksm"])!r}), thp_root=Path({str(tree["thp"])!r}),
                          state_dir=Path({str(tree["state"])!r}), proc_root=Path('/proc'), euid=lambda: 0)
        k.open()
        k.set(pages_to_scan=4000, smart_scan=0, run=1)
        k.set_thp(defrag="never")
        os.kill(os.getpid(), 9)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert read(tree["ksm"] / "pages_to_scan") == "4000"
    state_file = tree["state"] / "ksm-state.json"
    assert state_file.exists(), "the killed run left its snapshot"
    result = restore_stale(tree["state"], ksm_root=tree["ksm"], thp_root=tree["thp"])
    assert result is not None and not result.owner_alive
    assert sorted(result.written) == ["ksm/pages_to_scan", "ksm/run", "ksm/smart_scan", "thp/defrag"]
    assert read(tree["ksm"] / "pages_to_scan") == "100"
    assert read(tree["ksm"] / "smart_scan") == "1"
    assert read(tree["ksm"] / "run") == "0"
    assert read(tree["thp"] / "defrag") == "madvise"
    assert not state_file.exists()
    assert restore_stale(tree["state"], ksm_root=tree["ksm"], thp_root=tree["thp"]) is None


def test_controller_restores_stale_before_its_own_snapshot(tree) -> None:
    """Without restore_stale at start, the next controller still must not
    take the dead run's values for the originals."""
    dead = HostState(tree["state"], tree["ksm"], tree["thp"])
    assert dead.try_lock()
    dead.save(dead.new_snapshot())
    (tree["ksm"] / "pages_to_scan").write_text("9999\n")
    dead.unlock()  # what the kernel does when the holder dies
    with controller(tree) as ksm:
        assert ksm.stale_restored is not None
        assert read(tree["ksm"] / "pages_to_scan") == "100"
        ksm.set(pages_to_scan=5)
    assert read(tree["ksm"] / "pages_to_scan") == "100"


def test_restore_stale_leaves_a_live_run_alone(tree) -> None:
    with controller(tree) as ksm:
        ksm.set(pages_to_scan=4000)
        assert restore_stale(tree["state"], ksm_root=tree["ksm"], thp_root=tree["thp"]) is None
        assert read(tree["ksm"] / "pages_to_scan") == "4000"
    assert read(tree["ksm"] / "pages_to_scan") == "100"


def test_second_holder_waits_then_skips(tree) -> None:
    with controller(tree):
        second = controller(tree, lock_timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(CapabilityMissing, match=f"another memqual run \\(pid {os.getpid()}"):
            second.open()
        waited = time.monotonic() - t0
        assert 0.25 <= waited < 2.0
    with controller(tree) as again:  # free once the first one is done
        again.set(run=1)
    assert read(tree["ksm"] / "run") == "0"


def test_restore_failure_keeps_state_file(tree, monkeypatch) -> None:
    import errno

    from memqual.host.core.knobs import Sysfs

    ksm = controller(tree)
    ksm.open()
    ksm.set(pages_to_scan=4000, sleep_millisecs=10)
    real_write = Sysfs.write

    def busy(self, name, value):
        if name == "pages_to_scan":
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_write(self, name, value)

    monkeypatch.setattr(Sysfs, "write", busy)
    with pytest.raises(RestoreFailed, match="pages_to_scan=100"):
        ksm.close()
    assert read(tree["ksm"] / "sleep_millisecs") == "20", "the other knobs still go back"
    assert (tree["state"] / "ksm-state.json").exists(), "kept for the next start"
    monkeypatch.setattr(Sysfs, "write", real_write)
    assert restore_stale(tree["state"], ksm_root=tree["ksm"], thp_root=tree["thp"]) is not None
    assert read(tree["ksm"] / "pages_to_scan") == "100"


def test_capability_errors(tree, tmp_path) -> None:
    with pytest.raises(CapabilityMissing, match="does not exist"):
        check_capability(tmp_path / "nope", euid=lambda: 0)
    with pytest.raises(CapabilityMissing, match="needs root"):
        check_capability(tree["ksm"], euid=lambda: 1000)
    with pytest.raises(CapabilityMissing, match="does not exist"):
        KsmController(ksm_root=tmp_path / "nope", euid=lambda: 0).open()


def test_read_only_sysfs(tree, monkeypatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(CapabilityMissing, match="read-only"):
        check_capability(tree["ksm"], euid=lambda: 0)


def test_state_dir_not_usable(tree, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    ksm = controller(tree)
    ksm.state = HostState(blocker / "sub", tree["ksm"], tree["thp"])
    with pytest.raises(CapabilityMissing, match="state directory"):
        ksm.open()


def test_unknown_knob_is_a_capability(tree) -> None:
    with controller(tree) as ksm:
        with pytest.raises(CapabilityMissing, match="no knob advisor_frobnicate"):
            ksm.set(advisor_frobnicate=1)


def test_sigterm_restores(tree) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from memqual.host.ksm.controller import KsmController
        k = KsmController(ksm_root=Path({str(tree["ksm"])!r}), thp_root=Path({str(tree["thp"])!r}),
                          state_dir=Path({str(tree["state"])!r}), euid=lambda: 0)
        k.open()
        k.set(sleep_millisecs=0, run=1)
        print("ready", flush=True)
        time.sleep(30)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    assert read(tree["ksm"] / "sleep_millisecs") == "0"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM, "dies of SIGTERM after restoring"
    assert read(tree["ksm"] / "sleep_millisecs") == "20"
    assert read(tree["ksm"] / "run") == "0"
    assert not (tree["state"] / "ksm-state.json").exists()


def _cli(argv: list[str]) -> int:
    from memqual.host.cli import ksm as cli
    from memqual.host.cli.command import parser_for, run_command

    return run_command(parser_for(cli.COMMAND).parse_args(argv))


def test_cli_status_and_restore(tree, capsys) -> None:
    common = ["--state-dir", str(tree["state"]), "--sysfs", str(tree["ksm"])]
    assert _cli(["ksm", "restore", *common]) == 0
    assert "nothing to restore" in capsys.readouterr().out
    dead = HostState(tree["state"], tree["ksm"], tree["thp"])
    assert dead.try_lock()
    dead.save(dead.new_snapshot())
    dead.unlock()
    (tree["ksm"] / "run").write_text("1\n")
    assert _cli(["ksm", "status", "--json", *common]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["knobs"]["run"] == "1"
    assert status["counters"]["pages_sharing"] == 50
    assert status["state_owner_pid"] == os.getpid()
    assert _cli(["ksm", "restore", *common]) == 0
    assert "ksm/run" in capsys.readouterr().out
    assert read(tree["ksm"] / "run") == "0"


def test_close_from_another_thread_stops_further_writes(tree) -> None:
    """Avocado's tearDown runs beside the test body: after close() from
    there, the knobs are back and the body can change nothing more."""
    import threading

    ksm = controller(tree)
    ksm.open()
    ksm.set(pages_to_scan=4000, run=1)
    closer = threading.Thread(target=ksm.close)
    closer.start()
    closer.join(5)
    assert read(tree["ksm"] / "pages_to_scan") == "100"
    assert read(tree["ksm"] / "run") == "0"
    with pytest.raises(RuntimeError, match="closed"):
        ksm.set(run=1)
    assert read(tree["ksm"] / "run") == "0"
    assert not (tree["state"] / "ksm-state.json").exists()
    assert restore_stale(tree["state"], ksm_root=tree["ksm"], thp_root=tree["thp"]) is None

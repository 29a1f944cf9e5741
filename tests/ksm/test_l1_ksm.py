"""L1's KSM driver (host/ksm/l1_ksm.py): its shell scripts run for real
under this machine's sh against a fake sysfs tree, as they run in L1."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from local_shell import LocalShell

from memqual.host.core.errors import CapabilityMissing, GuestError, Timeout
from memqual.host.ksm import l1_ksm, procfs
from memqual.host.ksm.l1_ksm import L1Ksm, parse_counters, parse_process
from memqual.host.ksm.schedule import AnonHuge, AwaitMark, Now, OwnPages, ScanEnds, Schedule, SetKnob


def fake_ksm(tmp_path: Path, **values: str) -> tuple[Path, Path]:
    ksm, thp = tmp_path / "ksm", tmp_path / "thp"
    ksm.mkdir()
    thp.mkdir()
    files = {
        "run": "0",
        "pages_to_scan": "100",
        "sleep_millisecs": "20",
        "full_scans": "3",
        "pages_shared": "10",
        "pages_sharing": "200",
        "pages_unshared": "5",
        "pages_volatile": "7",
        "pages_scanned": "12345",
        **values,
    }
    for name, value in files.items():
        (ksm / name).write_text(value + "\n")
    (thp / "enabled").write_text("always [madvise] never\n")
    return ksm, thp


@pytest.fixture
def l1_usleep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """busybox's usleep on PATH, as L1 has it, for the scripts that poll."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "usleep").symlink_to(shutil.which("busybox") or "/bin/busybox")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def driver(tmp_path: Path, shell: LocalShell, **values: str) -> L1Ksm:
    ksm, thp = fake_ksm(tmp_path, **values)
    return L1Ksm(shell, 4242, os.getpid(), os.getpid(), 1.0, ksm_dir=str(ksm), thp_dir=str(thp))


def test_a_reading_is_one_command_with_ksmds_cpu_and_l1s_clock(tmp_path):
    shell = LocalShell()
    ksm = driver(tmp_path, shell)
    shell.commands.clear()
    reading = ksm.counters()
    assert len(shell.commands) == 1
    assert (reading.full_scans, reading.pages_sharing, reading.pages_scanned) == (3, 200, 12345)
    # a counter the kernel lacks (6.1 has no pages_skipped) is None
    assert reading.pages_skipped is None and reading.general_profit is None
    # ksmd's CPU from schedstat (this process stands in for ksmd), the
    # time from the host's boot clock
    assert reading.ksmd_cpu_s is not None and reading.ksmd_cpu_s > 0
    # its times on a CPU and the host's interrupts, read by the shell alone
    assert reading.ksmd_slices is not None and reading.ksmd_slices > 0
    assert reading.interrupts is not None and reading.interrupts > 0
    assert abs(reading.taken_s - float(Path("/proc/uptime").read_text().split()[0])) < 5


def test_knobs_are_written_in_kernel_order_without_a_shell(tmp_path):
    shell = LocalShell()
    ksm = driver(tmp_path, shell)
    shell.commands.clear()
    ksm.set(run=1, pages_to_scan=20000)
    assert [c[0] for c in shell.commands] == ["tee", "tee"]
    assert shell.commands[-1][1].endswith("/run"), "run is written last: ksmd starts once the rest is in place"
    assert ksm.fs.read_int("pages_to_scan") == 20000 and ksm.fs.read_int("run") == 1
    assert ksm.thp.read("enabled") == "madvise"


def test_an_unknown_knob_is_a_missing_capability_and_a_bad_name_never_reaches_a_path(tmp_path):
    ksm = driver(tmp_path, LocalShell())
    with pytest.raises(CapabilityMissing, match="smart_scan"):
        ksm.set(smart_scan=1)
    with pytest.raises(ValueError, match="not a sysfs attribute"):
        ksm.fs.write("../run", 1)


def test_the_guests_qemu_answers_for_the_guests_pid_only(tmp_path):
    ksm = driver(tmp_path, LocalShell())
    with pytest.raises(ValueError, match="not the guest's"):
        ksm.process(1)
    if not Path(f"/proc/{os.getpid()}/ksm_merging_pages").exists():
        pytest.skip("this kernel has no /proc/PID/ksm_merging_pages")
    figures = ksm.process(4242)
    assert figures.pid == os.getpid() and figures.merging_pages >= 0
    assert figures.anon_huge_kib is not None


def test_a_wait_for_scans_waits_in_l1_and_times_out_with_l1s_figures(tmp_path, l1_usleep):
    shell = LocalShell()
    ksm = driver(tmp_path, shell)
    scans = tmp_path / "ksm" / "full_scans"

    def ksmd(counts: tuple[int, ...]) -> None:  # full scans, a while after the wait began
        for count in counts:
            time.sleep(0.2)
            # whole, as sysfs shows a value: a reader never sees it empty
            (tmp_path / "next").write_text(f"{count}\n")
            os.replace(tmp_path / "next", scans)

    worker = threading.Thread(target=ksmd, args=((4, 5),))
    shell.commands.clear()
    worker.start()
    reading = ksm.wait_full_scans(2, timeout_s=20)
    worker.join()
    assert reading.full_scans == 5
    assert [c[2] for c in shell.commands] == ["timeout"], "one command, waiting in L1"

    worker = threading.Thread(target=ksmd, args=((6, 7, 8),))
    worker.start()
    readings = ksm.scan_end_readings(3, timeout_s=20)
    worker.join()
    assert [r.full_scans for r in readings] == [6, 7, 8], "a reading at every scan end, none missed"
    assert [c[2] for c in shell.commands] == ["timeout", "timeout"]

    with pytest.raises(
        Timeout, match=r"0 of 1 scan ends seen in 1 s \(its wait in L1 exited -?\d+\); now full_scans 8"
    ):
        ksm.wait_full_scans(1, timeout_s=1)


def test_the_finder_names_l1s_processes_by_their_name(tmp_path):
    own = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert os.getpid() in l1_ksm.find(LocalShell(), own[:5])
    assert l1_ksm.find(LocalShell(), "no-such-process-name") == []


def test_readings_that_are_not_one_say_what_came_back():
    with pytest.raises(GuestError, match="not a reading"):
        parse_counters("sh: cd: can't cd to /sys/kernel/mm/ksm\n")
    with pytest.raises(GuestError, match="not the KSM figures"):
        parse_process(7, "cat: can't open 'ksm_merging_pages'\n")
    reading = parse_counters("full_scans 4\npages_skipped 9\nksmd_cpu_ns \nuptime 12.50\n")
    assert (reading.full_scans, reading.pages_skipped, reading.ksmd_cpu_s, reading.taken_s) == (4, 9, None, 12.5)
    assert (reading.ksmd_slices, reading.interrupts) == (None, None)


SMAPS = """\
55d0c0000000-55d0c0100000 rw-p 00000000 00:00 0                          [heap]
Size:               1024 kB
KSM:                 104 kB
7f0000000000-7f0040000000 rw-s 00000000 00:2a 1234 /run/memqual/huge/qemu_back_mem.pc.ram.Ab12 (deleted)
Size:            1048576 kB
KSM:                   0 kB
7f0040000000-7f0040001000 r--p 00000000 08:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
Size:                  4 kB
KSM:                   0 kB
"""


def test_a_mappings_merged_pages_are_counted_apart_from_the_processs():
    # QEMU's heap merged 104 KiB; the guest's RAM under the mount nothing
    assert procfs.parse_mapped_ksm_kib(SMAPS, Path("/run/memqual/huge")) == (1048576, 0)
    assert procfs.parse_mapped_ksm_kib(
        SMAPS.replace("KSM:                   0", "KSM:                   8", 1), Path("/run/memqual/huge")
    ) == (1048576, 8)
    assert procfs.parse_mapped_ksm_kib(SMAPS, Path("/elsewhere")) == (0, 0)
    # a kernel without the per-mapping line: not countable
    assert procfs.parse_mapped_ksm_kib(SMAPS.replace("KSM:", "Rss:"), Path("/run/memqual/huge")) is None


def test_a_whole_schedule_is_one_command_switching_knobs_at_scan_ends(tmp_path, l1_usleep):
    shell = LocalShell()
    ksm = driver(tmp_path, shell, smart_scan="0")
    root = tmp_path / "ksm"
    seen: list[str] = []

    def ksmd(scans: int) -> None:
        # each scan takes 0.2 s and sees the knob as it stands at its end
        now = int((root / "full_scans").read_text())
        for count in range(now + 1, now + 1 + scans):
            time.sleep(0.2)
            seen.append((root / "smart_scan").read_text().strip())
            (tmp_path / "next").write_text(f"{count}\n")
            os.replace(tmp_path / "next", root / "full_scans")

    plan = Schedule(
        (
            SetKnob("run", 1),
            SetKnob("smart_scan", 1),
            ScanEnds(2),
            OwnPages(),
            SetKnob("smart_scan", 0),
            ScanEnds(2),
            OwnPages(),
        )
    )
    worker = threading.Thread(target=ksmd, args=(4,))
    shell.commands.clear()
    worker.start()
    outcome = ksm.run_schedule(plan, timeout_s=20)
    worker.join()
    assert len(shell.commands) == 1, "the whole measurement is one command in L1"
    assert [[r.full_scans for r in part] for part in outcome.scan_ends] == [[4, 5], [6, 7]]
    assert all(r.ksmd_cpu_s for part in outcome.scan_ends for r in part), "each a whole reading"
    assert seen == ["1", "1", "0", "0"], "the switch landed at the scan end after the turn's last reading"
    assert (root / "run").read_text().strip() == "1"
    own = Path(f"/proc/{os.getpid()}/ksm_stat")
    assert len(outcome.own_pages) == 2
    assert all((n is None) != own.exists() for n in outcome.own_pages), "ksm_rmap_items where the kernel has it"

    with pytest.raises(CapabilityMissing, match="no knob advisor_mode"):
        ksm.run_schedule(Schedule((SetKnob("advisor_mode", 0), ScanEnds(1))), timeout_s=1)
    worker = threading.Thread(target=ksmd, args=(1,))
    worker.start()
    with pytest.raises(Timeout, match=r"a schedule of 3 scans saw 1 scan ends in 3 s \(exited -?\d+"):
        ksm.run_schedule(Schedule((ScanEnds(3),)), timeout_s=1)
    worker.join()


def test_an_own_line_is_a_count_or_none():
    assert l1_ksm.parse_count("own", "own 4096\n") == 4096
    assert l1_ksm.parse_count("own", "own \n") is None
    with pytest.raises(GuestError, match="not a own line"):
        l1_ksm.parse_count("own", "sh: cannot open\n")


def test_a_schedule_starts_at_the_guests_mark_and_a_cancel_ends_its_wait(tmp_path, l1_usleep):
    fifo = tmp_path / "mark"
    os.mkfifo(fifo, 0o600)
    ksm_dir, thp_dir = fake_ksm(tmp_path)
    shell = LocalShell()
    ksm = L1Ksm(shell, 4242, os.getpid(), os.getpid(), 1.0, str(ksm_dir), str(thp_dir), mark_fifo=str(fifo))
    events: list[str] = []

    def guest_then_ksmd() -> None:
        time.sleep(0.5)
        events.append("marked")
        with fifo.open("w") as mark:  # L1's cat, handed the guest's connection
            mark.write("dirty_start\n")
        time.sleep(0.2)
        events.append("scan")
        (tmp_path / "next").write_text("4\n")
        os.replace(tmp_path / "next", ksm_dir / "full_scans")

    worker = threading.Thread(target=guest_then_ksmd)
    worker.start()
    plan = Schedule((AwaitMark(), AnonHuge(), SetKnob("run", 1), ScanEnds(1)))
    outcome = ksm.run_schedule(plan, timeout_s=20)
    worker.join()
    (mark,) = outcome.marks
    assert mark.waited_s >= 0.3, "the schedule waited for the mark"
    assert [r.full_scans for r in outcome.scan_ends[0]] == [4]
    assert outcome.anon_huge_kib[0] is not None, "the QEMU's AnonHugePages (this process's, here)"

    def cancel() -> None:
        time.sleep(0.3)
        ksm.cancel_mark()

    worker = threading.Thread(target=cancel)
    worker.start()
    with pytest.raises(Timeout, match=r"exited 6"):
        ksm.run_schedule(plan, timeout_s=20)
    worker.join()


def test_a_mark_that_does_not_come_ends_the_schedule_at_its_wait(tmp_path):
    fifo = tmp_path / "mark"
    os.mkfifo(fifo, 0o600)
    ksm_dir, thp_dir = fake_ksm(tmp_path)
    ksm = L1Ksm(LocalShell(), 1, os.getpid(), os.getpid(), 1.0, str(ksm_dir), str(thp_dir), str(fifo), mark_wait_s=1)
    started = time.monotonic()
    with pytest.raises(Timeout, match=r"exited 7: the guest's mark did not come within the wait"):
        ksm.run_schedule(Schedule((AwaitMark(), ScanEnds(1))), timeout_s=60)
    assert time.monotonic() - started < 30, "the mark's wait, not the scans' deadline"


def test_a_schedule_reads_l1_s_clock_where_asked_and_knobs_beside_the_counters(tmp_path, l1_usleep):
    """The advisor's watch: L1's clock when run=1 is written, then each
    scan end with pages_to_scan as ksmd set it at that end."""
    shell = LocalShell()
    ksm = driver(tmp_path, shell)
    root = tmp_path / "ksm"

    def ksmd() -> None:
        for count, pages in ((4, 70), (5, 700)):
            time.sleep(0.2)
            (root / "pages_to_scan").write_text(f"{pages}\n")
            (tmp_path / "next").write_text(f"{count}\n")
            os.replace(tmp_path / "next", root / "full_scans")

    worker = threading.Thread(target=ksmd)
    worker.start()
    outcome = ksm.run_schedule(
        Schedule((Now(), SetKnob("run", 1), ScanEnds(2))), timeout_s=20, knobs=("pages_to_scan",)
    )
    worker.join()
    (started,) = outcome.now_s
    (ends,) = outcome.scan_ends
    assert [(r.full_scans, r.knobs) for r in ends] == [(4, (("pages_to_scan", 70),)), (5, (("pages_to_scan", 700),))]
    assert 0 < started <= ends[0].taken_s
    with pytest.raises(CapabilityMissing, match="no knob advisor_mode"):
        ksm.run_schedule(Schedule((ScanEnds(1),)), timeout_s=1, knobs=("advisor_mode",))
    with pytest.raises(CapabilityMissing, match="no knob ../run"):
        ksm.run_schedule(Schedule((ScanEnds(1),)), timeout_s=1, knobs=("../run",))
    with pytest.raises(GuestError, match="not a now line"):
        l1_ksm.parse_now("sh: can't open /proc/uptime\n")

"""What /proc says about KSM: ksmd's CPU time and a process's merged pages.

ksmd is found by name among kernel threads (PF_KTHREAD in /proc/PID/stat).
Its CPU time comes from /proc/PID/schedstat (nanoseconds, first field) when
the kernel has schedstats, else utime+stime from /proc/PID/stat in clock
ticks (10 ms at USER_HZ=100: use windows of seconds).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from memqual.host.core.knobs import PROC_ROOT

PF_KTHREAD = 0x00200000


def _stat_fields(text: str) -> tuple[str, list[str]]:
    """Split /proc/PID/stat into (comm, fields after comm).  The comm is in
    parentheses and may itself hold spaces or parentheses."""
    open_paren, close_paren = text.index("("), text.rindex(")")
    return text[open_paren + 1 : close_paren], text[close_paren + 2 :].split()


def find_ksmd(proc_root: Path = PROC_ROOT) -> int | None:
    """The pid of the ksmd kernel thread, or None (no KSM in this kernel)."""
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, fields = _stat_fields((entry / "stat").read_text())
        except (OSError, ValueError):
            continue  # the process went away while we looked
        # fields[0] is state (field 3); flags is field 9 -> fields[6]
        if comm == "ksmd" and int(fields[6]) & PF_KTHREAD:
            return int(entry.name)
    return None


def cpu_seconds(pid: int, proc_root: Path = PROC_ROOT) -> float:
    """CPU time a task has used, in seconds: schedstat's nanoseconds when
    present, utime+stime in clock ticks otherwise."""
    base = proc_root / str(pid)
    try:
        return schedstat_seconds((base / "schedstat").read_text())
    except (OSError, ValueError, IndexError):
        pass
    _, fields = _stat_fields((base / "stat").read_text())
    # utime is field 14, stime field 15 -> fields[11], fields[12]
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def schedstat_seconds(text: str) -> float:
    """/proc/PID/schedstat's first field (nanoseconds on the CPU), in
    seconds; ValueError or IndexError when the text is not one."""
    return int(text.split()[0]) / 1e9


@dataclasses.dataclass(frozen=True)
class ProcessKsm:
    """A process's KSM figures (QEMU's: the guest RAM)."""

    pid: int
    merging_pages: int  # /proc/PID/ksm_merging_pages
    stat: dict[str, str]  # /proc/PID/ksm_stat, e.g. ksm_rmap_items, ksm_process_profit
    anon_huge_kib: int | None  # AnonHugePages from smaps_rollup: THP backing

    def stat_int(self, key: str) -> int | None:
        value = self.stat.get(key)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def process_ksm(pid: int, proc_root: Path = PROC_ROOT) -> ProcessKsm:
    base = proc_root / str(pid)
    merging = int((base / "ksm_merging_pages").read_text().strip())
    try:
        stat_map = parse_ksm_stat((base / "ksm_stat").read_text())
    except FileNotFoundError:
        stat_map = {}  # kernels before 6.1 have ksm_merging_pages only
    return ProcessKsm(pid=pid, merging_pages=merging, stat=stat_map, anon_huge_kib=anon_huge_kib(pid, proc_root))


def parse_ksm_stat(text: str) -> dict[str, str]:
    """/proc/PID/ksm_stat's "key value" lines as a mapping."""
    stat_map: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key:
            stat_map[key.rstrip(":")] = value.strip()
    return stat_map


def anon_huge_kib(pid: int, proc_root: Path = PROC_ROOT) -> int | None:
    try:
        text = (proc_root / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    return parse_anon_huge_kib(text)


def parse_anon_huge_kib(text: str) -> int | None:
    """AnonHugePages (KiB) from /proc/PID/smaps_rollup's text; None if absent."""
    for line in text.splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return None


def mapped_ksm_kib(pid: int, under: Path, proc_root: Path = PROC_ROOT) -> tuple[int, int] | None:
    """(size, KSM-merged) in KiB of the process's mappings of files under
    ``under`` (a hugetlbfs guest's RAM), from /proc/PID/smaps; None when
    this kernel's smaps has no per-mapping KSM line.  (0, 0): no such
    mapping."""
    return parse_mapped_ksm_kib((proc_root / str(pid) / "smaps").read_text(), under)


def parse_mapped_ksm_kib(text: str, under: Path) -> tuple[int, int] | None:
    """``mapped_ksm_kib`` of an smaps ``text`` read anywhere (L1's, over SSH)."""
    prefix = str(under).rstrip("/") + "/"
    size = merged = 0
    inside = has_ksm_line = False
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":"):  # a mapping's header: "start-end perms offset dev inode [path]"
            inside = len(fields) >= 6 and fields[5].startswith(prefix)
        elif fields[0] == "KSM:":
            has_ksm_line = True
            merged += int(fields[1]) if inside else 0
        elif fields[0] == "Size:" and inside:
            size += int(fields[1])
    return (size, merged) if has_ksm_line else None

"""The cache of L1 images stays bounded (images/host_image.py
``enforce_cap``): the least recently used go first, never the one in use,
one used within the hour or one whose lock another run holds."""

from __future__ import annotations

import os
import time
from pathlib import Path

from memqual.host.core.locks import file_lock
from memqual.images.host_image import enforce_cap

MIB = 1 << 20
HOUR = 3600.0


def image(hosts: Path, key: str, mib: int, used_hours_ago: float) -> Path:
    """A stand-in L1 image: its manifest, last used then, and an initrd of ``mib``."""
    directory = hosts / key
    directory.mkdir(parents=True)
    (directory / "initrd").write_bytes(b"\0" * (mib * MIB))
    manifest = directory / "manifest.json"
    manifest.write_text("{}")
    used = time.time() - used_hours_ago * HOUR
    os.utime(manifest, (used, used))
    return directory


def test_the_least_recently_used_go_until_the_cache_fits(tmp_path: Path) -> None:
    oldest, old, newer, mine = (image(tmp_path, k, 2, h) for k, h in (("a", 50), ("b", 40), ("c", 30), ("d", 60)))
    removed = enforce_cap(tmp_path, keep=mine, cap_bytes=5 * MIB)
    # 8 MiB: the oldest but the one in use goes, then the next; 4 MiB fit
    assert removed == [oldest, old] and newer.exists() and mine.exists()


def test_what_fits_stays(tmp_path: Path) -> None:
    images = [image(tmp_path, k, 1, 10) for k in "abc"]
    assert enforce_cap(tmp_path, keep=images[0], cap_bytes=4 * MIB) == []


def test_one_used_within_the_hour_stays_over_the_cap(tmp_path: Path) -> None:
    old = image(tmp_path, "a", 2, 5)
    recent = image(tmp_path, "b", 2, 0.5)
    mine = image(tmp_path, "c", 2, 0)
    assert enforce_cap(tmp_path, keep=mine, cap_bytes=1 * MIB) == [old]
    assert recent.exists()


def test_one_another_run_holds_stays(tmp_path: Path) -> None:
    held = image(tmp_path, "a", 2, 50)
    free = image(tmp_path, "b", 2, 40)
    mine = image(tmp_path, "c", 2, 0)
    with file_lock(tmp_path / ".a.lock", exclusive=True, deadline_s=5, held="a build"):
        assert enforce_cap(tmp_path, keep=mine, cap_bytes=1 * MIB) == [free]
    assert held.exists()

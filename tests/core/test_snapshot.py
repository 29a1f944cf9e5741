"""Warm-start snapshot bookkeeping, without QEMU: keys, validity, the
switch-off paths, the cache cap."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from memqual.host.core import clock, snapshot
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import BalloonDevice, MachineConfig

# Every test here reads and writes snapshots, none of them the user's.
pytestmark = pytest.mark.usefixtures("snapshot_cache")


def _machine(
    config: MachineConfig,
    image_dir: Path = Path("/img/a"),
    accel: str = "tcg",
    the_clock: clock.Clock = clock.WALL_CLOCK,
) -> Machine:
    """A stand-in with only what snapshot_key reads."""
    image = SimpleNamespace(directory=image_dir, kernel_sha256="k" * 64, initramfs_sha256="i" * 64)
    return cast(Machine, SimpleNamespace(config=config, image=image, accel=accel, clock=the_clock))


def test_key_ignores_warm_but_not_any_device_or_size() -> None:
    base = MachineConfig()
    key = snapshot.snapshot_key(_machine(base))
    assert snapshot.snapshot_key(_machine(dataclasses.replace(base, warm=False))) == key
    for changed in (
        dataclasses.replace(base, memory_mib=2048),
        dataclasses.replace(base, cpus=1),
        dataclasses.replace(base, machine="pc"),
        dataclasses.replace(base, mem_merge=False),
        dataclasses.replace(base, balloon=BalloonDevice(free_page_reporting=True)),
        dataclasses.replace(base, balloon=None),
        dataclasses.replace(base, extra_args=("-device", "virtio-rng-device")),
        dataclasses.replace(base, cmdline_extra="foo=1"),
    ):
        assert snapshot.snapshot_key(_machine(changed)) != key, changed
    assert snapshot.snapshot_key(_machine(base, image_dir=Path("/img/b"))) != key
    assert snapshot.snapshot_key(_machine(base, accel="kvm")) != key
    # A guest saved on one clock never restores on another (nor another shift).
    icount4 = snapshot.snapshot_key(_machine(base, the_clock=clock.icount(4)))
    assert icount4 != key
    assert snapshot.snapshot_key(_machine(base, the_clock=clock.icount(2))) not in (key, icount4)


def test_a_snapshot_is_valid_only_with_its_full_size(tmp_path: Path) -> None:
    state, meta = tmp_path / "state", tmp_path / "meta.json"
    assert not snapshot._valid(state, meta)
    state.write_bytes(b"x" * 100)
    meta.write_text(json.dumps({"bytes": 100}))
    assert snapshot._valid(state, meta)
    state.write_bytes(b"x" * 50)  # truncated
    assert not snapshot._valid(state, meta)
    meta.write_text("{not json")
    assert not snapshot._valid(state, meta)


def test_memqual_warm_0_turns_warm_starts_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert snapshot.usable()
    monkeypatch.setenv("MEMQUAL_WARM", "0")
    assert not snapshot.usable()


def test_unwritable_snapshot_dir_turns_warm_starts_off_with_one_warning(
    snapshot_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    snapshot_cache.mkdir(parents=True, exist_ok=True)
    (snapshot_cache / "snapshots").write_text("a file where the directory should be")
    monkeypatch.setattr(snapshot, "_warned_unwritable", False)
    assert not snapshot.usable()
    assert not snapshot.usable()
    warnings = [r for r in caplog.records if "warm starts off" in r.getMessage()]
    assert len(warnings) == 1


def test_cap_drops_orphans_then_least_recently_used(
    snapshot_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    image = tmp_path / "image"
    image.mkdir()
    root = snapshot.snapshot_root()

    def entry(name: str, size: int, image_dir: Path, mtime: float) -> Path:
        directory = root / name
        directory.mkdir()
        (directory / "meta.json").write_text(json.dumps({"bytes": size, "image": str(image_dir)}))
        import os

        os.utime(directory / "meta.json", (mtime, mtime))
        return directory

    orphan = entry("orphan", 10, tmp_path / "gone", 1)
    old = entry("old", 60, image, 2)
    new = entry("new", 60, image, 3)
    monkeypatch.setattr(snapshot, "CACHE_CAP_BYTES", 100)
    snapshot._enforce_cap()
    assert not orphan.exists() and not old.exists() and new.exists()


def test_a_machine_starts_by_the_strategy_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm starts are the default strategy of a warm config, cold boots of
    any other; a strategy given to the machine replaces both (the machine
    does not reach for the snapshot module then)."""
    from memqual.host.core import machine as machine_module

    assert machine_module.default_start(MachineConfig(warm=True)) is snapshot.start
    assert machine_module.default_start(MachineConfig(warm=False)) is Machine.boot_cold
    monkeypatch.setenv("MEMQUAL_WARM", "0")
    assert machine_module.default_start(MachineConfig(warm=True)) is Machine.boot_cold
    started: list[Machine] = []
    monkeypatch.setattr(snapshot, "start", lambda m: pytest.fail("the snapshot's start was not the one given"))
    vm = Machine(MachineConfig(warm=True, accel="tcg"), start=started.append)
    vm.launch()
    vm.shutdown()
    assert started == [vm]

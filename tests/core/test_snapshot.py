"""Warm-start snapshot bookkeeping, without QEMU: keys, validity, the
switch-off paths, the cache cap."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from memqual.host.core import clock, nested, snapshot
from memqual.host.core.kernelspec import KernelSpec, parse_kernel
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import BalloonDevice, MachineConfig

# Every test here reads and writes snapshots, none of them the user's.
pytestmark = pytest.mark.usefixtures("snapshot_cache")


def _machine(
    config: MachineConfig,
    image_dir: Path = Path("/img/a"),
    accel: str = "tcg",
    the_clock: clock.Clock = clock.WALL_CLOCK,
    host: nested.HostUnderTest | None = None,
    host_image: object = None,
    host_accel: str = "tcg",
) -> Machine:
    """A stand-in with only what snapshot_key reads."""
    image = SimpleNamespace(directory=image_dir, kernel_sha256="k" * 64, initramfs_sha256="i" * 64)
    return cast(
        Machine,
        SimpleNamespace(
            config=config,
            image=image,
            accel=accel,
            clock=the_clock,
            host=host,
            host_image=host_image,
            host_accel=host_accel,
        ),
    )


def _l1_image(directory: Path, client_key: str = "l1 key 1") -> SimpleNamespace:
    """L1's image as snapshot_key reads it: its folder, its initrd's
    digest and its SSH keys (on disk, as the image's are)."""
    keys = directory / "ssh"
    keys.mkdir(parents=True, exist_ok=True)
    (keys / "id_ed25519").write_text(client_key)
    (keys / "host_key.pub").write_text("ssh-ed25519 L1")
    return SimpleNamespace(directory=directory, initrd_sha256="r" * 64, key=keys / "id_ed25519")


L1 = nested.HostUnderTest(KernelSpec("6.1.0-57-amd64"))


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


def test_a_guest_of_this_machine_keeps_its_key_beside_hosts_under_test(tmp_path: Path) -> None:
    """The host's part of the key is there only under a host under test:
    this machine's guests restore the snapshots they saved before."""
    base = MachineConfig()
    plain = snapshot.snapshot_key(_machine(base))
    assert snapshot.snapshot_key(_machine(base, host_image=_l1_image(tmp_path / "l1"))) == plain
    assert snapshot.snapshot_key(_machine(base, host=L1, host_image=_l1_image(tmp_path / "l1"))) != plain


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param({"host": nested.HostUnderTest(KernelSpec("6.12.111+deb12-amd64"))}, id="another kernel"),
        pytest.param({"host": nested.HostUnderTest(parse_kernel("6.1.0-57-amd64:init_on_free=1"))}, id="its cmdline"),
        pytest.param({"host": nested.HostUnderTest(KernelSpec("6.1.0-57-amd64"), ("kvm_amd.npt=0",))}, id="a param"),
        pytest.param({"host": L1.with_boot_knobs("hugepages=256")}, id="a boot knob"),
        pytest.param({"image": "other-l1"}, id="another L1 image"),
        pytest.param({"client_key": "l1 key 2"}, id="L1's keys rebuilt"),
        pytest.param({"host_accel": "kvm"}, id="L1 on KVM"),
        pytest.param({"the_clock": clock.icount(0)}, id="the clock"),
    ],
)
def test_every_part_of_a_host_under_test_makes_another_snapshot(tmp_path: Path, changed: dict[str, Any]) -> None:
    """A saved L1 is its kernel, the kernel's command line, its KVM's
    parameters, the boot knobs, its image with its keys, its accelerator
    and its clock: each changed means another snapshot."""

    def key(
        host: nested.HostUnderTest = L1,
        image: str = "l1",
        client_key: str = "l1 key 1",
        host_accel: str = "tcg",
        the_clock: clock.Clock = clock.WALL_CLOCK,
    ) -> str:
        l1_image = _l1_image(tmp_path / image, client_key)
        machine = _machine(MachineConfig(), host=host, host_image=l1_image, host_accel=host_accel, the_clock=the_clock)
        return snapshot.snapshot_key(machine)

    assert key() == key()
    assert key(**changed) != key()


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

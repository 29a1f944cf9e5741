"""memqual.host.core.environment: one fingerprint of host and guest, filled by the
probe, written by every record under the same keys, read back by the
report."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import fake_qemu
import pytest

from memqual.host.core import probe
from memqual.host.core.environment import FINGERPRINT_KEYS, Environment
from memqual.host.core.record import Measurement
from memqual.host.judge.results import environment_fingerprint


def test_to_json_has_only_known_keys_and_round_trips() -> None:
    env = Environment(host_kernel="6.1.0", qemu="7.2.22", ksm={"run": "0"}, kvm_nr_memslots=509)
    doc = env.to_json()
    assert doc == {"host_kernel": "6.1.0", "qemu": "7.2.22", "ksm": {"run": "0"}, "kvm_nr_memslots": 509}
    assert json.loads(json.dumps(doc)) == doc
    assert Environment.from_json({**doc, "from_another_version": 1}) == env


def test_fingerprint_keys_are_fields() -> None:
    names = [f.name for f in dataclasses.fields(Environment)]
    assert list(FINGERPRINT_KEYS) == [n for n in names if n in FINGERPRINT_KEYS]


def test_a_scenario_adds_its_accelerator_and_guest() -> None:
    image = SimpleNamespace(release="6.1.0-57-amd64", kernel_sha256="k" * 64, initramfs_sha256="i" * 64)
    env = Environment(host_kernel="h").with_accel("tcg", "TCG requested").with_guest(image)
    assert env.to_json() == {
        "host_kernel": "h",
        "accel": "tcg",
        "accel_reason": "TCG requested",
        "guest_kernel": "6.1.0-57-amd64",
        "guest_kernel_sha256": "k" * 64,
        "initramfs_sha256": "i" * 64,
    }


def test_the_probe_fills_the_host_part_with_memqual_qemu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMQUAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MEMQUAL_QEMU", str(fake_qemu.install(tmp_path, "hang")))
    env = probe.environment()
    assert env.qemu == fake_qemu.VERSION  # the QEMU memqual runs, not the one on PATH
    assert env.host_kernel and env.cpu and env.thp
    assert env.accel is None and env.ksm is None  # no probe answer cached; KSM knobs only when asked
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "probe-kvm.json").write_text(json.dumps({"key": "x", "boots": False, "detail": "hangs"}))
    assert probe.environment().with_accel("tcg", "x").accel == "tcg"
    assert (probe.environment().accel, probe.environment().accel_reason) == ("tcg", "TCG because hangs")


def test_the_reports_host_fallback_is_the_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMQUAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MEMQUAL_QEMU", str(fake_qemu.install(tmp_path, "hang")))
    rec = Measurement(
        scenario="s",
        metric="m",
        unit="s",
        better="lower",
        samples=[1.0],
        environment=Environment(host_kernel="6.18.0").to_json(),
    )
    env = environment_fingerprint([rec], host_fallback=True)
    assert env["host_kernel"] == "6.18.0" and env["environment_sources"]["host_kernel"] == "records"
    assert env["qemu"] == fake_qemu.VERSION
    assert env["environment_sources"]["qemu"].startswith("host")


def test_every_builder_writes_environment_keys() -> None:
    """The /dev/kvm harnesses write the same keys as every scenario."""
    from memqual.host.memslots import kvm_bench, kvm_lookup, kvm_lookup_results, kvm_results

    names = {f.name for f in dataclasses.fields(Environment)}
    bench = SimpleNamespace(
        host_kernel="h",
        kvm_module="kvm_test",
        api_version=12,
        nr_memslots=32764,
        address_spaces=2,
        vcpu_mmap_size=12288,
        config=SimpleNamespace(device="/dev/kvm"),
        environment=None,
    )
    lookup = SimpleNamespace(
        host_kernel="h", kvm_module="kvm_test", nr_memslots=32764, config=SimpleNamespace(device="/dev/kvm")
    )
    # Stand-ins with only the fields environment() reads.
    for doc in (
        kvm_results.environment(cast(kvm_bench.BenchResult, bench)),
        kvm_lookup_results.environment(cast(kvm_lookup.LookupResult, lookup)),
    ):
        assert set(doc) <= names
        assert doc["kvm_nr_memslots"] == 32764 and doc["kvm_device"] == "/dev/kvm"

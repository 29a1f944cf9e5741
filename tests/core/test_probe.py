"""memqual.host.core.probe: the KVM boot probe against a fake QEMU (hangs, reaches
init, fails), its cache, the accelerator choice, and ``memqual doctor
--json``."""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path

import fake_qemu
import pytest
from fakes import FakeImage

from memqual.host.cli import main as cli
from memqual.host.core import probe
from memqual.host.core.errors import CapabilityMissing

DEADLINE_S = 0.5  # for a fake that hangs: the probe must give up this soon
READY_DEADLINE_S = 20.0  # for a fake that answers: the probe returns when it does


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeImage:
    """A host with a usable /dev/kvm, a private cache and a fake image."""
    monkeypatch.setenv("MEMQUAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe, "kvm_usable_device", lambda: True)
    monkeypatch.setattr(probe, "KVM_BOOT_DEADLINE_S", DEADLINE_S)
    image = FakeImage.in_dir(tmp_path / "img")
    monkeypatch.setattr("memqual.images.build.build", lambda *a, **k: image)
    return image


def use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> Path:
    fake = fake_qemu.install(tmp_path / f"qemu-{mode}", mode)
    monkeypatch.setenv("MEMQUAL_QEMU", str(fake))
    if mode != "hang":
        # a loaded 2-core host may take a while to start the fake at all
        monkeypatch.setattr(probe, "KVM_BOOT_DEADLINE_S", READY_DEADLINE_S)
    return fake


def test_a_guest_that_hangs_under_kvm_means_no_within_the_deadline(tmp_path, monkeypatch, host) -> None:
    fake = use(tmp_path, monkeypatch, "hang")
    started = time.monotonic()
    boots, detail = probe.kvm_boots_linux()
    elapsed = time.monotonic() - started
    assert boots is False
    assert "did not reach init under KVM" in detail
    assert DEADLINE_S <= elapsed < DEADLINE_S + 2
    (pid,) = fake_qemu.pids(fake)
    assert not fake_qemu.alive(pid), "the probe left its QEMU running"
    (argv,) = fake_qemu.invocations(fake)
    assert argv[argv.index("-accel") + 1] == "kvm"
    # console only: no QMP socket and no network for the probe
    assert "-mon" not in argv and "-netdev" not in argv and "-device" not in argv
    assert "console" in " ".join(argv)


def test_the_answer_is_cached_until_forced_or_the_image_changes(tmp_path, monkeypatch, host) -> None:
    fake = use(tmp_path, monkeypatch, "ready")  # the quick answer: caching does not depend on it
    first = probe.kvm_boots_linux()
    started = time.monotonic()
    assert probe.kvm_boots_linux() == first
    assert time.monotonic() - started < 0.5
    assert len(fake_qemu.invocations(fake)) == 1

    probe.kvm_boots_linux(force=True)
    assert len(fake_qemu.invocations(fake)) == 2

    monkeypatch.setattr("memqual.images.build.build", lambda *a, **k: dataclasses.replace(host, kernel_sha256="n" * 64))
    probe.kvm_boots_linux()
    assert len(fake_qemu.invocations(fake)) == 3


def test_an_earlier_qemu_or_image_keeps_its_answer(tmp_path, monkeypatch, host) -> None:
    """Switching QEMUs (--qemu) and back does not probe again: earlier
    answers are kept beside the last."""
    fake = use(tmp_path, monkeypatch, "ready")
    first = probe.kvm_boots_linux()
    other = dataclasses.replace(host, kernel_sha256="n" * 64)
    monkeypatch.setattr("memqual.images.build.build", lambda *a, **k: other)
    probe.kvm_boots_linux()
    assert len(fake_qemu.invocations(fake)) == 2
    monkeypatch.setattr("memqual.images.build.build", lambda *a, **k: host)
    assert probe.kvm_boots_linux() == first
    assert len(fake_qemu.invocations(fake)) == 2
    assert probe.cached_accel() is not None


def test_a_guest_that_reaches_init_means_yes(tmp_path, monkeypatch, host) -> None:
    fake = use(tmp_path, monkeypatch, "ready")
    started = time.monotonic()
    boots, detail = probe.kvm_boots_linux()
    assert boots is True and "reached init under KVM" in detail
    assert time.monotonic() - started < READY_DEADLINE_S / 2  # it did not wait for the deadline
    (pid,) = fake_qemu.pids(fake)
    assert not fake_qemu.alive(pid)
    assert probe.resolve_accel("auto")[0] == "kvm"


def test_a_qemu_that_refuses_kvm_says_why(tmp_path, monkeypatch, host) -> None:
    use(tmp_path, monkeypatch, "exit")
    boots, detail = probe.kvm_boots_linux()
    assert boots is False
    assert "fake failure for the test" in detail


def test_no_kvm_device_needs_no_boot(tmp_path, monkeypatch, host) -> None:
    fake = use(tmp_path, monkeypatch, "hang")
    monkeypatch.setattr(probe, "kvm_usable_device", lambda: False)
    assert probe.kvm_boots_linux() == (False, "/dev/kvm is missing or not accessible")
    assert fake_qemu.invocations(fake) == []


def test_accel_choice_when_kvm_does_not_boot(tmp_path, monkeypatch, host) -> None:
    fake = use(tmp_path, monkeypatch, "hang")
    accel, reason = probe.resolve_accel("auto")
    assert accel == "tcg" and reason.startswith("TCG because")
    with pytest.raises(CapabilityMissing, match="use --accel tcg"):
        probe.resolve_accel("kvm")
    calls = len(fake_qemu.invocations(fake))
    assert probe.resolve_accel("tcg") == ("tcg", "TCG requested")
    assert len(fake_qemu.invocations(fake)) == calls  # no probe for an explicit tcg


DOCTOR_KEYS = {
    "qemu_version",
    "host_kernel",
    "kvm_device",
    "kvm_boots_linux",
    "accel",
    "ksm_writable",
    "thp",
    "kvm_nr_memslots",
}


def test_doctor_json(tmp_path, monkeypatch, host, capsys) -> None:
    use(tmp_path, monkeypatch, "hang")
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert DOCTOR_KEYS <= set(report)
    assert report["qemu_version"] == fake_qemu.VERSION
    assert report["host_kernel"] == platform.release()
    assert report["kvm_device"] is Path("/dev/kvm").exists()
    assert report["kvm_boots_linux"] is False and report["accel"] == "tcg"
    assert report["accel_reason"].startswith("TCG because")
    assert isinstance(report["ksm_writable"], bool)
    assert report["thp"] in ("always", "madvise", "never", "unavailable")
    assert report["kvm_nr_memslots"] is None or report["kvm_nr_memslots"] > 0


def test_doctor_names_the_host_by_the_environment_records_carry(tmp_path, monkeypatch, host) -> None:
    """One host fingerprint: what doctor says of the host (kernel, QEMU, CPU,
    THP, slots) is the environment every record carries, read once; only
    the accelerator is the fresh probe's."""
    use(tmp_path, monkeypatch, "hang")
    read: list[str] = []
    cpu_model = probe.cpu_model

    def counted() -> str:
        read.append("cpu")
        return cpu_model()

    monkeypatch.setattr(probe, "cpu_model", counted)
    found = probe.capabilities()
    env = probe.environment()
    assert found.environment == dataclasses.replace(
        env, accel=found.environment.accel, accel_reason=found.environment.accel_reason
    )
    shown = found.to_json()
    assert (shown["qemu_version"], shown["host_kernel"], shown["cpu_model"]) == (env.qemu, env.host_kernel, env.cpu)
    assert (shown["thp"], shown["kvm_nr_memslots"]) == (env.thp, env.kvm_nr_memslots)
    assert read == ["cpu", "cpu"]  # once for doctor's report, once for the environment asked here

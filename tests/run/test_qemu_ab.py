"""QEMU as an A/B axis: how kernels and QEMUs make arms, what the variants
tell each test, the warm snapshot per QEMU binary, and a whole two-QEMU
run against the fake avocado (tests/run/test_runjob.py's) with two fake QEMUs."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import fake_qemu
import pytest
from fake_avocado import guest_kernel_args, ksm_record, run_args, run_memqual
from one_line_errors import assert_one_line_error, in_process
from rich.console import Console

from memqual.host.cli import run as run_command
from memqual.host.core import snapshot
from memqual.host.core.clock import WALL_CLOCK
from memqual.host.core.errors import BadInput
from memqual.host.core.machine import Machine
from memqual.host.core.qemu import MachineConfig
from memqual.host.core.qemu_binary import QemuChoice
from memqual.host.run import ab_run, blocks
from memqual.host.run import config as run_config
from memqual.host.run import job as runjob

# --------------------------------------------------------- arm_pairing


@pytest.mark.parametrize(
    ("kernels", "qemus", "pairing"),
    [
        (0, 0, ((None, None),)),
        (1, 0, ((0, None),)),
        (0, 1, ((None, 0),)),
        (1, 1, ((0, 0),)),
        (2, 0, ((0, None), (1, None))),
        (2, 1, ((0, 0), (1, 0))),
        (0, 2, ((None, 0), (None, 1))),
        (1, 2, ((0, 0), (0, 1))),
        (2, 2, ((0, 0), (1, 1))),
    ],
)
def test_kernels_and_qemus_combine_into_one_or_two_arms(kernels: int, qemus: int, pairing: object) -> None:
    assert run_config.arm_pairing(kernels, qemus) == pairing


@pytest.mark.parametrize(("kernels", "qemus"), [(0, 3), (3, 0), (2, 3), (3, 2), (1, 5)])
def test_more_than_two_of_an_axis_is_refused(kernels: int, qemus: int) -> None:
    with pytest.raises(BadInput, match="at most twice"):
        run_config.arm_pairing(kernels, qemus)


def _choice(tmp_path: Path, name: str, version: str) -> QemuChoice:
    binary = tmp_path / f"qemu-{name}"
    return QemuChoice(binary=binary, version=version, origin=f"your build {binary}")


def test_run_arms_pair_kernels_and_qemus_in_order(tmp_path: Path) -> None:
    k1, k2 = (run_config.GuestKernel(label, tmp_path / f"bz{label}", None, label * 64) for label in ("A", "B"))
    q1, q2 = _choice(tmp_path, "1", "7.2.22"), _choice(tmp_path, "2", "10.0.2")
    base = run_config.RunConfig(output=tmp_path / "out")

    def given(kernels: tuple[run_config.GuestKernel, ...], qemus: tuple[QemuChoice, ...]) -> run_config.RunConfig:
        # As the command gives them: the arms checked once, where it parses them.
        pairing = run_config.arm_pairing(len(kernels), len(qemus))
        return dataclasses.replace(base, kernels=kernels, qemus=qemus, pairing=pairing)

    arms = run_config.run_arms(given((k1, k2), (q1, q2)))
    assert [(a.label, a.kernel, a.qemu) for a in arms] == [("A", k1, q1), ("B", k2, q2)]

    # One kernel (labelled "" by the command line), two QEMUs: the kernel is in both arms.
    one = dataclasses.replace(k1, label="")
    arms = run_config.run_arms(given((one,), (q1, q2)))
    assert [a.label for a in arms] == ["A", "B"]
    assert [a.kernel.bzimage if a.kernel else None for a in arms] == [k1.bzimage, k1.bzimage]
    assert [a.kernel.label if a.kernel else None for a in arms] == ["A", "B"]
    assert [a.qemu for a in arms] == [q1, q2]

    # Two kernels on one QEMU; two QEMUs on the default kernel.
    arms = run_config.run_arms(given((k1, k2), (q1,)))
    assert [a.qemu for a in arms] == [q1, q1]
    arms = run_config.run_arms(given((), (q1, q2)))
    assert [(a.kernel, a.qemu) for a in arms] == [(None, q1), (None, q2)]
    # One arm: no A/B.
    assert run_config.run_arms(given((), (q1,))) == ()


def test_variants_name_each_arms_qemu(tmp_path: Path) -> None:
    q1, q2 = _choice(tmp_path, "1", "7.2.22"), _choice(tmp_path, "2", "10.0.2")
    arms = {
        "A": run_config.Arm("A", None, q1).variant_params(),
        "B": run_config.Arm("B", None, q2).variant_params(),
    }
    out = blocks.variants(blocks.block_order(1, 2), arms)
    params = [{k: v for _, k, v in variant["variant"][0][1]} for variant in out]
    assert [(p["arm"], p["block"], p["qemu"]) for p in params] == [
        ("A", 1, str(q1.binary)),
        ("B", 1, str(q2.binary)),
        ("B", 2, str(q2.binary)),
        ("A", 2, str(q1.binary)),
    ]
    # No kernel given: the variant leaves the kernel to the default image.
    assert {p["kernel"] for p in params} == {""}
    # No QEMU given: empty, and the test keeps the job's.
    kernel = run_config.GuestKernel("A", tmp_path / "bz", None, "a" * 64)
    assert run_config.Arm("A", kernel, None).variant_params().qemu == ""


# ------------------------------------------------------ the command line


def test_three_qemus_are_one_line_and_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    args = ["run", "--output", str(tmp_path / "out"), "--qemu", "7.2", "--qemu", "10.0.2", "--qemu", "9.2"]
    result = in_process(args, {"MEMQUAL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert_one_line_error(result, "--qemu given 3 times", "at most twice")


def test_until_decided_takes_two_qemus_as_two_arms(tmp_path: Path) -> None:
    config = run_command.config_from_args(run_args(tmp_path, "--qemu", "7.2", "--qemu", "10.0.2", "--until-decided"))
    assert config.until_decided and config.rounds == 2  # two arms: two blocks unless told
    assert config.profile == "ab"  # two QEMUs are two arms, sized as two kernels are
    one = run_command.config_from_args(run_args(tmp_path, "--qemu", "7.2"))
    assert one.profile == "quick"
    with pytest.raises(BadInput, match="compares two arms"):
        run_command.config_from_args(run_args(tmp_path, "--qemu", "7.2", "--until-decided"))


def test_run_help_says_how_the_axes_combine(capsys) -> None:
    from memqual.host.cli import main as cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "twice to compare two QEMUs" in text
    assert "A = first kernel + first QEMU" in text


# ------------------------------------------------------------ snapshots


def _machine(config: MachineConfig) -> Machine:
    image = SimpleNamespace(directory=Path("/img/a"), kernel_sha256="k" * 64, initramfs_sha256="i" * 64)
    return cast(Machine, SimpleNamespace(config=config, image=image, accel="tcg", clock=WALL_CLOCK, host=None))


@pytest.mark.usefixtures("snapshot_cache")
def test_the_snapshot_key_is_per_qemu_binary_even_at_one_version(tmp_path: Path, monkeypatch) -> None:
    # snapshot_cache gives every QEMU one version: the binaries alone differ.
    first = fake_qemu.install(tmp_path / "one", "qmp")
    second = fake_qemu.install(tmp_path / "two", "qmp")
    config = MachineConfig()
    monkeypatch.setenv("MEMQUAL_QEMU", str(first))
    key_first = snapshot.snapshot_key(_machine(config))
    assert snapshot.snapshot_key(_machine(config)) == key_first  # stable
    monkeypatch.setenv("MEMQUAL_QEMU", str(second))
    key_second = snapshot.snapshot_key(_machine(config))
    assert key_second != key_first
    # The same binary rebuilt in place is another QEMU too.
    first.write_text(first.read_text() + "\n# rebuilt\n")
    monkeypatch.setenv("MEMQUAL_QEMU", str(first))
    assert snapshot.snapshot_key(_machine(config)) != key_first
    assert snapshot.qemu_identity(str(first))["binary"] == str(first.resolve())


# ------------------------------------------------------ a whole fake run


def test_two_qemus_run_interleaved_and_each_arm_says_its_qemu(tmp_path: Path, fake, monkeypatch) -> None:
    q1, q2 = _choice(tmp_path, "a", "7.2.22"), _choice(tmp_path, "b", "10.0.2")
    monkeypatch.setattr(run_command, "resolve_qemus", lambda specs: (q1, q2))
    built: list[object] = []
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: built.append(kernels))
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": ksm_record(4.0)}])
    args = run_args(tmp_path, "--qemu", "7.2", "--qemu", "10.0.2")
    config = dataclasses.replace(run_command.config_from_args(args), qemus=run_command.resolve_qemus(args.qemu))
    buf = io.StringIO()
    status = runjob.run(config, Console(file=buf, width=200))
    out = buf.getvalue()
    assert status == 0, out
    assert built == [()]  # no kernel given: nothing to build before the job
    calls = fake.calls()
    argv = calls[-1]["argv"]
    variants = json.loads(Path(argv[argv.index("--json-variants-load") + 1]).read_text())
    params = {v["variant_id"]: {k: val for _, k, val in v["variant"][0][1]} for v in variants}
    assert params["b1-A"]["qemu"] == str(q1.binary) and params["b2-B"]["qemu"] == str(q2.binary)
    for label, q in (("A", q1), ("B", q2)):
        results = json.loads((tmp_path / "out" / label / "results.json").read_text())
        assert results["run"]["qemu"] == {"version": q.version, "origin": q.origin, "binary": str(q.binary)}
        assert results["run"]["label"] == label
    comparison = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert comparison["arms"]["A"]["qemu"]["version"] == "7.2.22"
    assert comparison["arms"]["B"]["qemu"]["version"] == "10.0.2"
    assert comparison["arms"]["A"]["kernel"] is None
    assert "A: the default kernel, QEMU 7.2.22" in out and "B: the default kernel, QEMU 10.0.2" in out


def test_two_kernels_and_two_qemus_pair_in_order(tmp_path: Path, fake, monkeypatch) -> None:
    q1, q2 = _choice(tmp_path, "a", "7.2.22"), _choice(tmp_path, "b", "10.0.2")
    monkeypatch.setattr(ab_run, "prebuild", lambda kernels, console: None)
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": ksm_record(4.0)}])
    args = run_args(tmp_path, *guest_kernel_args(tmp_path), "--qemu", "7.2", "--qemu", "10.0.2")
    config = dataclasses.replace(run_command.config_from_args(args), qemus=(q1, q2))
    status = runjob.run(config, Console(file=io.StringIO()))
    assert status == 0
    argv = fake.calls()[-1]["argv"]
    variants = json.loads(Path(argv[argv.index("--json-variants-load") + 1]).read_text())
    params = {v["variant_id"]: {k: val for _, k, val in v["variant"][0][1]} for v in variants}
    assert params["b1-A"]["kernel"].endswith("bzImage-a") and params["b1-A"]["qemu"] == str(q1.binary)
    assert params["b1-B"]["kernel"].endswith("bzImage-b") and params["b1-B"]["qemu"] == str(q2.binary)


def test_one_qemu_run_is_one_arm(tmp_path: Path, fake) -> None:
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": ksm_record(4.0)}])
    status, _ = run_memqual(tmp_path)
    assert status == 0
    assert "--json-variants-load" not in fake.calls()[0]["argv"]


# ------------------------------------------------------------- bisect


def test_a_bisect_runs_one_qemu(tmp_path: Path, monkeypatch, capsys) -> None:
    args = ["bisect", "--kernels", "a", "b", "--metric", "m", "--qemu", "7.2", "--qemu", "10.0.2"]
    result = in_process(args, {"MEMQUAL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert_one_line_error(result, "--qemu given twice")


def test_a_resumed_bisect_runs_the_qemu_it_started_with(tmp_path: Path, monkeypatch) -> None:
    from memqual.host.core import qemu_binary
    from memqual.host.run.bisect import jobs as bisect

    fake = fake_qemu.install(tmp_path / "q", "qmp")
    monkeypatch.delenv("MEMQUAL_QEMU", raising=False)
    chosen = _choice(tmp_path, "x", "10.0.2")
    monkeypatch.setattr(qemu_binary, "choose", lambda spec: chosen if spec else None)
    directory = tmp_path / "bisect"
    assert bisect.bisect_qemu(str(fake), directory, resuming=False) is chosen
    noted = json.loads((directory / bisect.QEMU_FILE).read_text())
    assert noted["spec"] == str(fake) and noted["version"] == "10.0.2"
    # Resumed: the noted QEMU, whether --qemu is left out or repeated.
    assert bisect.bisect_qemu(None, directory, resuming=True) is chosen
    assert bisect.bisect_qemu(str(fake), directory, resuming=True) is chosen
    with pytest.raises(BadInput, match="it ran with --qemu"):
        bisect.bisect_qemu("7.2", directory, resuming=True)
    # A bisect started on the environment's QEMU is resumed on it.
    other = tmp_path / "other"
    assert bisect.bisect_qemu(None, other, resuming=False) is None
    with pytest.raises(BadInput, match="environment's QEMU"):
        bisect.bisect_qemu("7.2", other, resuming=True)


def test_a_bisect_steps_variants_carry_its_qemu(tmp_path: Path) -> None:
    kernel = run_config.GuestKernel("B", tmp_path / "bz", None, "b" * 64)
    chosen = _choice(tmp_path, "x", "10.0.2")
    params = run_config.Arm(kernel.label, kernel, chosen).variant_params()
    assert params.qemu == str(chosen.binary) and params.arm == "B"


# ---------------------------------------------------------- lab hosts


def _lab_host(tmp_path: Path):
    from memqual.host.run.hosts import config

    key, known = tmp_path / "id_test", tmp_path / "known_hosts"
    key.write_text("not a real key\n")
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    return config.LabHost(name="lab1", address="10.0.0.1", key=key, known_hosts=known)


def test_hosts_check_runs_each_hosts_doctor_of_the_qemu_asked_for(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    from memqual.host.run.hosts import check, ssh
    from memqual.host.run.hosts.probe import HostProbe

    host = _lab_host(tmp_path)
    answer = HostProbe("1", "boot", {"host_kernel": "6.1.0"}, "/run/memqual/measure.lock", True, None)
    monkeypatch.setattr(check, "probe_host", lambda h: check.HostCheck(h, "", answer))
    seen: list[list[str]] = []

    def run(h, argv, timeout_s):
        seen.append(argv)
        asked = "--qemu" in argv
        report = {
            "qemu_version": "10.0.2" if asked else "7.2.22",
            "qemu_origin": "Debian bookworm-backports 1:10.0.2+ds-2" if asked else "system /usr/bin/qemu",
            "kvm_boots_linux": False,
            "kvm_device": False,
        }
        return subprocess.CompletedProcess(argv, 0, json.dumps(report), "")

    monkeypatch.setattr(ssh, "run", run)
    own = check.check_host(host)
    asked = check.check_host(host, qemu="10.0.2")
    assert seen[0][-2:] == ["doctor", "--json"]
    assert seen[1][-4:] == ["doctor", "--json", "--qemu", "10.0.2"]
    (line_own,) = check.lines([own])
    (line_asked,) = check.lines([asked])
    assert "QEMU 7.2.22" in line_own and "QEMU from system" in line_own
    assert "QEMU 10.0.2" in line_asked and "bookworm-backports" in line_asked


def test_a_host_that_cannot_have_the_qemu_asked_for_is_not_ready(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    from memqual.host.run.hosts import check, ssh

    host = _lab_host(tmp_path)
    monkeypatch.setattr(check, "probe_host", lambda h: check.HostCheck(h, ""))
    err = "memqual: error: QEMU 9.9 is not in the archive: memqual qemu list shows what is\n"
    monkeypatch.setattr(ssh, "run", lambda h, argv, t: subprocess.CompletedProcess(argv, 2, "", err))
    checked = check.check_host(host, qemu="9.9")
    assert not checked.usable and "doctor exited 2" in checked.problem


def test_run_hosts_takes_one_qemu_for_the_hosts_to_fetch_and_refuses_two(tmp_path: Path, monkeypatch, capsys) -> None:
    from memqual.host.run.hosts import fleet

    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[host]]\nname = "a"\naddress = "10.0.0.1"\n')
    args = ["run", "--hosts", str(hosts), "--qemu", "7.2", "--qemu", "10.0.2", "--output", str(tmp_path / "out")]
    result = in_process(args, {"MEMQUAL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert_one_line_error(result, "--hosts runs one QEMU on every host")
    # Once: nothing is fetched here, each host is asked for it.
    seen = []

    def run(config, path, qemu=None):
        seen.append((path, qemu))
        return 0

    monkeypatch.setattr(fleet, "run", run)
    args = ["run", "--hosts", str(hosts), "--qemu", "10.0.2", "--output", str(tmp_path / "out")]
    result = in_process(args, {"MEMQUAL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert result["status"] == 0, result
    assert seen == [(hosts, "10.0.2")]
    assert not (tmp_path / "cache" / "qemu").exists()


# ------------------------------------------------- the guest's CPU model

CPUINFO_72 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 15
model\t\t: 107
model name\t: QEMU TCG CPU version 2.5+
flags\t\t: fpu sse2 rep_good extd_apicid nopl

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 15
"""
CPUINFO_100 = CPUINFO_72.replace("family\t: 15\nmodel\t\t: 107", "family\t: 6\nmodel\t\t: 6").replace(
    "rep_good extd_apicid", "fsrm x2apic"
)


def test_the_guest_cpu_is_read_from_the_guest_and_differs_between_qemus() -> None:
    from memqual.host.core.environment import Environment, guest_cpu_from

    assert guest_cpu_from(CPUINFO_72) == (
        "AuthenticAMD family 15 model 107 (QEMU TCG CPU version 2.5+)",
        "extd_apicid fpu nopl rep_good sse2",
    )
    old = Environment(qemu="7.2.22").with_guest_cpu(CPUINFO_72)
    new = Environment(qemu="10.0.2").with_guest_cpu(CPUINFO_100)
    assert old.guest_cpu != new.guest_cpu and "rep_good" not in (new.guest_cpu_flags or "")
    assert new.to_json()["guest_cpu"] == "AuthenticAMD family 6 model 6 (QEMU TCG CPU version 2.5+)"
    # Nothing read (the guest had gone): the environment stays as it was.
    assert Environment(qemu="7.2.22").with_guest_cpu("") == Environment(qemu="7.2.22")
    assert guest_cpu_from("processor : 0\nflags : fpu\n") is None

"""QEMU as an A/B axis: how kernels and QEMUs make arms, what the variants
tell each test, the warm snapshot per QEMU binary, and a whole two-QEMU
run against the fake avocado (tests/test_runjob.py's) with two fake QEMUs."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import fake_qemu
import pytest
import test_runjob
from rich.console import Console
from test_cli_errors import assert_one_line_error, in_process
from test_runjob import _args, _ksm_record, _run, guest_kernel_args

from memqual.host import blocks, runjob, snapshot
from memqual.host.errors import BadInput
from memqual.host.machine import Machine
from memqual.host.qemu import MachineConfig
from memqual.host.qemu_binary import QemuChoice

fake = test_runjob.fake  # the fixture, shared with test_runjob


# ------------------------------------------------------------ arm_axes


@pytest.mark.parametrize(
    ("kernels", "qemus", "axes"),
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
def test_kernels_and_qemus_combine_into_one_or_two_arms(kernels: int, qemus: int, axes: object) -> None:
    assert blocks.arm_axes(kernels, qemus) == axes


@pytest.mark.parametrize(("kernels", "qemus"), [(0, 3), (3, 0), (2, 3), (3, 2), (1, 5)])
def test_more_than_two_of_an_axis_is_refused(kernels: int, qemus: int) -> None:
    with pytest.raises(BadInput, match="at most twice"):
        blocks.arm_axes(kernels, qemus)


def _choice(tmp_path: Path, name: str, version: str) -> QemuChoice:
    binary = tmp_path / f"qemu-{name}"
    return QemuChoice(binary=binary, version=version, origin=f"your build {binary}")


def test_run_arms_pair_kernels_and_qemus_in_order(tmp_path: Path) -> None:
    k1, k2 = (runjob.GuestKernel(label, tmp_path / f"bz{label}", None, label * 64) for label in ("A", "B"))
    q1, q2 = _choice(tmp_path, "1", "7.2.22"), _choice(tmp_path, "2", "10.0.2")
    base = runjob.RunConfig(output=tmp_path / "out")

    arms = runjob.run_arms(dataclasses.replace(base, kernels=(k1, k2), qemus=(q1, q2)))
    assert [(a.label, a.kernel, a.qemu) for a in arms] == [("A", k1, q1), ("B", k2, q2)]

    # One kernel (labelled "" by the command line), two QEMUs: the kernel is in both arms.
    one = dataclasses.replace(k1, label="")
    arms = runjob.run_arms(dataclasses.replace(base, kernels=(one,), qemus=(q1, q2)))
    assert [a.label for a in arms] == ["A", "B"]
    assert [a.kernel.bzimage if a.kernel else None for a in arms] == [k1.bzimage, k1.bzimage]
    assert [a.kernel.label if a.kernel else None for a in arms] == ["A", "B"]
    assert [a.qemu for a in arms] == [q1, q2]

    # Two kernels on one QEMU; two QEMUs on the default kernel.
    arms = runjob.run_arms(dataclasses.replace(base, kernels=(k1, k2), qemus=(q1,)))
    assert [a.qemu for a in arms] == [q1, q1]
    arms = runjob.run_arms(dataclasses.replace(base, qemus=(q1, q2)))
    assert [(a.kernel, a.qemu) for a in arms] == [(None, q1), (None, q2)]
    # One arm: no A/B.
    assert runjob.run_arms(dataclasses.replace(base, qemus=(q1,))) == ()


def test_variants_name_each_arms_qemu(tmp_path: Path) -> None:
    q1, q2 = _choice(tmp_path, "1", "7.2.22"), _choice(tmp_path, "2", "10.0.2")
    arms = {
        "A": runjob.arm_params(None, q1, "A"),
        "B": runjob.arm_params(None, q2, "B"),
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
    kernel = runjob.GuestKernel("A", tmp_path / "bz", None, "a" * 64)
    assert runjob.arm_params(kernel).qemu == ""


# ------------------------------------------------------ the command line


def test_three_qemus_are_one_line_and_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    args = ["run", "--output", str(tmp_path / "out"), "--qemu", "7.2", "--qemu", "10.0.2", "--qemu", "9.2"]
    result = in_process(args, {"MEMQUAL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert_one_line_error(result, "--qemu given 3 times", "at most twice")


def test_until_decided_takes_two_qemus_as_two_arms(tmp_path: Path) -> None:
    config = runjob.config_from_args(_args(tmp_path, "--qemu", "7.2", "--qemu", "10.0.2", "--until-decided"))
    assert config.until_decided and config.rounds == 2  # two arms: two blocks unless told
    with pytest.raises(BadInput, match="compares two arms"):
        runjob.config_from_args(_args(tmp_path, "--qemu", "7.2", "--until-decided"))


def test_run_help_says_how_the_axes_combine(capsys) -> None:
    from memqual.host import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "twice to compare two QEMUs" in text
    assert "A = first kernel + first QEMU" in text


# ------------------------------------------------------------ snapshots


def _machine(config: MachineConfig) -> Machine:
    image = SimpleNamespace(directory=Path("/img/a"), kernel_sha256="k" * 64, initramfs_sha256="i" * 64)
    return cast(Machine, SimpleNamespace(config=config, image=image, accel="tcg"))


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
    monkeypatch.setattr(runjob, "resolve_qemus", lambda specs: (q1, q2))
    built: list[object] = []
    monkeypatch.setattr(runjob, "prebuild", lambda kernels, console: built.append(kernels))
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": _ksm_record(4.0)}])
    args = _args(tmp_path, "--qemu", "7.2", "--qemu", "10.0.2")
    config = dataclasses.replace(runjob.config_from_args(args), qemus=runjob.resolve_qemus(args.qemu))
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
    monkeypatch.setattr(runjob, "prebuild", lambda kernels, console: None)
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": _ksm_record(4.0)}])
    args = _args(tmp_path, *guest_kernel_args(tmp_path), "--qemu", "7.2", "--qemu", "10.0.2")
    config = dataclasses.replace(runjob.config_from_args(args), qemus=(q1, q2))
    status = runjob.run(config, Console(file=io.StringIO()))
    assert status == 0
    argv = fake.calls()[-1]["argv"]
    variants = json.loads(Path(argv[argv.index("--json-variants-load") + 1]).read_text())
    params = {v["variant_id"]: {k: val for _, k, val in v["variant"][0][1]} for v in variants}
    assert params["b1-A"]["kernel"].endswith("bzImage-a") and params["b1-A"]["qemu"] == str(q1.binary)
    assert params["b1-B"]["kernel"].endswith("bzImage-b") and params["b1-B"]["qemu"] == str(q2.binary)


def test_one_qemu_run_is_one_arm(tmp_path: Path, fake) -> None:
    fake.plan(tests=[{"name": "e2e/test_ksm.py:Ksm.test_volatile", "status": "PASS", "records": _ksm_record(4.0)}])
    status, _ = _run(tmp_path)
    assert status == 0
    assert "--json-variants-load" not in fake.calls()[0]["argv"]

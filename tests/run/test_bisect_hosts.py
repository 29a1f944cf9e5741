"""memqual bisect over host kernels: the options' checks, the arms a
probe's step builds (each arm's host under test in its variant), the clock
and the series a resume keeps, and the log, state and page naming the
axis.  No guest: a fake runner, and once a fake avocado through runjob."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_bisect_runner import FakeRunner

from memqual.host.cli import main as cli
from memqual.host.core import clock, nested
from memqual.host.core.errors import BadInput
from memqual.host.core.kernelspec import KernelSpec
from memqual.host.run.bisect import axis, jobs, run
from memqual.host.run.config import GuestKernel

DEB = "6.12.111+deb12-amd64"
A, B = "6.1.0-57-amd64", "6.1.0-57-amd64:quiet"
KNOWN = {"kvm": {"mmio_caching", "tdp_mmu"}, "kvm_amd": {"npt", "nested"}}
METRIC = ["--metric", "deflate_s"]


@pytest.fixture
def known_modules(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every host kernel known, with kvm and kvm_amd, but those whose
    names hold "nokvm" (no kvm_amd) or "nosuch" (unknown); the kernels
    checked, in order."""
    asked: list[str] = []

    def module_parameters(source):
        asked.append(source.debian)
        if "nokvm" in source.debian:
            raise BadInput("the host kernel has no kvm_amd module: build it with CONFIG_KVM_AMD=m")
        if "nosuch" in source.debian:
            raise BadInput(f"'{source.debian}' is no Debian kernel name")
        return KNOWN

    monkeypatch.setattr("memqual.images.host_image.module_parameters", module_parameters)
    return asked


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--host-kernels", A, B, "--kernels", "c", "d"], "--kernels/--kernel-source (of guest kernels), not both"),
        (["--host-kernels", A, B, "--kernel-source", "/x", "--good", "1", "--bad", "2"], "not both"),
        (["--host-kernel-source", "/x", "--good", "1", "--bad", "2", "--kernels", "a", "b"], "not both"),
        (["--host-kernel-source", "/x", "--host-kernels", A, B], "--host-kernel-source DIR --good REV --bad REV"),
        (["--host-kernel-source", "/x", "--good", "1"], "needs all three"),
        (["--host-kernels", A], "at least 2 kernels (the good K1 and the bad Kn), 1 given: --host-kernels"),
        (["--host-kernels", A, B, A], "the first and the last kernel are the same"),
        (["--host-kernels", A, B, "--host-kernel", DEB], "give --host-kernels or --host-kernel, not both"),
        (["--kernels", "a", "b", "--host-kernel-param", "kvm_amd.npt=0"], "--host-kernel-param sets"),
        (["--host-kernel-param", "kvm_amd.npt=0"], "--host-kernel-param sets"),
        (["--kernels", "a", "b", "--host-kernel", A, "--host-kernel", B], "--host-kernel given twice"),
        (["--kernels", "a", "b", "--debian-kernel", DEB], "the one guest of a series of host kernels"),
        (["--host-kernels", A, B, "--debian-kernel", DEB, "--debian-kernel", DEB], "one guest kernel"),
        (["--host-kernels", A, B, "--good", "1", "--bad", "2"], "--good and --bad name revisions"),
        (["--host-kernels", A, "6.1.0-9-nosuch"], "no Debian kernel name"),
        (["--host-kernels", A, "6.1.0-9-nokvm"], "has no kvm_amd module"),
        (["--host-kernels", A, B, "--host-kernel-param", "kvm_amd.ept=0"], "has no parameter ept"),
        (["--kernels", "a", "b", "--host-kernel", "6.1.0-9-nokvm"], "has no kvm_amd module"),
    ],
)
def test_bad_host_series_input_is_one_line_and_makes_nothing(argv, says, tmp_path, capsys, known_modules) -> None:
    out = tmp_path / "out"
    assert cli.main(["bisect", *argv, *METRIC, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_every_host_is_checked_before_any_job_and_a_revision_when_built(known_modules) -> None:
    series = [KernelSpec(DEB), KernelSpec(DEB, "quiet"), KernelSpec("/src/linux@" + "a" * 40)]
    the_axis = axis.Axis(axis.HOST, host_params=("kvm_amd.npt=0",))
    assert [h.name for h in the_axis.hosts([*series, series[1]])] == [
        f"{DEB} kvm_amd.npt=0",
        f"{DEB}:quiet kvm_amd.npt=0",
        f"/src/linux@{'a' * 40} kvm_amd.npt=0",
    ]
    built: list[str] = []
    checked: list[list[nested.HostUnderTest]] = []

    def build(version: str) -> str:
        built.append(version)
        return "6.1.192-memqual-0123456789abcdef"

    names = axis.HostNames(("kvm_amd.npt=0",), build=build, check=checked.append)
    revision = series[2]
    for _ in range(2):  # built and checked once, then named from memory
        assert names(revision) == KernelSpec("6.1.192-memqual-0123456789abcdef")
    assert built == [revision.version] and len(checked) == 1
    assert checked[0][0].params == ("kvm_amd.npt=0",)
    assert names(series[1]) is series[1]  # a Debian kernel is its own name


# ------------------------------------------------------------ the arms of a step


def _guest(label: str, spec: KernelSpec) -> GuestKernel:
    return GuestKernel(label, Path(f"/k/{spec.version}"), Path("/m"), "sum", spec.cmdline_extra)


@pytest.mark.parametrize(
    ("the_axis", "kernels", "host_kernels", "cmdlines"),
    [
        # A series of host kernels: each arm its host, the default guest on both.
        (axis.Axis(axis.HOST, host_params=("kvm.mmio_caching=0",)), ["", ""], [DEB, f"{DEB}:quiet"], ["", ""]),
        # ... with one guest kernel fixed: the same files on both arms.
        (
            axis.Axis(axis.HOST, guest=axis.FixedGuest("6.1.0-57-amd64", "/g/vmlinuz", "/g/mods", "s", "x=1")),
            ["/g/vmlinuz", "/g/vmlinuz"],
            [DEB, f"{DEB}:quiet"],
            ["x=1", "x=1"],
        ),
        # A series of guest kernels on one host under test: one host, each arm its kernel.
        (axis.Axis(axis.GUEST, host=DEB), [f"/k/{DEB}", f"/k/{DEB}"], [DEB, DEB], ["", "quiet"]),
        # ... on this machine: no host.
        (axis.Axis(), [f"/k/{DEB}", f"/k/{DEB}"], ["", ""], ["", "quiet"]),
    ],
)
def test_a_step_s_arms_differ_on_the_series_axis_alone(the_axis, kernels, host_kernels, cmdlines) -> None:
    specs = {"A": KernelSpec(DEB), "B": KernelSpec(DEB, "quiet")}
    arms = axis.step_arms(the_axis, specs, _guest, lambda spec: spec)
    params = {label: arm.variant_params() for label, arm in arms.items()}
    assert [p.kernel for p in params.values()] == kernels
    assert [p.host_kernel for p in params.values()] == host_kernels
    assert [p.cmdline_extra for p in params.values()] == cmdlines
    want = " ".join(the_axis.host_params)
    assert all(p.host_kernel_params == (want if p.host_kernel else "") for p in params.values())
    hosts = axis.step_hosts(arms)
    assert len(hosts) == (2 if the_axis.kind == axis.HOST else 1 if the_axis.host else 0)


def test_a_built_revision_boots_by_its_built_name() -> None:
    revision = KernelSpec("/src/linux@" + "b" * 40)
    arms = axis.step_arms(
        axis.Axis(axis.HOST), {"B": revision}, _guest, lambda spec: KernelSpec("6.1.192-memqual-" + "1" * 16)
    )
    assert arms["B"].variant_params().host_kernel == "6.1.192-memqual-" + "1" * 16
    assert axis.step_hosts(arms) == (arms["B"].host,)


def test_the_axis_round_trips_and_a_state_without_one_is_a_guest_series() -> None:
    the_axis = axis.Axis(axis.HOST, host_params=("kvm_amd.npt=0",), guest=axis.FixedGuest("g", "/b", "/m", "s", "q"))
    assert axis.Axis.from_json(json.loads(json.dumps(the_axis.to_json()))) == the_axis
    assert axis.Axis.from_json(None) == axis.Axis()
    with pytest.raises(ValueError):
        axis.Axis(axis.GUEST, host_params=("kvm_amd.npt=0",))


# ------------------------------------------------------------ the clock


@pytest.mark.parametrize(
    ("asked", "on_hosts", "label"),
    [
        (None, True, f"icount:{nested.MAX_SHIFT}"),  # L1's instructions, at the shift L1 runs
        ("icount:4", True, f"icount:{nested.MAX_SHIFT}"),
        ("wall", True, "wall"),
        (None, False, "wall"),
        ("icount:4", False, "icount:4"),
    ],
)
def test_a_bisect_on_hosts_defaults_to_l1_s_icount_and_a_resume_keeps_it(asked, on_hosts, label, tmp_path) -> None:
    try:
        assert jobs.bisect_clock(asked, tmp_path, resuming=False, on_hosts=on_hosts).label == label
        (tmp_path / jobs.QEMU_FILE).write_text(json.dumps({"spec": None, "clock": label}))
        assert jobs.bisect_clock(None, tmp_path, resuming=True, on_hosts=on_hosts).label == label
        assert jobs.bisect_clock(asked, tmp_path, resuming=True, on_hosts=on_hosts).label == label
        other = "wall" if label != "wall" else "icount:2"
        with pytest.raises(BadInput, match=f"it ran on the {label} clock"):
            jobs.bisect_clock(other, tmp_path, resuming=True, on_hosts=on_hosts)
    finally:
        clock.put(clock.WALL_CLOCK)


# ------------------------------------------------------------ the bisector


def _host_settings(n: int, **kw) -> run.Settings:
    # FakeRunner reads each kernel's index from its last "=N" word.
    kernels = tuple(KernelSpec(DEB, f"memqual.k={i}") for i in range(n))
    the_axis = axis.Axis(axis.HOST, host_params=("kvm_amd.npt=0",))
    return run.Settings(kernels=kernels, metric="deflate_s", axis=the_axis, **kw)


def test_the_log_state_and_page_name_the_axis_and_each_probe_s_host(tmp_path) -> None:
    runner = FakeRunner(step=3)
    b = run.Bisector(_host_settings(6), tmp_path / "b", runner, say=lambda line: None, clock=runner.clock)
    assert b.run().first_bad == 3
    log = (tmp_path / "b" / "bisect.log").read_text()
    assert "# the series: host kernels: each probe's guests run on its host kernel kvm_amd.npt=0" in log
    assert f"#   K4 = host {DEB}:memqual.k=3" in log
    assert f"[K4] host {DEB}:memqual.k=3 is the first bad kernel" in log
    state = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert state["axis"] == "host" and state["settings"]["axis"]["kind"] == "host"
    assert {p["index"]: p["host"] for p in state["probes"]}[3] == f"{DEB}:memqual.k=3 kvm_amd.npt=0"
    html = (tmp_path / "b" / "bisect.html").read_text()
    assert "the series: host kernels" in html and "6 host kernels" in html and "host under test</th>" in html
    assert f"<td>K4 host {DEB}:memqual.k=3</td><td>{DEB}:memqual.k=3 kvm_amd.npt=0</td>" in html


def test_a_guest_series_page_has_no_host_column(tmp_path) -> None:
    kernels = tuple(KernelSpec(DEB, f"memqual.k={i}") for i in range(4))
    runner = FakeRunner(step=2)
    settings = run.Settings(kernels=kernels, metric="deflate_s")
    run.Bisector(settings, tmp_path / "b", runner, say=lambda line: None, clock=runner.clock).run()
    html = (tmp_path / "b" / "bisect.html").read_text()
    assert "4 guest kernels" in html and "host under test</th>" not in html
    assert (
        "# the series: guest kernels: each probe's guests boot it, on this machine"
        in (tmp_path / "b" / "bisect.log").read_text()
    )


def test_a_resumed_host_bisect_keeps_its_series_and_refuses_another(tmp_path, capsys, monkeypatch) -> None:
    b = run.Bisector(_host_settings(6), tmp_path / "b", FakeRunner(step=3, interrupt_after=2), say=lambda line: None)
    with pytest.raises(KeyboardInterrupt):
        b.run()
    (tmp_path / "b" / jobs.QEMU_FILE).write_text(json.dumps({"spec": None, "clock": f"icount:{nested.MAX_SHIFT}"}))
    resumed = run.Bisector.resume(tmp_path / "b", FakeRunner(step=3), say=lambda line: None)
    assert resumed.settings == _host_settings(6)
    names = [k.name for k in _host_settings(6).kernels]
    for argv, says in (
        (["--kernels", *names], "(host kernels); leave --host-kernels out"),
        (["--host-kernels", DEB, f"{DEB}:x"], "its kernels are"),
        (["--host-kernel-param", "kvm.mmio_caching=0"], "it keeps its hosts under test"),
        (["--debian-kernel", DEB], "it keeps its guest"),
    ):
        assert cli.main(["bisect", "--resume", str(tmp_path / "b"), *argv]) == 2
        assert says in capsys.readouterr().err
    seen: list[run.Settings] = []

    def runner(settings, console, qemu=None):
        seen.append(settings)
        return FakeRunner(step=3)

    monkeypatch.setattr(jobs, "avocado_runner", runner)
    try:
        assert cli.main(["bisect", "--resume", str(tmp_path / "b"), "--host-kernels", *names]) == 0
        assert clock.current().label == f"icount:{nested.MAX_SHIFT}"
    finally:
        clock.put(clock.WALL_CLOCK)
    assert seen[0].axis == _host_settings(6).axis
    assert json.loads((tmp_path / "b" / "bisect.json").read_text())["outcome"]["first_bad"] == 3


# ------------------------------------------------------------ through runjob


def _fake_avocado(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake avocado whose every arm B records deflate_s 1.5 times arm
    A's; the folder of tests it is handed."""
    from fake_avocado import slower_deflate_on_b

    slower_deflate_on_b(tmp_path, monkeypatch)
    e2e = tmp_path / "e2e"
    e2e.mkdir()
    return e2e


def _first_job_variants(tmp_path: Path) -> list[tuple[str, dict[str, str]]]:
    call = json.loads((tmp_path / "calls.jsonl").read_text().splitlines()[0])
    data = json.loads(Path(call["argv"][call["argv"].index("--json-variants-load") + 1]).read_text())
    return [(v["variant_id"], {k: val for _, k, val in v["variant"][0][1]}) for v in data]


@pytest.mark.parametrize(
    ("series", "host_kernels", "kernels_differ"),
    [
        # host kernels: K3 against K1 on their own hosts, the default guest on both
        (
            ["--host-kernels", DEB, f"{DEB}:quiet", f"{DEB}:transparent_hugepage=never"],
            [DEB, f"{DEB}:transparent_hugepage=never"],
            False,
        ),
        # guest kernels on one host under test: the same host, each arm its guest's command line
        (["--kernels", A, A, "6.1.0-57-amd64:init_on_free=1", "--host-kernel", DEB], [DEB, DEB], True),
    ],
)
def test_each_arm_s_variant_carries_its_host_through_avocado(
    series, host_kernels, kernels_differ, tmp_path, monkeypatch, known_modules
) -> None:
    """The real runner against a fake avocado: a step's two variants are K1
    (arm A) and the probe (arm B), each with its host under test and its
    parameters, every host checked once before any job."""
    from memqual.images import build

    e2e = _fake_avocado(tmp_path, monkeypatch)
    bz, mods = tmp_path / "vmlinuz", tmp_path / "modules"
    bz.write_bytes(b"kernel")
    mods.mkdir()
    monkeypatch.setattr(build, "debian_kernel_files", lambda v: (bz, mods))
    argv = ["bisect", *series, *METRIC, "--clock", "wall", "--output", str(tmp_path / "out"), "--tests", str(e2e)]
    try:
        assert cli.main([*argv, "--host-kernel-param", "kvm.mmio_caching=0"]) == 0
    finally:
        clock.put(clock.WALL_CLOCK)
    # each distinct host checked once (its kernel's modules), before any job
    assert known_modules == [DEB] * (3 if not kernels_differ else 1)
    first = _first_job_variants(tmp_path)
    assert [vid for vid, _ in first] == ["b1-A", "b1-B"]
    assert [p["host_kernel"] for _, p in first] == host_kernels
    assert all(p["host_kernel_params"] == "kvm.mmio_caching=0" for _, p in first)
    assert [p["kernel"] for _, p in first] == ([str(bz)] * 2 if kernels_differ else ["", ""])
    assert [p["cmdline_extra"] for _, p in first] == (["", "init_on_free=1"] if kernels_differ else ["", ""])
    state = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert state["outcome"]["first_bad"] == 1
    assert state["settings"]["axis"]["kind"] == ("guest" if kernels_differ else "host")

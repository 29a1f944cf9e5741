"""memqual.host.core.qemu.command_line: a pure function from a MachineConfig to argv."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memqual.host.core import clock as clocks
from memqual.host.core import qemu
from memqual.host.core.clock import parse as parse_clock
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.qemu import BalloonDevice, MachineConfig, command_line, kernel_cmdline, tcg_accel_option


@pytest.fixture(autouse=True)
def fake_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    binary = tmp_path / "qemu-system-x86_64"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    monkeypatch.setenv("MEMQUAL_QEMU", str(binary))
    return binary


def argv_for(config: MachineConfig, accel: str = "tcg", port: int = 40123, incoming: str | None = None) -> list[str]:
    return command_line(
        config,
        accel,
        Path("/img/kernel"),
        Path("/img/initrd"),
        Path("/tmp/mq-x/qmp.sock"),
        Path("/tmp/mq-x/console.log"),
        port,
        incoming,
    )


def values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def devices(argv: list[str]) -> list[str]:
    return values(argv, "-device")


def test_binary_comes_from_memqual_qemu(fake_binary: Path) -> None:
    assert argv_for(MachineConfig())[0] == str(fake_binary)


def test_memqual_qemu_that_is_not_executable_is_bad_input(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMQUAL_QEMU", str(tmp_path / "missing"))
    with pytest.raises(BadInput, match="MEMQUAL_QEMU"):
        qemu.qemu_binary()


def test_missing_qemu_on_path_is_a_missing_capability(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MEMQUAL_QEMU")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(CapabilityMissing, match="qemu-system-x86_64 not found"):
        qemu.qemu_binary()


@pytest.mark.parametrize("port", [40123, 51000])
def test_port_and_paths_are_the_ones_given(port: int) -> None:
    argv = argv_for(MachineConfig(), port=port)
    (netdev,) = values(argv, "-netdev")
    assert f"hostfwd=tcp:127.0.0.1:{port}-:22" in netdev  # loopback only, the port chosen at launch
    assert "path=/tmp/mq-x/qmp.sock" in " ".join(values(argv, "-chardev"))
    assert "path=/tmp/mq-x/console.log" in " ".join(values(argv, "-chardev"))
    assert values(argv, "-kernel") == ["/img/kernel"] and values(argv, "-initrd") == ["/img/initrd"]


def test_nothing_fixed_between_two_guests() -> None:
    """Two launches differ only where the launcher says: port and paths."""
    a = command_line(MachineConfig(), "tcg", Path("/k"), Path("/i"), Path("/tmp/a/q"), Path("/tmp/a/c"), 1111)
    b = command_line(MachineConfig(), "tcg", Path("/k"), Path("/i"), Path("/tmp/b/q"), Path("/tmp/b/c"), 2222)
    differing = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    assert len(a) == len(b) and len(differing) == 3
    for x, y in differing:
        assert ("/tmp/a/" in x and "/tmp/b/" in y) or ("1111" in x and "2222" in y)


def test_safety_options_always_present() -> None:
    argv = argv_for(MachineConfig())
    for flag in ("-no-reboot", "-nodefaults", "-no-user-config"):
        assert flag in argv
    assert values(argv, "-display") == ["none"]
    assert "panic=-1" in values(argv, "-append")[0].split()


@pytest.mark.parametrize("merge,expected", [(True, "mem-merge=on"), (False, "mem-merge=off")])
def test_mem_merge(merge: bool, expected: str) -> None:
    (machine,) = values(argv_for(MachineConfig(mem_merge=merge)), "-M")
    assert expected in machine.split(",")


@pytest.mark.parametrize("reporting", [False, True])
@pytest.mark.parametrize("oom", [False, True])
def test_balloon_properties(reporting: bool, oom: bool) -> None:
    config = MachineConfig(balloon=BalloonDevice(free_page_reporting=reporting, deflate_on_oom=oom, id="b7"))
    (balloon,) = [d for d in devices(argv_for(config)) if "balloon" in d]
    props = balloon.split(",")
    assert "id=b7" in props
    assert f"free-page-reporting={'on' if reporting else 'off'}" in props
    assert f"deflate-on-oom={'on' if oom else 'off'}" in props


@pytest.mark.parametrize(
    ("machine", "clock", "ioeventfd_off"),
    [("pc", "icount:4", True), ("q35", "icount:2", True), ("pc", "wall", False), ("microvm", "icount:4", False)],
)
def test_the_balloon_answers_in_the_vcpu_thread_on_icount(machine: str, clock: str, ioeventfd_off: bool) -> None:
    argv = command_line(
        MachineConfig(machine=machine),
        "tcg",
        Path("/img/kernel"),
        Path("/img/initrd"),
        None,
        Path("/tmp/mq-x/console.log"),
        40123,
        clock=parse_clock(clock),
    )
    (balloon,) = [d for d in devices(argv) if "balloon" in d]
    assert ("ioeventfd=off" in balloon.split(",")) is ioeventfd_off


def test_no_balloon() -> None:
    assert not [d for d in devices(argv_for(MachineConfig(balloon=None))) if "balloon" in d]


def test_microvm_uses_virtio_mmio_devices() -> None:
    argv = argv_for(MachineConfig(machine="microvm"))
    assert values(argv, "-M")[0].split(",")[0] == "microvm"
    models = [d.split(",")[0] for d in devices(argv)]
    assert models == ["virtio-net-device", "virtio-balloon-device"]


@pytest.mark.parametrize("machine", ["pc", "q35"])
def test_pc_and_q35_use_virtio_pci_devices_without_option_rom(machine: str) -> None:
    argv = argv_for(MachineConfig(machine=machine))
    assert values(argv, "-M")[0].split(",")[0] == machine
    net, balloon = devices(argv)
    assert net.startswith("virtio-net-pci,") and "romfile=" in net.split(",")  # no iPXE ROM to load
    assert balloon.startswith("virtio-balloon-pci,")


def test_memory_and_hotplug_slots() -> None:
    assert values(argv_for(MachineConfig(memory_mib=768)), "-m") == ["768M"]
    config = MachineConfig(machine="pc", memory_mib=1024, maxmem_mib=8192, mem_slots=8)
    assert values(argv_for(config), "-m") == ["1024M,slots=8,maxmem=8192M"]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(machine="microvm", maxmem_mib=4096, mem_slots=4), "microvm has no memory hotplug"),
        (dict(machine="pc", memory_mib=2048, maxmem_mib=1024, mem_slots=4), "maxmem must be at least"),
        (dict(machine="pc", maxmem_mib=4096, mem_slots=0), "mem_slots >= 1"),
        (dict(memory_mib=64), "too small"),
        (dict(cpus=0), "at least one CPU"),
        (dict(machine="virt"), "machine type 'virt' unknown"),
        (dict(accel="hvf"), "accelerator 'hvf' unknown"),
    ],
)
def test_invalid_configs_are_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        MachineConfig(**kwargs)


@pytest.mark.parametrize("accel,cpu", [("tcg", "max"), ("kvm", "host")])
def test_accel_and_cpu_model(accel: str, cpu: str) -> None:
    argv = argv_for(MachineConfig(), accel=accel)
    assert values(argv, "-accel") == [accel]
    assert values(argv, "-cpu") == [cpu]


def test_tsc_frequency_is_given_only_under_tcg(monkeypatch) -> None:
    monkeypatch.setattr(qemu, "host_tsc_khz", lambda: 2_500_000)
    assert "tsc_early_khz=2500000" in kernel_cmdline(MachineConfig(), "tcg").split()
    assert not [p for p in kernel_cmdline(MachineConfig(), "kvm").split() if p.startswith("tsc_early_khz")]


@pytest.mark.parametrize(
    "log, cpuinfo, khz",
    [
        # the host kernel's refined calibration wins over its first guess
        (
            "[0.0] tsc: Detected 2600.000 MHz processor\n"
            "[1.2] tsc: Refined TSC clocksource calibration: 2591.998 MHz\n",
            "cpu MHz : 1200.000\nflags : fpu tsc\n",
            2_591_998,
        ),
        ("[0.0] tsc: Detected 2600.000 MHz processor\n", "", 2_600_000),
        # no log: cpu MHz is the TSC's only in a VM or with tsc_known_freq
        ("", "flags\t\t: fpu tsc constant_tsc hypervisor\ncpu MHz\t\t: 2600.000\n", 2_600_000),
        ("", "flags\t\t: fpu tsc constant_tsc tsc_known_freq\ncpu MHz\t\t: 3000.000\n", 3_000_000),
        # bare metal: cpu MHz is the core clock of the moment, not the TSC's
        ("", "flags\t\t: fpu tsc constant_tsc\ncpu MHz\t\t: 1197.604\n", None),
        ("", "", None),
    ],
)
def test_tsc_frequency_comes_from_the_kernel_or_a_known_frequency(log, cpuinfo, khz) -> None:
    assert qemu.tsc_khz_from(log, cpuinfo) == khz


def test_cmdline_extra_and_console() -> None:
    (append,) = values(argv_for(MachineConfig(cmdline_extra="foo=1 bar")), "-append")
    words = append.split()
    assert words[0] == "console=ttyS0" and words[-2:] == ["foo=1", "bar"]
    assert "rdinit=/init" in words


def test_incoming_and_extra_args_come_last() -> None:
    argv = argv_for(MachineConfig(extra_args=("-S", "-trace", "kvm_*")), incoming="exec:cat state")
    assert argv[-5:] == ["-incoming", "exec:cat state", "-S", "-trace", "kvm_*"]


def test_smp() -> None:
    assert values(argv_for(MachineConfig(cpus=3)), "-smp") == ["3"]


@settings(max_examples=60, deadline=None)
@given(
    memory=st.integers(128, 65536),
    cpus=st.integers(1, 64),
    machine=st.sampled_from(["microvm", "pc", "q35"]),
    merge=st.booleans(),
    balloon=st.booleans(),
)
def test_every_valid_config_gives_a_well_formed_argv(memory, cpus, machine, merge, balloon) -> None:
    config = MachineConfig(
        memory_mib=memory, cpus=cpus, machine=machine, mem_merge=merge, balloon=BalloonDevice() if balloon else None
    )
    argv = argv_for(config)
    assert all(isinstance(a, str) and a for a in argv)
    # every option that takes a value has one (no flag followed by a flag)
    for flag in ("-M", "-m", "-smp", "-kernel", "-initrd", "-append", "-netdev", "-accel"):
        (value,) = values(argv, flag)
        assert not value.startswith("-")
    assert len(devices(argv)) == 1 + balloon
    assert dataclasses.replace(config) == config  # hashable, comparable: the snapshot key


def test_the_probes_guest_has_no_monitor_and_no_network() -> None:
    """The KVM probe's variant is built from options, not cut out of argv."""
    argv = command_line(MachineConfig(balloon=None), "kvm", Path("/k"), Path("/i"), None, Path("/c"), None)
    assert not {"-mon", "-netdev"} & set(argv)
    assert not any("qmp" in a or "virtio-net" in a for a in argv)
    assert argv[argv.index("-serial") - 1] == "file,id=console,path=/c"
    full = command_line(MachineConfig(balloon=None), "kvm", Path("/k"), Path("/i"), Path("/q"), Path("/c"), 2222)
    assert len(full) - len(argv) == 8  # -chardev/-mon and -netdev/-device, with their values


def test_accel_option_by_clock_and_threading() -> None:
    icount = clocks.icount(4)
    assert tcg_accel_option("tcg", clocks.WALL_CLOCK, "") == "tcg"
    assert tcg_accel_option("tcg", clocks.WALL_CLOCK, "single") == "tcg,thread=single"
    assert tcg_accel_option("tcg", icount, "") == "tcg,thread=single"
    assert tcg_accel_option("kvm", clocks.WALL_CLOCK, "single") == "kvm"
    with pytest.raises(Exception, match="TCG threading"):
        MachineConfig(tcg_thread="both")

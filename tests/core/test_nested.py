"""The host under test's pure parts (host/core/nested.py): its parameters
checked, L1's and the guest's command lines, the clock and vCPUs L1 can
run, and the guest's argv as rc.host reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from one_line_errors import assert_one_line_error, in_process

from memqual.host.core import clock, nested
from memqual.host.core.errors import BadInput, Timeout
from memqual.host.core.kernelspec import KernelSpec
from memqual.host.core.qemu import INNER_QMP_PORT, L1_MARK_FIFO, L1_MONITOR_PIPE, MARK_ADDRESS, MARK_PORT, MachineConfig
from memqual.images.host_image import L2_INITRD, L2_KERNEL

KNOWN = {"kvm": {"mmio_caching", "tdp_mmu"}, "kvm_amd": {"npt", "nested"}}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("kvm_amd.npt", "module.param=value"),
        ("npt=0", "module.param=value"),
        ("kvm_amd.npt=0;reboot", "module.param=value"),
        ("kvm_amd.npt=$(id)", "module.param=value"),
        ("KVM.npt=0", "module.param=value"),
    ],
)
def test_a_parameter_out_of_form_is_one_line(text: str, fragment: str) -> None:
    with pytest.raises(BadInput, match="module.param=value"):
        nested.parse_param(text)


@pytest.mark.parametrize(
    ("param", "fragment"),
    [
        ("virtio_net.napi_tx=0", "L1 loads kvm and kvm_amd, not virtio_net"),
        ("kvm_amd.ept=0", "has no parameter ept"),
        ("kvm.npt=0", "has no parameter npt"),
    ],
)
def test_a_parameter_l1_cannot_take_is_refused(param: str, fragment: str) -> None:
    host = nested.parse_host("6.1.0-57-amd64", [param])
    with pytest.raises(BadInput, match=fragment):
        nested.check_params(host, KNOWN)


def test_parameters_l1_has_pass_and_reach_l1s_command_line() -> None:
    host = nested.parse_host("6.1.0-57-amd64:init_on_free=1", ["kvm.mmio_caching=0", "kvm_amd.npt=0"])
    nested.check_params(host, KNOWN)
    assert host.cmdline() == "init_on_free=1 kvm.mmio_caching=0 kvm_amd.npt=0"
    assert (
        host.label("tcg") == "6.1.0-57-amd64:init_on_free=1 kvm.mmio_caching=0 kvm_amd.npt=0 in TCG+SVM, L2 accel kvm"
    )
    assert "KVM (nested)" in host.label("kvm")


@pytest.mark.parametrize(
    ("asked", "runs"),
    [
        ("icount:4", "icount:0"),
        ("icount:2", "icount:0"),
        ("icount:0", "icount:0"),
        ("wall", "wall"),
    ],
)
def test_l1_runs_no_coarser_than_the_shift_its_guest_boots_at(asked: str, runs: str) -> None:
    assert nested.host_clock(clock.parse(asked)).label == runs


def test_on_icount_l1_and_its_guest_have_one_vcpu_each() -> None:
    assert nested.host_vcpus(2, clock.icount(0)) == 1
    assert nested.host_vcpus(2, clock.WALL_CLOCK) == 2


def test_the_guests_argv_runs_under_l1s_kvm_reached_through_l1s_forwards() -> None:
    config = MachineConfig(memory_mib=512, cpus=1, cmdline_extra="init_on_alloc=0")
    argv = nested.guest_argv(config, clock.icount(0), L2_KERNEL, L2_INITRD)
    text = " ".join(argv)
    assert argv[argv.index("-accel") + 1] == "kvm"
    # QEMU takes the last -cpu: the host's CPU without paravirtual EOI,
    # whose absence keeps TCG's double delivery of an injected interrupt
    # out of the guest's timer handler
    last_cpu = len(argv) - 1 - argv[::-1].index("-cpu")
    assert argv[last_cpu + 1] == "host,kvm-pv-eoi=off"
    assert "-icount" not in argv  # the guest's clock is L1's TSC, not a QEMU of its own
    assert argv[argv.index("-kernel") + 1] == L2_KERNEL
    # SSH on L1's own address, where L1's forward arrives, not L1's loopback
    assert f"hostfwd=tcp::{nested.INNER_SSH_PORT}-:22" in text
    assert f"port={INNER_QMP_PORT},server=on,wait=off" in text
    assert "path=/dev/console" in text
    # the guest's one way out: its marks, into L1's FIFO, inside L1
    netdev = argv[argv.index("-netdev") + 1]
    assert "restrict=on" in netdev
    assert netdev.endswith(f",guestfwd=tcp:{MARK_ADDRESS}:{MARK_PORT}-cmd:tee -a {L1_MARK_FIFO}")
    # and a second monitor, human, on L1's FIFOs: what L1 sends at a mark goes there
    assert f"pipe,id=schedule,path={L1_MONITOR_PIPE}" in argv and "chardev=schedule,mode=readline" in argv
    append = argv[argv.index("-append") + 1]
    assert "tsc_early_khz=1000000" in append and "init_on_alloc=0" in append
    # no RTC on a KVM microvm: the guest does not probe for one, and the
    # blacklist before it still holds (a second one adds to it)
    assert append.split().count("initcall_blacklist=cmos_init") == 1
    assert "initcall_blacklist=crypto_kdf108_init" in append
    # no early PCI reads (the GART probes of an AMD family 15): each one an exit to L1's QEMU
    assert "pci=noearly" in append.split()
    # a pc guest has its RTC, and keeps it; it reads no early PCI either
    pc = nested.guest_argv(dataclasses.replace(config, machine="pc"), clock.icount(0), L2_KERNEL, L2_INITRD)
    pc_append = pc[pc.index("-append") + 1].split()
    assert "initcall_blacklist=cmos_init" not in pc_append and "pci=noearly" in pc_append


def test_l1s_machine_carries_svm_the_argv_and_room_for_its_guest(tmp_path: Path) -> None:
    config = MachineConfig(memory_mib=512, cpus=2, machine="pc", maxmem_mib=4096, mem_slots=2)
    host = nested.parse_host("6.12.111+deb12-amd64", ["kvm_amd.npt=0"])
    l1 = nested.host_config(config, host, tmp_path / "argv,x", "tcg", clock.icount(0))
    # the guest may grow to its maxmem (virtio-mem, DIMMs): L1 has room for all of it
    assert l1.memory_mib == 4096 + nested.L1_OVERHEAD_MIB
    fixed = dataclasses.replace(config, maxmem_mib=None, mem_slots=0)
    assert nested.host_config(fixed, host, tmp_path / "a", "tcg", clock.icount(0)).memory_mib == 512 + 1024
    assert l1.cpus == 1 and l1.machine == "microvm" and l1.maxmem_mib is None
    assert l1.balloon is None and not l1.mem_merge and not l1.warm
    assert l1.extra_args[:2] == ("-cpu", nested.TCG_SVM_CPU)
    assert "+svm" in nested.TCG_SVM_CPU and "+npt" in nested.TCG_SVM_CPU
    # a comma in the path is doubled, so it cannot add a fw_cfg option
    assert l1.extra_args[3] == f"name={nested.FW_CFG_NAME},file={tmp_path}/argv,,x"
    assert "memqual.role=host" in l1.cmdline_extra and "kvm_amd.npt=0" in l1.cmdline_extra
    assert nested.host_config(config, host, tmp_path / "a", "kvm", clock.WALL_CLOCK).extra_args[:2] == ("-cpu", "host")


def test_the_argv_file_is_nul_separated_and_refuses_a_nul(tmp_path: Path) -> None:
    path = tmp_path / "argv"
    nested.write_argv(["qemu", "-append", "a b 'c'"], path)
    assert path.read_bytes() == b"qemu\0-append\0a b 'c'\0"
    with pytest.raises(BadInput):
        nested.write_argv(["qemu", "a\0b"], path)


def test_a_monitor_that_does_not_greet_is_not_connected() -> None:
    import socket
    import threading

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def hang_up() -> None:
            conn, _ = server.accept()
            conn.close()  # as L1's forward does when nothing listens in L1

        thread = threading.Thread(target=hang_up)
        thread.start()
        assert nested.monitor_greets(port, timeout=2.0) is None
        thread.join()

        def greet() -> None:
            conn, _ = server.accept()
            conn.sendall(b'{"QMP": {}}\r\n')
            done.wait(5)
            conn.close()

        done = threading.Event()

        thread = threading.Thread(target=greet)
        thread.start()
        sock = nested.monitor_greets(port, timeout=2.0)
        assert sock is not None
        assert sock.recv(5) == b'{"QMP'  # the greeting is left for QMP to read
        sock.close()
        done.set()
        thread.join()


# /proc/net/tcp as L1 shows it: the header, the listening monitor (0A),
# and a connection to it in the state the case names.
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
LISTENING = "   0: 00000000:115C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1"
TCP6_HEADER = "  sl  local_address                         remote_address                        st tx_queue"


def _connection(state: str, local_port: str = "115C") -> str:
    tail = "00000000:00000000 00:00000000 00000000     0        0 101 1"
    return f"   1: 0F02000A:{local_port} 0202000A:D2F4 {state} {tail}"


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("\n".join([TCP_HEADER, LISTENING]), False),  # the monitor listens, no client
        ("\n".join([TCP_HEADER, LISTENING, _connection("01")]), True),  # memqual's connection open
        ("\n".join([TCP_HEADER, LISTENING, _connection("08")]), True),  # closed by memqual, not yet by QEMU
        ("\n".join([TCP_HEADER, LISTENING, _connection("09")]), False),  # LAST_ACK: QEMU closed it
        ("\n".join([TCP_HEADER, LISTENING, _connection("06")]), False),  # TIME_WAIT: the kernel's alone
        ("\n".join([TCP_HEADER, LISTENING, _connection("01", "0016")]), False),  # an SSH session, port 22
        ("\n".join([TCP_HEADER, LISTENING, TCP6_HEADER, _connection("01")]), True),  # tcp6 after tcp
        ("", False),
    ],
    ids=["listening", "open", "close-wait", "last-ack", "time-wait", "other-port", "tcp6", "empty"],
)
def test_the_monitor_is_held_while_its_qemu_holds_a_connection(text: str, held: bool) -> None:
    assert nested.monitor_held(text, 0x115C) is held


def test_before_a_save_the_wait_ends_when_the_server_lets_the_closed_connection_go() -> None:
    """This machine's own /proc/net/tcp through the real wait: a server that
    keeps its end of a connection the client closed (CLOSE_WAIT, as QEMU's
    monitor before it notices) holds it; once it closes, the wait ends.
    A server that never lets go is a Timeout that says what it waited for."""
    import socket
    import threading
    from pathlib import Path

    def sockets() -> str:
        return Path("/proc/net/tcp").read_text() + Path("/proc/net/tcp6").read_text()

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        client.close()
        assert nested.monitor_held(sockets(), port)  # CLOSE_WAIT: the server still holds it
        with pytest.raises(Timeout, match="letting memqual's connection go"):
            nested.wait_monitor_released(sockets, port, within_s=0.3)
        closer = threading.Timer(0.3, conn.close)
        closer.start()
        try:
            nested.wait_monitor_released(sockets, port, within_s=10.0)
        finally:
            closer.cancel()
            conn.close()
        assert not nested.monitor_held(sockets(), port)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["boot", "--host-kernel-param", "kvm_amd.npt"], ["module.param=value"]),
        (["boot", "--host-kernel-param", "kvm_amd.npt=0"], ["give --host-kernel KERNEL"]),
        (["boot", "--host-kernel", "6.1.0-57-amd64", "--host-kernel", "6.1.0-57-amd64"], ["--host-kernel given twice"]),
        (["boot", "--host-kernel", "6.1.0-57-amd64;rm"], ["--host-kernel"]),
    ],
)
def test_bad_host_options_are_one_line_and_exit_2(
    args: list[str], fragments: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_one_line_error(in_process(args, {}, monkeypatch, capsys), *fragments)


def test_a_host_spec_names_its_kernel() -> None:
    host = nested.HostUnderTest(KernelSpec("6.1.0-57-amd64"))
    assert host.to_json() == {"kernel": "6.1.0-57-amd64", "params": []}
    assert nested.this_machine_label("tcg") == "this machine, accel tcg"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["run", *["--host-kernel", "6.1.0-57-amd64"] * 3], ["--host-kernel given 3 times"]),
        (["run", "--host-kernel-param", "kvm.mmio_caching=0"], ["give --host-kernel KERNEL"]),
    ],
)
def test_bad_host_options_of_a_run_are_one_line_and_exit_2(
    args: list[str],
    fragments: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = in_process([*args, "--output", str(tmp_path / "out")], {}, monkeypatch, capsys)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out").exists()


def test_the_run_s_host_reaches_its_tests_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMQUAL_HOST_KERNEL", raising=False)
    assert nested.from_environment() is None
    host = nested.parse_host("6.1.0-57-amd64:init_on_free=1", ["kvm_amd.npt=0"])
    nested.put_environment(host)
    try:
        assert nested.from_environment() == host
    finally:
        nested.put_environment(None)
    assert nested.from_environment() is None
    monkeypatch.setenv("MEMQUAL_HOST_KERNEL", "6.1.0-57-amd64")
    monkeypatch.setenv("MEMQUAL_HOST_KERNEL_PARAMS", "kvm_amd.npt")
    with pytest.raises(BadInput, match="MEMQUAL_HOST_KERNEL"):
        nested.from_environment()


def test_a_run_on_a_host_under_test_runs_on_the_shift_l1_can_run_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from memqual.host.cli import run as run_command
    from memqual.host.run import config as run_config

    monkeypatch.setattr("memqual.images.host_image.module_parameters", lambda source: KNOWN)
    host = nested.parse_host("6.1.0-57-amd64", ["kvm_amd.npt=0"])
    asked = run_config.RunConfig(output=tmp_path, clock=clock.icount(4), hosts=(host,))
    try:
        ran = run_command.run_host(asked)
        assert ran.clock == clock.icount(nested.MAX_SHIFT)
        assert f"runs on icount:{nested.MAX_SHIFT}" in capsys.readouterr().err
        assert nested.from_environment() == host
    finally:
        nested.put_environment(None)
    bad = run_config.RunConfig(output=tmp_path, hosts=(nested.parse_host("6.1.0-57-amd64", ["kvm_amd.ept=0"]),))
    with pytest.raises(BadInput, match="has no parameter ept"):
        run_command.run_host(bad)


def test_the_guards_against_redelivery_are_the_default_and_named_when_changed() -> None:
    """The lab's reproducer (lab/svm_redelivery.py) turns the two guards
    against the outer QEMU's re-delivery off; a host so changed is another
    host (its name and record say so), and its guest gets that CPU."""
    plain = nested.HostUnderTest(KernelSpec("6.1.0-57-amd64"))
    assert plain.cpu == nested.GUEST_CPU and plain.shift_cap == nested.MAX_SHIFT
    assert "guest_cpu" not in plain.to_json() and plain.name == "6.1.0-57-amd64"
    lab = nested.HostUnderTest(KernelSpec("6.1.0-57-amd64"), guest_cpu="host", max_shift=2)
    assert lab.name == "6.1.0-57-amd64 guest-cpu=host max-shift=2"
    assert lab.to_json()["guest_cpu"] == "host" and lab.to_json()["max_shift"] == 2
    assert nested.host_clock(clock.icount(4), lab.shift_cap) == clock.icount(2)
    assert nested.host_clock(clock.icount(4), plain.shift_cap) == clock.icount(nested.MAX_SHIFT)
    argv = nested.guest_argv(MachineConfig(memory_mib=512), clock.icount(2), L2_KERNEL, L2_INITRD, lab.cpu)
    assert argv[len(argv) - 1 - argv[::-1].index("-cpu") + 1] == "host"

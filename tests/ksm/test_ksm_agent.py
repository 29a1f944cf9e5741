"""memqual.host.ksm.agent with a canned guest command: record parsing, waiting for
events, errors surfacing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time

import pytest
from fakes import FakeBackground, FakeShell

from memqual.host.core.errors import GuestError, Timeout
from memqual.host.ksm.agent import StressAgent, StressArgs, marked, parse_record


def test_parse_record() -> None:
    assert parse_record("t=1.5 event=fill_done pages=3") == {"t": "1.5", "event": "fill_done", "pages": "3"}
    assert parse_record("ksm_stress: cannot allocate") is None
    assert parse_record("t=1 x=2") is None


def test_args_argv() -> None:
    args = StressArgs(mib=64, phases=["fill", "hold:5"], byte=0x5A, mergeable=True, timeout_s=30)
    assert args.argv("/tmp/ksm_stress") == [
        "/tmp/ksm_stress",
        "--mib",
        "64",
        "--byte",
        "90",
        "--phases",
        "fill,hold:5",
        "--timeout",
        "30",
        "--mergeable",
    ]
    assert args.pages == 16384


def test_wait_event_and_advance() -> None:
    gate = threading.Event()
    bg = FakeBackground(
        [
            "t=1 event=start pid=42 mib=1",
            "t=2 event=fill_done pages=256",
            "t=3 event=hold_done reason=signal",
            "t=4 event=verify_done pages=256 bad_pages=0",
            "t=5 event=done status=0",
        ],
        gate=gate,
    )
    ssh = FakeShell(bg)
    with StressAgent(ssh, "/tmp/a", StressArgs(mib=1, phases=["fill"])) as agent:
        assert agent.wait_event("fill_done", 5)["pages"] == "256"
        with pytest.raises(Timeout):
            agent.wait_event("verify_done", 0.1)
        agent.advance()
        assert ssh.ran == [["kill", "-USR1", "42"]]
        gate.set()
        assert agent.wait_event("verify_done", 5)["bad_pages"] == "0"
        assert agent.finish(5) == 0


def test_error_record_raises() -> None:
    bg = FakeBackground(
        [
            "t=1 event=error reason=alloc size_mib=4096 guest_mem_mib=1000 available_mib=900",
        ]
    )
    with StressAgent(FakeShell(bg), "/tmp/a", StressArgs(mib=4096, phases=["fill"])) as agent:
        with pytest.raises(GuestError, match="size_mib=4096 guest_mem_mib=1000"):
            agent.wait_event("fill_done", 5)


def test_ended_without_event() -> None:
    bg = FakeBackground(["t=1 event=start pid=1"])
    with StressAgent(FakeShell(bg), "/tmp/a", StressArgs(mib=1, phases=["fill"])) as agent:
        t0 = time.monotonic()
        with pytest.raises(GuestError, match="ended before event=fill_done"):
            agent.wait_event("fill_done", 5)
        assert time.monotonic() - t0 < 2


def test_icount_lifts_the_guest_side_caps_the_host_ends_itself() -> None:
    from memqual.host.core import clock
    from memqual.host.ksm.agent import ICOUNT_GUEST_BOUND_S, StressArgs

    args = StressArgs(mib=8, phases=["fill", "hold:300", "dirty:5", "verify"], timeout_s=400)
    wall = args.argv("/a", clock.WALL_CLOCK)
    assert wall[wall.index("--phases") + 1] == "fill,hold:300,dirty:5,verify"
    assert wall[wall.index("--timeout") + 1] == "400"
    counted = args.argv("/a", clock.icount(4))
    # holds end on the host's signal; a timed dirtying phase keeps its length
    assert counted[counted.index("--phases") + 1] == f"fill,hold:{ICOUNT_GUEST_BOUND_S:g},dirty:5,verify"
    assert float(counted[counted.index("--timeout") + 1]) == ICOUNT_GUEST_BOUND_S


def test_a_marked_agent_marks_its_dirtying_and_keeps_its_progress(tmp_path, monkeypatch) -> None:
    """The guest's side of a host under test's mark, run for real under
    sh with busybox's nc, as the guest has them: the agent's records pass
    through but its progress, and the mark reaches the channel."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nc").symlink_to(shutil.which("busybox") or "/bin/busybox")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    lines = [
        "t=1 event=start pid=42",
        "t=2 event=fill_done pages=3",
        "t=3 event=dirty_start seconds=600.000 pages=3",
        "t=4 event=dirty_progress passes=9 elapsed_s=1.0",
        "t=5 event=dirty_done passes=12 partial_pages=0 duration_s=2.0 reason=signal",
    ]
    channel = socket.create_server(("127.0.0.1", 0))
    channel.settimeout(20)
    port = channel.getsockname()[1]
    argv = marked(["printf", "%s\\n", *lines], "127.0.0.1", port)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    connection, _ = channel.accept()
    connection.settimeout(20)
    assert connection.recv(64) == b"dirty_start\n"
    connection.close()
    channel.close()
    assert done.returncode == 0
    assert done.stdout.splitlines() == [line for line in lines if "dirty_progress" not in line]

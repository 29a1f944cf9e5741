"""Balloon moves a host under test sends itself at the guest's mark
(host/balloon/l1_moves.py): its script runs for real under this machine's
sh with a real mark FIFO and a file for the monitor's input, as it runs in
L1; the mover's use of it with fakes (tests/balloon/test_balloon_controller.py
has the mover's other paths)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from local_shell import LocalShell

from memqual.host.balloon.l1_moves import L1Moves, MoveOutcome, Sent, parse_outcome
from memqual.host.balloon.timed_move import AT_MARK, MARK, BalloonMover
from memqual.host.core.errors import GuestError
from memqual.host.core.l1_marks import Mark

MIB = 1 << 20


def moves(tmp_path: Path, **kw: Any) -> L1Moves:
    fifo = tmp_path / "mark"
    os.mkfifo(fifo, 0o600)
    (tmp_path / "hmp.in").write_text("")
    return L1Moves(LocalShell(), str(fifo), str(tmp_path / "hmp"), slowdown=1.0, ready_dir=str(tmp_path), **kw)


def mark_after(fifo: Path, seconds: float) -> threading.Thread:
    """The guest's tracker marking, as L1's tee hands its connection on."""

    def mark() -> None:
        time.sleep(seconds)
        with fifo.open("w") as out:
            out.write("tracking\n")

    thread = threading.Thread(target=mark)
    thread.start()
    return thread


def test_l1_sends_the_target_only_once_the_guest_has_marked(tmp_path: Path) -> None:
    l1 = moves(tmp_path)
    pending = l1.start(512 * MIB, deadline_s=30)
    # start() returns once L1 waits: nothing sent yet, and the ready file gone
    assert (tmp_path / "hmp.in").read_text() == ""
    assert not list(tmp_path.glob("memqual-ready-*"))
    marker = mark_after(tmp_path / "mark", 0.4)
    outcome = pending.result(30)
    marker.join()
    assert outcome.sent.mib == 512 and outcome.mark.waited_s >= 0.3
    assert outcome.sent.at_s >= outcome.mark.seen_s
    assert (tmp_path / "hmp.in").read_text() == "balloon 512\n"


def test_a_cancel_ends_l1_s_wait_and_the_move_says_so(tmp_path: Path) -> None:
    pending = moves(tmp_path).start(512 * MIB, deadline_s=30)
    pending.cancel()
    with pytest.raises(GuestError, match=r"exited 6: its wait for the guest's mark was cancelled"):
        pending.result(30)
    assert (tmp_path / "hmp.in").read_text() == "", "nothing sent"


def test_a_mark_that_does_not_come_ends_the_move_at_l1_s_wait(tmp_path: Path) -> None:
    pending = moves(tmp_path, mark_wait_s=1).start(512 * MIB, deadline_s=60)
    with pytest.raises(GuestError, match=r"exited 7: the guest's mark did not come"):
        pending.result(30)


def test_a_target_l1_sends_is_whole_mib(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="whole MiB"):
        moves(tmp_path).start(512 * MIB + 4096, deadline_s=30)


@pytest.mark.parametrize(
    "stdout, message",
    [("mark 1.0 2.0\n==\n", "not a balloon schedule"), ("mark 1.0 2.0\n==\nsent x\n==\n", "not a target")],
)
def test_output_that_is_not_a_move_says_so(stdout: str, message: str) -> None:
    with pytest.raises(GuestError, match=message):
        parse_outcome(stdout)
    assert parse_outcome("mark 1.0 2.5\n==\nsent 512 2.6\n==\n") == MoveOutcome(Mark(1.0, 2.5), Sent(512, 2.6))


# -- the mover's guest-timed move at the mark ------------------------------------
class FakePending:
    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.cancelled = False

    def result(self, timeout_s: float) -> MoveOutcome:
        if self.fails:
            raise GuestError("L1's balloon move exited 7")
        return MoveOutcome(Mark(1.0, 1.5), Sent(256, 1.6))

    def cancel(self) -> None:
        self.cancelled = True


class FakeL1Moves:
    def __init__(self, pending: FakePending) -> None:
        self.pending = pending
        self.started: list[int] = []

    def start(self, target_bytes: int, deadline_s: float) -> FakePending:
        self.started.append(target_bytes)
        return self.pending


def test_a_guest_timed_move_is_sent_by_l1_at_the_tracker_s_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_balloon_controller import RAM, TRACKED, FakeBackground, FakeShell, controller

    target = 256 * MIB
    ctl, machine, _ = controller([RAM, target])
    l1 = FakeL1Moves(FakePending())
    ssh = FakeShell(FakeBackground(TRACKED.splitlines()))
    mover = BalloonMover(ctl, ssh, "/tmp/balloon_agent", at_mark=l1)  # type: ignore[arg-type]  # a fake L1
    move = mover.move(target)
    assert l1.started == [target] and move.reached and move.guest is not None
    assert not [c for c, _ in machine.sent if c == "balloon"], "memqual sent no target: L1 did"
    argv = ssh.started[-1]
    assert argv[:2] == ["sh", "-c"] and argv[4:7] == [MARK[0], str(MARK[1]), "tracking"]
    assert argv[8:10] == ["/tmp/balloon_agent", "track"]
    assert mover.started == AT_MARK
    # an untracked move still goes by QMP
    machine.after_balloon[RAM] = [[target, RAM]]
    assert mover.move(RAM, tracked=False).reached and l1.started == [target]


def test_a_move_l1_did_not_send_cancels_its_wait_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_balloon_controller import RAM, TRACKED, FakeBackground, FakeShell, controller

    ctl, _, _ = controller([RAM])
    pending = FakePending(fails=True)
    ssh = FakeShell(FakeBackground(TRACKED.splitlines()))
    mover = BalloonMover(ctl, ssh, "agent", at_mark=FakeL1Moves(pending))  # type: ignore[arg-type]  # a fake L1
    with pytest.raises(GuestError, match="exited 7"):
        mover.move(256 * MIB)
    assert pending.cancelled

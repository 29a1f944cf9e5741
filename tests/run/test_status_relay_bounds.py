"""What a lab host can make the controller hold through its status relay
(host/run/hosts/status_relay.py) is bounded per host, however it connects:
at most MAX_CONNECTIONS connections, and HOST_BUFFER bytes of unfinished
messages between them (Avocado's own 32 MiB a connection, with no cap on
connections, let eight connections of one host take 263 MiB)."""

from __future__ import annotations

import contextlib
import socket
import threading
import tracemalloc
from pathlib import Path

from memqual.host.core.polling import poll
from memqual.host.run.hosts.status_relay import HOST_BUFFER, MAX_CONNECTIONS, MAX_LINE, StatusRelay

MIB = 1 << 20


def _relay(tmp_path: Path) -> StatusRelay:
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    sockets = {"lab1": str(folder / "relay-1.sock"), "lab2": str(folder / "relay-2.sock")}
    return StatusRelay(str(folder / "status.sock"), sockets)


def _connect(path: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    return conn


def test_one_hosts_endless_messages_hold_at_most_its_share(tmp_path: Path) -> None:
    """Eight connections of one host, each sending 6 MiB with no end of line."""
    assert MAX_LINE <= 4 * MIB and HOST_BUFFER <= 16 * MIB
    endless = b"x" * (6 * MIB)
    senders = 8

    def send(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:  # the relay hangs up on it
            conn.sendall(endless)
            conn.shutdown(socket.SHUT_WR)
            conn.recv(1)

    with _relay(tmp_path) as relay:
        conns = [_connect(relay.sockets["lab1"]) for _ in range(senders)]
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            threads = [threading.Thread(target=send, args=(c,)) for c in conns]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            poll(lambda: relay.holding("lab1") == (0, 0), 10, 0.02, what="the relay to let go of lab1")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert relay.refusals()["lab1"]["dropped"] == senders
        assert "lab2" not in relay.refusals()
    # 48 MiB sent; what the relay held at once stays near its share (the
    # senders' threads and the reads themselves make up the rest)
    assert peak < HOST_BUFFER + 4 * MIB, peak / MIB


def test_one_host_cannot_open_more_than_its_connections(tmp_path: Path) -> None:
    with _relay(tmp_path) as relay:
        conns = [_connect(relay.sockets["lab1"]) for _ in range(MAX_CONNECTIONS + 10)]
        try:
            poll(
                lambda: relay.refusals().get("lab1", {}).get("dropped") == 10,
                10,
                0.02,
                what="the connections over the cap to be refused",
            )
            assert relay.holding("lab1")[0] == MAX_CONNECTIONS
            assert "more than" in relay.refusals()["lab1"]["first"]
            other = _connect(relay.sockets["lab2"])  # another host's own door stays open
            poll(lambda: relay.holding("lab2")[0] == 1, 10, 0.02, what="lab2's connection")
            other.close()
        finally:
            for conn in conns:
                conn.close()
        poll(lambda: relay.holding("lab1")[0] == 0, 10, 0.02, what="lab1's connections to close")

"""Each lab host's own door to Avocado's status server.

Avocado's status server believes every message that carries the job's id
(which every task's arguments show) and takes its task id as given; its
"file" handler writes into that task's folder on this controller.  Were
every host's reverse forward to end at that server, one lab host could post
as another's task and put files into that task's folder.

Why it is built so: docs/architecture.md, "Module notes", host/run/hosts/status_relay.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import selectors
import socket
import threading
from pathlib import PurePosixPath
from typing import Any, cast

from memqual.host.core.errors import Timeout
from memqual.host.core.polling import poll
from memqual.host.run.hosts.config import MAX_SLOTS

log = logging.getLogger("memqual.status_relay")

# What the relay holds for one lab host, whatever that host sends.  A
# message is one log record, one chunk of output or one change of state
# (avocado/core/utils/messages.py), so one longer than MAX_LINE is refused:
# Avocado's own server takes up to 32 MiB a connection
# (run.status_server_buffer_size), and eight connections of one host took
# 263 MiB.  A task holds one connection and a host runs at most MAX_SLOTS
# tasks; the few more allow for a client that reconnects before its broken
# connection is seen closed here.  The unfinished messages of all of a
# host's connections share HOST_BUFFER: a host costs at most that (plus one
# read) however it connects.
MAX_LINE = 2**22
MAX_CONNECTIONS = MAX_SLOTS + 8
HOST_BUFFER = 2**24
READ_SIZE = 1 << 16
UPSTREAM_CONNECT_S = 30.0  # the status server is up before the first task starts
CLOSE_WAIT_S = 10.0


def task_host(task_id: str) -> str:
    """The lab host a task id names: its variant, after the last ";"."""
    head, sep, variant = task_id.rpartition(";")
    return variant if sep and head else ""


def refusal(line: bytes, host: str) -> str:
    """Why a status line from ``host`` is not passed on, or ""."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return "not a JSON object"
    if not isinstance(message, dict):
        return "not a JSON object"
    task_id = message.get("id")
    if not isinstance(task_id, str):
        return "no task id"
    if task_host(task_id) != host:
        return f"task {task_id[:120]!r} is not assigned to lab host {host}"
    if message.get("type") == "file":
        path = message.get("path")
        if not isinstance(path, str):
            return "a file message without a path"
        parts = PurePosixPath(os.path.normpath("/" + path)).parts[1:]
        if parts[:1] == ("data",):
            return "a file message into data/, where only the fetched records go"
    return ""


@dataclasses.dataclass
class _Link:
    host: str
    downstream: socket.socket
    upstream: socket.socket | None = None
    buffer: bytearray = dataclasses.field(default_factory=bytearray)
    open: bool = True
    counted: int = 0  # the bytes of ``buffer`` its host's share counts


class StatusRelay:
    """The relays of a fleet job: one listening socket per host, one thread
    for all of them.  ``start`` before the job, ``close`` after it (also on
    every exit path)."""

    def __init__(self, upstream: str, sockets: dict[str, str]) -> None:
        self.upstream = upstream
        self.sockets = dict(sockets)  # host name -> the path its reverse forward ends at
        self.refused: dict[str, int] = {}
        self.first_refusal: dict[str, str] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._listeners: list[socket.socket] = []
        self._connections: dict[str, int] = {}  # per host: its connections open now
        self._buffered: dict[str, int] = {}  # per host: the bytes of its partial messages held

    def start(self) -> None:
        for host, path in self.sockets.items():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a killed run's, in our own private directory
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(64)
            listener.setblocking(False)
            self._listeners.append(listener)
            self._selector.register(listener, selectors.EVENT_READ, ("listen", host))
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", ""))
        self._thread = threading.Thread(target=self._serve, name="memqual-status-relay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)
        for key in list(self._selector.get_map().values()):
            kind, data = key.data
            if kind == "conn":
                self._drop(data)
        for listener in self._listeners:
            listener.close()
        for path in self.sockets.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> StatusRelay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the thread
    def _serve(self) -> None:
        while not self._stop:
            for key, _ in self._selector.select():
                kind, data = key.data
                if kind == "wake":
                    return
                if kind == "listen":
                    self._accept(cast(socket.socket, key.fileobj), data)
                else:
                    self._read(data)

    def _accept(self, listener: socket.socket, host: str) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if self._connections.get(host, 0) >= MAX_CONNECTIONS:
            self._refuse(host, f"more than {MAX_CONNECTIONS} connections at once")
            conn.close()
            return
        conn.setblocking(False)
        self._connections[host] = self._connections.get(host, 0) + 1
        link = _Link(host, conn)
        self._selector.register(conn, selectors.EVENT_READ, ("conn", link))

    def _read(self, link: _Link) -> None:
        try:
            chunk = link.downstream.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(link)
            return
        start = len(link.buffer)  # only the new bytes can hold a newline not yet seen
        link.buffer += chunk
        while (end := link.buffer.find(b"\n", start)) >= 0:
            line = bytes(link.buffer[: end + 1])
            del link.buffer[: end + 1]
            start = 0
            self._pass_on(link, line)  # may drop the link, emptying its buffer
        if not link.open:
            return
        self._buffered[link.host] = self._buffered.get(link.host, 0) + len(link.buffer) - link.counted
        link.counted = len(link.buffer)
        if len(link.buffer) > MAX_LINE:
            self._refuse(link.host, f"a message longer than {MAX_LINE} bytes")
            self._drop(link)
        elif self._buffered[link.host] > HOST_BUFFER:
            self._refuse(link.host, f"more than {HOST_BUFFER} bytes of unfinished messages")
            self._drop(link)

    def _pass_on(self, link: _Link, line: bytes) -> None:
        why = refusal(line, link.host)
        if why:
            self._refuse(link.host, why)
            return
        try:
            if link.upstream is None:
                link.upstream = self._connect()
            link.upstream.sendall(line)
        except (OSError, Timeout) as exc:
            log.warning("status relay of %s: the status server cannot be reached (%s)", link.host, exc)
            self._drop(link)

    def _connect(self) -> socket.socket:
        def connected() -> socket.socket | None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(self.upstream)
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                return None
            return conn

        return poll(connected, UPSTREAM_CONNECT_S, 0.1, what="Avocado's status server").value

    def _refuse(self, host: str, why: str) -> None:
        self.refused[host] = self.refused.get(host, 0) + 1
        if host not in self.first_refusal:
            self.first_refusal[host] = why
            log.warning("status relay of lab host %s: dropped a message: %s", host, why)

    def _drop(self, link: _Link) -> None:
        if link.open:
            link.open = False
            self._connections[link.host] -= 1
            self._buffered[link.host] = self._buffered.get(link.host, 0) - link.counted
            link.counted = 0
            link.buffer.clear()
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(link.downstream)
        link.downstream.close()
        if link.upstream is not None:
            link.upstream.close()
            link.upstream = None

    def holding(self, host: str) -> tuple[int, int]:
        """``host``'s connections open now, and the bytes of its unfinished
        messages the relay holds (at most HOST_BUFFER, plus one read)."""
        return self._connections.get(host, 0), self._buffered.get(host, 0)

    def refusals(self) -> dict[str, Any]:
        """Per host: how many messages were dropped, and the first reason."""
        return {h: {"dropped": n, "first": self.first_refusal.get(h, "")} for h, n in self.refused.items()}

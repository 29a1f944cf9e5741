"""memqual.host.core.console.ConsoleMarker: how a cold boot learns the guest is ready
(guest/rc.sh prints "memqual-ready" on the console once dropbear runs)."""

from __future__ import annotations

from memqual.host.core.console import ConsoleMarker


def test_console_marker_sees_a_marker_split_across_reads(tmp_path):
    log = tmp_path / "console.log"
    marker = ConsoleMarker(log, b"memqual-ready")
    assert not marker.seen()  # no file yet: QEMU has not opened it
    log.write_bytes(b"[    1.0] booting\nmemqual-re")
    assert not marker.seen()
    with log.open("ab") as fh:
        fh.write(b"ady\n")
    assert marker.seen()
    log.write_bytes(b"")  # truncated later: seen stays seen
    assert marker.seen()


def test_console_marker_ignores_other_text(tmp_path):
    log = tmp_path / "console.log"
    log.write_bytes(b"memqual-read\nmemqual-\n")
    marker = ConsoleMarker(log, b"memqual-ready")
    assert not marker.seen() and not marker.seen()

"""virtio-balloon (seed 003, docs/balloon.md).

- device: the balloon over QMP: checked and unchecked targets, the timed
  ``reach``, the floor, guest statistics.
- agent: the guest side: ``balloon_agent`` output and its tracker, which
  times a move from the guest's own counters.
- move: the one move loop (tracker armed, target sent, reach awaited with a
  deadline, a stall given back at once), its constants and its ``Move``.
- rss: QEMU's resident memory, read and waited on.
- percpu: the guest's per-CPU free-page lists emptied before a floor probe.
- model: the transfer-cost model (PFN arrays against the seed's bitmaps).
- driver: the driver variant with a settable request size, deployed in a
  guest over SSH and checked over QMP; the request-size fit.
- measure: ``memqual balloon measure`` (by hand, by request size too).
- cli: ``memqual balloon model|measure``.
"""

from memqual.host.balloon.agent import GuestTiming, GuestTracker, agent_records, agent_stat, parse_agent_line
from memqual.host.balloon.device import (
    PAGE,
    STATS_INTERVAL_MAX,
    BalloonController,
    BalloonResult,
    Floor,
    GuestStats,
    QemuAnswer,
    check_target,
    expected_actual,
    find_floor,
    wait_actual,
    wait_no_balloon,
)
from memqual.host.balloon.move import DEADLINE_S, STALL_S, TRACK_PERIOD_US, BalloonMover, Move
from memqual.host.balloon.percpu import Drain, drain_percpu_lists, parse_drain
from memqual.host.balloon.rss import rss_kib, wait_rss, wait_rss_steady

__all__ = [
    "DEADLINE_S",
    "PAGE",
    "STALL_S",
    "STATS_INTERVAL_MAX",
    "TRACK_PERIOD_US",
    "BalloonController",
    "BalloonMover",
    "BalloonResult",
    "Drain",
    "Floor",
    "GuestStats",
    "GuestTiming",
    "GuestTracker",
    "Move",
    "QemuAnswer",
    "agent_records",
    "agent_stat",
    "check_target",
    "drain_percpu_lists",
    "expected_actual",
    "find_floor",
    "parse_agent_line",
    "parse_drain",
    "rss_kib",
    "wait_actual",
    "wait_no_balloon",
    "wait_rss",
    "wait_rss_steady",
]

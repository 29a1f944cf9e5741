"""virtio-balloon (seed 003, docs/balloon.md): the device over QMP
(device.py), the guest agent and its tracker (agent.py), the one move
loop (timed_move.py), QEMU's RSS (rss.py), the per-CPU list drain (percpu.py),
the transfer-cost model (model.py), the driver variant (driver.py,
request_size.py), ``memqual balloon measure`` (measure.py), and the
scenarios' procedures (scenarios.py, timing.py, correctness.py, floor.py,
reporting.py, stats_interval.py)."""

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
from memqual.host.balloon.percpu import Drain, drain_percpu_lists, parse_drain
from memqual.host.balloon.rss import rss_kib, wait_rss, wait_rss_steady
from memqual.host.balloon.timed_move import DEADLINE_S, STALL_S, TRACK_PERIOD_US, BalloonMover, Move

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

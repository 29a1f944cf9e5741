"""virtio-balloon (seed 003, docs/balloon.md): the device over QMP
(device.py), the guest agent and its tracker (agent.py), the one move
loop (timed_move.py), QEMU's RSS (rss.py), the per-CPU list drain (percpu.py),
the transfer-cost model (model.py), the driver variant (driver.py,
request_size.py), ``memqual balloon measure`` (measure.py), and the
scenarios' procedures (scenarios.py, timing.py, correctness.py, floor.py,
reporting.py, stats_interval.py)."""

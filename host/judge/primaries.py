"""Which metrics a comparison decides on: the one table of primaries and
negative controls.

- A **primary** is a metric a kernel developer watches: ``memqual compare``
  corrects its family-wise error over these (Holm), and only these set the
  exit status.  A scenario declares a few: the balloon's inflate and
  deflate times and its floor, ksmd's CPU per page, the merged fraction,
  the saving per guest, the memslot nodes a guest's MMIO walks.
- A **negative control** is a metric no guest kernel can move: the host-only
  /dev/kvm benchmarks (``memslots.kvm``, ``memslots.kvm_lookup``, their own
  VMs on the host, no guest kernel in them -- the miss cost per doubling
  of the slot count is one of these).  In a kernel A/B a flagged control
  means the host drifted between A and B, and the comparison says its
  decisions are not to be trusted.
- Everything else is **exploratory**: compared, corrected for the false
  discovery rate, reported, never deciding the exit status unless
  ``memqual compare --all-metrics``.
"""

from __future__ import annotations

PRIMARY = "primary"
CONTROL = "control"
EXPLORATORY = "exploratory"

# (scenario, metric): every variant and setting of the metric is primary.
PRIMARIES: frozenset[tuple[str, str]] = frozenset(
    {
        ("balloon.inflate", "inflate_s"),
        ("balloon.deflate", "deflate_s"),
        ("balloon.request_size", "inflate_s"),
        ("balloon.request_size", "deflate_s"),
        ("balloon.request_size", "per_page_ns"),
        ("balloon.floor", "floor_mib"),
        ("balloon.free_page_reporting", "rss_return_s"),
        ("balloon.deflate_on_oom", "deflated_mib"),
        ("ksm.volatile_scan", "ksmd_cpu_ns_per_page"),
        ("ksm.merge", "merged_fraction"),
        ("ksm.guest_merge", "merged_fraction"),
        ("ksm.many_guests", "saved_mib"),
        ("memslots.trace_mmio", "nodes_per_lookup"),
    }
)

# Whole scenarios that run on the host alone (no guest kernel in them).
CONTROL_SCENARIOS: frozenset[str] = frozenset({"memslots.kvm", "memslots.kvm_lookup"})


def role(scenario: str, metric: str) -> str:
    """PRIMARY, CONTROL or EXPLORATORY."""
    if scenario in CONTROL_SCENARIOS:
        return CONTROL
    if (scenario, metric) in PRIMARIES:
        return PRIMARY
    return EXPLORATORY


def is_primary(scenario: str, metric: str) -> bool:
    return role(scenario, metric) == PRIMARY


def is_control(scenario: str) -> bool:
    return scenario in CONTROL_SCENARIOS

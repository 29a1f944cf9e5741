"""Which metrics a comparison decides on: the one table of primaries and
negative controls.

- A **primary** is a metric a kernel developer watches: ``memqual compare``
  corrects its family-wise error over these (Holm), and only these set the
  exit status.  A scenario declares a FEW, one or two: every primary more
  is another step of Holm's correction that every other primary pays for,
  and another metric until-decided must run blocks for.  Each row of
  ``PRIMARIES`` says why its metric (and, where a scenario records several
  variants, which variant) is the one watched; the rest of what a scenario
  records stays, measured and reported, as exploratory.
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

import dataclasses
from collections.abc import Mapping
from typing import Any

PRIMARY = "primary"
CONTROL = "control"
EXPLORATORY = "exploratory"


@dataclasses.dataclass(frozen=True)
class Primary:
    """One primary: a scenario's metric, in the variants whose items
    include ``variant`` (empty: every variant), and why it is watched."""

    scenario: str
    metric: str
    why: str
    variant: tuple[tuple[str, Any], ...] = ()

    def matches(self, scenario: str, metric: str, variant: Mapping[str, Any] | None) -> bool:
        if (scenario, metric) != (self.scenario, self.metric):
            return False
        given = variant or {}
        return all(key in given and given[key] == value for key, value in self.variant)


PRIMARIES: tuple[Primary, ...] = (
    Primary("balloon.inflate", "inflate_s", "what a host waits for when it takes memory back"),
    Primary("balloon.deflate", "deflate_s", "what a guest waits for when it gets memory back"),
    Primary(
        "balloon.request_size",
        "per_page_ns",
        "the slope of the request-size curve: the driver's cost per page, which is what a change to "
        "its request handling moves; the per-size times are its points (exploratory)",
    ),
    Primary("balloon.floor", "floor_mib", "how far a guest can be ballooned down before it stops giving"),
    Primary(
        "balloon.free_page_reporting",
        "rss_return_s",
        "how soon reported free pages leave the host; with reporting off the time is the watched "
        "window itself (the RSS must stay up), a check, not a cost",
        variant=(("free_page_reporting", True),),
    ),
    Primary(
        "ksm.volatile_scan",
        "ksmd_cpu_ns_per_page",
        "ksmd's CPU per page covered with smart scan (on by default since Linux 6.7) on 4 KiB pages: "
        "what the guest's pages make the host pay; without smart scan it is the host's own checksum "
        "cost (the in-guest reference), and on THP the host's huge page splits weigh in",
        variant=(("pages", "4k"), ("smart_scan", 1)),
    ),
    Primary(
        "ksm.merge",
        "merged_fraction",
        "identical guest pages merge; with mem-merge=off nothing may merge, a check",
        variant=(("mem_merge", True),),
    ),
    Primary("ksm.guest_merge", "merged_fraction", "the guest kernel's own ksmd merges its pages"),
    Primary(
        "ksm.many_guests",
        "saved_mib",
        "the saving with the scenario's three guests; the one- and two-guest points fit the model",
        variant=(("guests", 3),),
    ),
    Primary(
        "memslots.trace_mmio",
        "nodes_per_lookup",
        "the guest's MMIO trace through today's memslot tree (rbtree); the other structures replay the "
        "same trace, so they move only when this does",
        variant=(("structure", "rbtree"),),
    ),
)

# Whole scenarios that run on the host alone (no guest kernel in them).
CONTROL_SCENARIOS: frozenset[str] = frozenset({"memslots.kvm", "memslots.kvm_lookup"})


def role(scenario: str, metric: str, variant: Mapping[str, Any] | None = None) -> str:
    """PRIMARY, CONTROL or EXPLORATORY."""
    if scenario in CONTROL_SCENARIOS:
        return CONTROL
    if any(p.matches(scenario, metric, variant) for p in PRIMARIES):
        return PRIMARY
    return EXPLORATORY


def is_primary(scenario: str, metric: str, variant: Mapping[str, Any] | None = None) -> bool:
    return role(scenario, metric, variant) == PRIMARY


def is_control(scenario: str) -> bool:
    return scenario in CONTROL_SCENARIOS

"""The profiles a scenario runs in, and which one this process runs: each
scenario's row (host/core/scenario.py) gives its sizes in each.

- ``quick``: one kernel, sized for CI and a first look (each claim gets the
  units its verdict needs, docs/claims-calibration.md).
- ``full``: the lab's sizes: more guests, repeats, slot counts.
- ``ab``: the sizing of an interleaved A/B (host/run/blocks.py), the default
  when ``memqual run`` is given two kernels or two QEMUs.  The independent
  unit of an A/B is the block, so each (block, arm) visit boots ONE fresh
  guest and gives each primary one value (where a few samples inside that
  guest steady it, their median: the balloon's 3 cycles, ksmd's 3
  windows): more blocks, not more guests per
  block, buy the decision, and a block of every primary-bearing scenario
  costs minutes rather than half an hour.  Only tests tagged ``ab`` (they
  record a primary or a negative control, host/judge/primaries.py) run in the
  blocks; the boot checks run once per arm; the rest (exploratory metrics,
  the lab-host machinery) are left to ``--profile quick``.

A scenario reads its sizes at run time (``Scenario.sizes_for()``), never at
import, so one process can look at several profiles (tests/) and the sizes
follow ``MEMQUAL_PROFILE`` as set by ``memqual run``.
"""

from __future__ import annotations

from memqual.host.core import settings
from memqual.host.core.errors import BadInput

ENV_PROFILE = settings.PROFILE
QUICK = "quick"
FULL = "full"
AB = "ab"
PROFILES = (QUICK, FULL, AB)
# The Avocado tag of the tests an A/B runs in blocks.
AB_TAG = "ab"


def current() -> str:
    """The profile ``memqual run`` set for this process (quick when none)."""
    name = settings.profile() or QUICK
    if name not in PROFILES:
        raise BadInput(f"{ENV_PROFILE}={name!r}: use one of {', '.join(PROFILES)}")
    return name

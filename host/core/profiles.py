"""The profiles a scenario runs in, and which one this process runs: each
scenario's row (host/core/scenario.py) gives its sizes in each.

Why it is built so: docs/architecture.md, "Module notes", host/core/profiles.py.
"""

from __future__ import annotations

from memqual.host.core import settings
from memqual.host.core.errors import BadInput

ENV_PROFILE = settings.PROFILE
QUICK = "quick"
FULL = "full"
AB = "ab"
# ./run-tests' profile: every scenario's code and assertions at the fewest
# units that still show each direction.  A row without smoke sizes runs at
# its ab sizes (the A/B's, whose spreads were measured at them: they stay
# as they are); no figure of a smoke run is meant to be compared.
SMOKE = "smoke"
PROFILES = (QUICK, FULL, AB, SMOKE)
# The profiles every row gives sizes for (smoke is optional).
SIZED = (QUICK, FULL, AB)
# The Avocado tag of the tests an A/B runs in blocks.
AB_TAG = "ab"


def current() -> str:
    """The profile ``memqual run`` set for this process (quick when none)."""
    name = settings.profile() or QUICK
    if name not in PROFILES:
        raise BadInput(f"{ENV_PROFILE}={name!r}: use one of {', '.join(PROFILES)}")
    return name

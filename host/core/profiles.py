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
PROFILES = (QUICK, FULL, AB)
# The Avocado tag of the tests an A/B runs in blocks.
AB_TAG = "ab"


def current() -> str:
    """The profile ``memqual run`` set for this process (quick when none)."""
    name = settings.profile() or QUICK
    if name not in PROFILES:
        raise BadInput(f"{ENV_PROFILE}={name!r}: use one of {', '.join(PROFILES)}")
    return name

"""Another user for the tests of what root must not trust: files are
chowned to ``nobody``, which only root can do."""

from __future__ import annotations

import os
import pwd

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def nobody_uid() -> int:
    """The uid of ``nobody``; 65534 where the user database has none."""
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534

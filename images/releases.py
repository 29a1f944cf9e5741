"""The order of kernel releases: Debian's, through python-debian."""

from __future__ import annotations

from debian.debian_support import Version


def release_order(release: str) -> tuple[int, Version | str]:
    """A sort key that orders kernel releases as dpkg orders versions
    (``~`` before anything, even the end: 6.12.1~rc1 < 6.12.1); a name that
    is no Debian version (a path, a command-line suffix) sorts after them
    all, by its text."""
    try:
        return (0, Version(release))
    except ValueError:
        return (1, release)

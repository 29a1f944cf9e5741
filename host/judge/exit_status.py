"""The exit status of an A/B (``memqual compare``, a two-arm ``memqual
run``, the looks of --until-decided): what it can be and the one rule
that sets it.  docs/verdicts.md ("When `memqual compare` exits 1") is
the manual.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """What an A/B says to a script, as its process exit status."""

    NO_REGRESSION = 0
    SLOWER = 1  # a decisive metric (a primary; every metric with --all-metrics) was decided slower
    NOT_COMPARED = 2  # the files cannot be compared: bad input, never an outcome
    HOST_DRIFTED = 3  # a negative control moved: no decision is to be trusted


def exit_rule(*, host_drifted: bool, slower: bool) -> ExitStatus:
    """A drifted host outranks a regression: when a control moved, what
    else moved may be the host too."""
    if host_drifted:
        return ExitStatus.HOST_DRIFTED
    return ExitStatus.SLOWER if slower else ExitStatus.NO_REGRESSION

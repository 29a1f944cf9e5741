"""Argument types shared by the subcommands: a bad value is argparse's one
line and exit status 2, with what a good value looks like."""

from __future__ import annotations

import argparse


def percent(text: str) -> float:
    """A percentage strictly between 0 and 100 ("5" or "5%"), as given."""
    try:
        value = float(text.rstrip("%"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from exc
    if not 0.0 < value < 100.0:
        raise argparse.ArgumentTypeError(f"{text} must be a percentage between 0 and 100 (5 means 5%)")
    return value


def percent_as_fraction(text: str) -> float:
    """The same percentage as a fraction (5 -> 0.05)."""
    return percent(text) / 100.0


def kernel_build(text: str) -> str:
    """``--kernel-build DIR``: a kernel build tree (Makefile, .config and
    Module.symvers), resolved; anything else is one line and exit 2."""
    from host.errors import BadInput
    from images.balloon_driver import check_kernel_build

    try:
        return str(check_kernel_build(text))
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc

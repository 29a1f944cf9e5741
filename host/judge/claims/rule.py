"""The rule from B / A (and its interval, when it has one) to a verdict:
the asserted direction, the minimum effect, the published magnitude within
its tolerance, and the mechanism's ceiling when that magnitude is out of
reach.
"""

from __future__ import annotations

import math

from memqual.host.core.printable import format_number
from memqual.host.judge.claims.model import (
    DIRECTION_ONLY,
    NOT_REPRODUCED,
    REPRODUCED,
    CeilingResult,
    Measure,
)


def _on_side(m: Measure, ratio: float) -> bool:
    if m.direction == "greater":
        return ratio > 1.0
    if m.direction == "less":
        return ratio < 1.0
    return ratio >= 1.0 - m.tolerance


def judge(
    m: Measure, ratio: float, ci: tuple[float, float] | None, *, ceiling: CeilingResult | None = None
) -> tuple[str, str]:
    """The verdict from B / A and its CI (None for a model's figure, which
    has no sampling spread).  ``ceiling``, the measured mechanism's own
    bound on B / A in this run, says whether the published magnitude was
    within its reach at all."""
    if not math.isfinite(ratio):
        return NOT_REPRODUCED, "the ratio is undefined (A is zero)"
    tol = m.tolerance
    if m.direction == "at_least":
        # "A is as good as or better than B": B / A (B's cost over A's) must
        # not fall below 1 - tolerance.  Only an interval wholly at or above
        # that floor establishes it; one reaching below it says nothing.
        floor = 1.0 - tol
        a_label = m.a.label if m.a else "A"
        b_label = m.b.label if m.b else "B"
        if (ci is not None and ci[1] < floor) or (ci is None and ratio < floor):
            where = f"CI wholly below {floor:.3g}" if ci is not None else f"below {floor:.3g}"
            return (
                NOT_REPRODUCED,
                f"{b_label} beats {a_label} by more than the {tol:.0%} slack of 'as good as' ({where}): "
                f"{a_label} is not as good",
            )
        if ci is not None and ci[0] < floor:
            return (
                NOT_REPRODUCED,
                f"the CI reaches below {floor:.3g}: the data cannot tell 'as good as' from "
                f"{b_label} being better by more than the {tol:.0%} slack; not established",
            )
        holds_why = f"B / A >= {floor:.3g}: {a_label} as good as {b_label} or better, as asserted"
    else:
        want_up = m.direction == "greater"
        side = "above" if want_up else "below"
        if ci is not None:
            if not (ci[0] > 1.0 if want_up else ci[1] < 1.0):
                pointing = (ratio > 1.0) == want_up and ratio != 1.0
                detail = "points the asserted way" if pointing else "points the other way"
                return NOT_REPRODUCED, f"the CI is not wholly {side} 1: the effect {detail} but is not established"
        elif not _on_side(m, ratio):
            return NOT_REPRODUCED, f"B / A is not {side} 1: the asserted direction does not hold"
        if abs(ratio - 1.0) < m.min_effect:
            # A real but negligible effect does not carry a claim of a speed-up.
            return NOT_REPRODUCED, (
                f"B / A is {side} 1 by only {abs(ratio - 1.0):.1%}, less than the {m.min_effect:.0%} "
                "minimum effect: no meaningful change"
            )
        holds_why = f"B / A is {side} 1 as asserted"
    if m.expected is None:
        return REPRODUCED, holds_why + " (the seed asserts only a direction)"
    off = ratio / m.expected - 1.0
    if abs(off) <= tol:
        return REPRODUCED, f"{holds_why}, within {tol:.0%} of the published {format_number(m.expected)}x"
    why = (
        f"{holds_why}, but {abs(off):.0%} {'above' if off > 0 else 'below'} the published "
        f"{format_number(m.expected)}x (tolerance {tol:.0%})"
    )
    band_low = m.expected * (1.0 - tol)
    if ceiling is not None and off < 0 and ceiling.value < band_low:
        limit = ceiling.limit_any_workload
        made_of = (
            f"{ceiling.input_label} {format_number(ceiling.input_value)}"
            if ceiling.input_value is not None
            else "what this run measured"
        )
        if limit is not None and limit < band_low:
            why += (
                f". Out of reach by design, not a near miss: the tolerance band starts at "
                f"{format_number(band_low)}x and whatever the workload it cannot pass {format_number(limit)}x "
                f"({ceiling.limit_source}); {ceiling.label} in this run is {format_number(ceiling.value)}x "
                f"(units {format_number(ceiling.low)}-{format_number(ceiling.high)}; {ceiling.formula})"
            )
        else:
            anywhere = f"; whatever the workload it can reach {format_number(limit)}x" if limit is not None else ""
            why += (
                f". Out of reach at this run's {made_of}, not by design: the tolerance band starts at "
                f"{format_number(band_low)}x, and {ceiling.label} at that share is {format_number(ceiling.value)}x "
                f"(units {format_number(ceiling.low)}-{format_number(ceiling.high)}; {ceiling.formula}){anywhere}"
            )
    elif ceiling is not None and off < 0:
        why += (
            f"; {ceiling.label} in this run, {format_number(ceiling.value)}x, leaves the band "
            f"(from {format_number(band_low)}x) within its reach"
        )
    return DIRECTION_ONLY, why

"""The sentences a claim's verdict is shown with, on the terminal and the
page alike: what was measured, the evidence class, the host and clock it
ran on, the accelerator's qualifier, a mechanism's ceiling, the published
figure on the plot's axis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memqual.host.core.printable import format_number as num
from memqual.host.judge.claims.model import NOT_MEASURABLE, format_ratio
from memqual.host.judge.claims.ran_on import NOT_RECORDED, RanOn


def measured_text(c: Mapping[str, Any]) -> str:
    if c.get("measured") is None:
        return "-"
    text = f"{format_ratio(c['measured'])}x"
    if c.get("ci") and c["ci"][0] is not None and c["ci"][0] != c["ci"][1]:
        # A model's spread is the range over real layouts, not a CI.
        lo, hi = format_ratio(c["ci"][0]), format_ratio(c["ci"][1])
        text += f" (layouts {lo}-{hi})" if c.get("computed") else f" [{lo}, {hi}]"
    spread = c.get("range_beside")
    if spread and spread[0] is not None and spread[1] is not None:
        lo, hi = format_ratio(spread[0]), format_ratio(spread[1])
        text += f" (other layouts {lo})" if lo == hi else f" (other layouts {lo}-{hi})"
    return text


def short_qualifier(c: Mapping[str, Any]) -> str:
    """The accelerator a qualified verdict was made under and the one it
    does not speak for, in a few words for the summary row, or ''."""
    if not c.get("qualifier"):
        return ""
    needs = str(((c.get("evidence") or {}).get("accelerator") or {}).get("needs") or "")
    under = str(c.get("accelerator") or "").upper() or "another accelerator"
    return f"under {under}, not {needs.upper()}" if needs else f"under {under}"


def note_line(c: Mapping[str, Any]) -> str:
    """The claim's caveats (its measure's note), or ''."""
    note = str(c.get("note") or "")
    return f"Note: {note}" if note else ""


def summary_line(c: Mapping[str, Any]) -> str:
    """A card's evidence said once: its class and what was measured on
    what (the registry's summary, else the full text), then the verdict's
    reason in one sentence."""
    ev = c.get("evidence") or {}
    kind = evidence_class(c)
    what = str(ev.get("summary") or "")
    if kind == NOT_MEASURABLE:
        why = str(c.get("headline") or c.get("reason", ""))
        return f"Evidence: not measurable. {why[:1].upper()}{why[1:]}".strip()
    if not what:
        what = str(ev.get("instead") or "")
    what = what if what.endswith(".") else what + "."
    return f"Evidence ({kind}): {what} {c.get('headline') or c.get('reason', '')}".strip()


def evidence_class(c: Mapping[str, Any]) -> str:
    return str((c.get("evidence") or {}).get("class") or NOT_MEASURABLE)


def evidence_line(c: Mapping[str, Any]) -> str:
    """The first line of a claim's card: the class of its evidence and what
    it is."""
    ev = c.get("evidence") or {}
    kind = evidence_class(c)
    if kind == NOT_MEASURABLE:
        return f"Evidence: not measurable. Would measure it: {ev.get('would_measure') or c.get('reason', '')}"
    return f"Evidence: {kind}. {ev.get('instead', '')}"


def ran_on(c: Mapping[str, Any]) -> RanOn | None:
    """The hosts and clocks a claim's evidence came from; None in a file
    written before verdicts named them."""
    return RanOn.from_json(c.get("ran_on"))


def host_text(c: Mapping[str, Any]) -> str:
    where = ran_on(c)
    return where.host if where is not None else NOT_RECORDED


def clock_text(c: Mapping[str, Any]) -> str:
    where = ran_on(c)
    return where.clock if where is not None else NOT_RECORDED


def ran_on_line(c: Mapping[str, Any]) -> str:
    """Where a claim's evidence ran, what it is and on which clock:
    "host: this machine (accel tcg) · evidence: measured · clock: wall"."""
    return f"host: {host_text(c)} · evidence: {evidence_class(c)} · clock: {clock_text(c)}"


def emulated_line(c: Mapping[str, Any]) -> str:
    """What the figures of an emulated CPU (an L1 under TCG with SVM) are,
    or ''."""
    where = ran_on(c)
    return where.emulated_cpu if where is not None else ""


# A side's published figure in another unit than the axis it is drawn on.
_UNIT_SCALE = {("ms", "s"): 1e-3, ("us", "s"): 1e-6, ("s", "ms"): 1e3, ("ns", "us"): 1e-3, ("us", "ns"): 1e3}


def published_on_axis(side: Mapping[str, Any], axis_unit: str) -> float | None:
    """A side's published figure converted to the unit of the axis it is
    plotted on (the seed's 1237 ms is 1.237 on an axis in seconds); None when
    there is none, or its unit does not convert."""
    value = side.get("published")
    if value is None:
        return None
    unit = side.get("published_unit") or axis_unit
    if unit == axis_unit:
        return float(value)
    scale = _UNIT_SCALE.get((unit, axis_unit))
    return None if scale is None else float(value) * scale


def qualifier_line(c: Mapping[str, Any]) -> str:
    """What the verdict does not speak for (another accelerator), or ''."""
    q = c.get("qualifier") or ""
    return f"This verdict holds {q}" if q else ""


def ceiling_line(c: Mapping[str, Any]) -> str:
    """The measured mechanism's own bound on B / A, and whether the
    published magnitude was within it, or ''."""
    ceiling = c.get("ceiling") or {}
    if not ceiling:
        return ""
    text = (
        f"Bound: {ceiling.get('label') or 'the mechanism'} on B / A in this run is {num(ceiling['value'])}x "
        f"(units {num(ceiling['low'])}-{num(ceiling['high'])}: {ceiling.get('formula', '')})"
    )
    limit = ceiling.get("limit_any_workload")
    if limit is not None:
        text += f"; whatever the workload at most {num(limit)}x ({ceiling.get('limit_source', '')})"
    expected, tol = c.get("expected"), c.get("tolerance") or 0.0
    if expected is not None:
        band = expected * (1 - tol)
        if ceiling["value"] < band and limit is not None and limit < band:
            text += (
                f". The published {num(expected)}x (band from {num(band)}x) is out of its reach by design, "
                "whatever the workload, not a near miss"
            )
        elif ceiling["value"] < band:
            share = ceiling.get("input_value")
            at = f"{ceiling.get('input_label')} {num(share)}" if share is not None else "measurements"
            text += (
                f". The published {num(expected)}x (band from {num(band)}x) is out of reach at this run's {at}, "
                "not by design: a run whose bound reaches the band could reach it"
            )
        else:
            text += f". The published {num(expected)}x (band from {num(band)}x) is within its reach"
    return text + "."


def published_text(c: Mapping[str, Any]) -> str:
    if c.get("expected") is not None:
        return f"{num(c['expected'])}x"
    if c.get("source") in ("none", "order"):
        figures = [p for p in c.get("published") or [] if p.get("value") is not None]
        if figures:
            return f"{num(figures[0]['value'])}{figures[0].get('unit', '')}"
        notes = [str(p["note"]) for p in c.get("published") or [] if p.get("note")]
        return notes[0] if notes else "-"
    # The seed asserts a direction only.
    return {"greater": "> 1", "less": "< 1", "at_least": ">= 1"}.get(c.get("direction") or "", "-")

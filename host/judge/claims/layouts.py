"""A claim of source "memslots-layouts" judged: the memslot model on the
layouts real guests reported, the guest built to the seed's description
deciding and the other layouts a 2011 host accepted beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from memqual.host.core.printable import format_number
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.model import (
    MODEL,
    NOT_MEASURABLE,
    UNMEASURABLE,
    Claim,
    LayoutResult,
    Measure,
    NoEvidence,
    Quantity,
    Verdict,
    format_ratio,
)
from memqual.host.judge.claims.rule import judge
from memqual.host.memslots import guest_layouts, kvm2011, model
from memqual.host.memslots import layout as layout_mod


def evaluate_layouts(claim: Claim, records: list[Measurement]) -> Verdict:
    """The memslot model on the real layouts.  The guest built to the
    seed's description decides, by a miss at its emulated NIC BAR where it
    has one (seed 000's path: "the mmio faults for the NIC"), else by the
    mean over its gaps; the other layouts a 2011 host accepted give the
    range the magnitude takes on other guests, beside it."""
    m = claim.measure
    assert m.a is not None and m.b is not None
    results = layout_results(m.a, m.b, [r for r in records if r.scenario == m.scenario], seed=claim.seed)
    if not results:
        raise NoEvidence(
            f"no memslot layouts read from real guests in this run (records of {m.scenario})"
            + (f"; needs {'; '.join(claim.needs)}" if claim.needs else "")
        )
    details = [_layout_line(m, lr) for lr in results]
    others = [lr for lr in results if not lr.seed_guest and lr.runs_2011]
    at_nic = [lr for lr in others if lr.nic_ratio is not None]
    beside = at_nic or others
    values = [lr.nic_ratio if at_nic and lr.nic_ratio is not None else lr.ratio for lr in beside]
    spread = (min(values), max(values)) if values else None
    where = "at the NIC BAR" if at_nic else "over every gap"
    if spread is None:
        range_text = "no other layout a 2011 host accepted was read"
    else:
        span = (
            format_ratio(spread[0])
            if spread[0] == spread[1]
            else f"{format_ratio(spread[0])}-{format_ratio(spread[1])}"
        )
        names = ", ".join(lr.config + (" (newer than 2011)" if lr.newer else "") for lr in beside)
        range_text = f"the other layouts a 2011 host accepted give {span}x {where} ({names})"
    seed_guests = [lr for lr in results if lr.seed_guest and lr.runs_2011]
    if not seed_guests:
        # The layouts read are listed all the same: they are the run's evidence of nothing else.
        why = (
            f"no layout of the guest seed {claim.seed.split('_')[0]} describes was read in this run (a "
            f"{m.scenario} record built to {claim.seed}: e2e/test_memslots_qemu.py test_guest_layouts_recorded "
            f"boots it); {range_text}, which do not decide"
        )
        return Verdict(
            claim=claim,
            verdict=NOT_MEASURABLE,
            reason=why,
            headline=why,
            details=details,
            evidence=UNMEASURABLE,
            range_beside=spread,
            layouts=results,
        )
    lr = seed_guests[0]
    nic = lr.nic_ratio is not None
    ratio = lr.nic_ratio if nic and lr.nic_ratio is not None else lr.ratio
    a = lr.nic_a if nic and lr.nic_a is not None else lr.a
    b = lr.nic_b if nic and lr.nic_b is not None else lr.b
    verdict, why = judge(m, ratio, None)
    path = "a miss at its rtl8139's MMIO BAR (seed 000's path)" if nic else "the mean miss over its gaps"
    headline = (
        f"On {lr.config} ({lr.slots} user slots, a 2011 {kvm2011.DEFAULT_HOST.name} host) {path} walks "
        f"{format_number(a)} {m.a.structure} nodes against {format_number(b)} {m.b.structure} entries, "
        f"{format_ratio(ratio)}x: {why}; {range_text}."
    )
    refused = [x for x in results if not x.runs_2011]
    reason = (
        f"{headline} Model of the 2011 structures on {len(results)} layouts read from real guests in this run "
        f"(the array walks nmemslots entries, the host's private slots included): "
        + "; ".join(details)
        + (
            f". Not counted: {', '.join(x.config for x in refused)} (more than {kvm2011.KVM_MEMORY_SLOTS} user slots)"
            if refused
            else ""
        )
    )
    return Verdict(
        claim=claim,
        verdict=verdict,
        reason=reason,
        headline=headline,
        details=details,
        evidence=MODEL,
        ratio=ratio,
        range_beside=spread,
        a_replicates=[[a]],
        b_replicates=[[b]],
        layouts=results,
        settings={
            "layouts": [x.config for x in results],
            "decided_on": lr.config,
            "host_2011": kvm2011.DEFAULT_HOST.name,
            "decided_by": "nic-bar-miss" if nic else "mean-over-gaps",
            "refused_by_2011_host": [x.config for x in refused],
            "newer_than_2011": {x.config: list(x.newer) for x in results if x.newer},
        },
    )


def _layout_line(m: Measure, lr: LayoutResult) -> str:
    """One layout's arithmetic, in words."""
    assert m.a is not None and m.b is not None
    text = f"{lr.config} ({lr.slots} user slots"
    text += ", built to the seed's description)" if lr.seed_guest else ")"
    if not lr.runs_2011:
        return (
            text + f": refused by a 2011 host (more than {kvm2011.KVM_MEMORY_SLOTS} user slots); on its slots alone "
            f"{m.a.structure} walks {format_number(lr.a)} nodes per miss, {m.b.structure} {format_number(lr.b)}"
        )
    text += f": mean over every gap {format_number(lr.b)} / {format_number(lr.a)} = {format_ratio(lr.ratio)}x"
    if lr.nic_ratio is not None:
        text += (
            f", at the NIC BAR {format_number(lr.nic_b)} / {format_number(lr.nic_a)} = {format_ratio(lr.nic_ratio)}x"
        )
    if lr.newer:
        text += f"; newer than the seed's kernel: {', '.join(lr.newer)}"
    return text


def layout_results(a: Quantity, b: Quantity, records: Sequence[Measurement], *, seed: str = "") -> list[LayoutResult]:
    """The memslot model on every layout record (a real guest's memslots in
    ``extra["layout"]``), one result per configuration, on the 2011 host
    where one could run the layout; a record whose settings say it was
    built to ``seed`` (``built_to``) is that seed's guest."""
    out: dict[str, LayoutResult] = {}
    for rec in records:
        data = rec.extra.get("layout")
        if data is None:
            continue
        config = str(rec.variant.get("config") or rec.metric)
        if config in out:
            continue  # a later round of the same configuration: the layout is the same
        guest = layout_mod.from_json(data, name=config, source=f"{rec.scenario} record {config}")
        runs = kvm2011.runs_on_2011(guest)
        layout = kvm2011.on_host(guest) if runs else guest
        values = []
        for q in (a, b):
            table = _plain(model.model_table(layout, q.workload))
            entry = _plain((table.get("structures") or {}).get(q.structure))
            value = entry.get(q.field) if isinstance(entry, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise NoEvidence(f"the memslot model gives no {q.structure}.{q.field} for {q.workload} on {config}")
            values.append(float(value))
        nic = guest_layouts.nic_of(rec)
        nic_nodes: list[float | None] = [None, None]
        if nic is not None and runs and a.workload == b.workload == "miss":
            nic_nodes = [float(model.nodes_at(layout, q.structure, nic.gfn)) for q in (a, b)]
        out[config] = LayoutResult(
            config=config,
            slots=len(guest),
            a=values[0],
            b=values[1],
            runs_2011=runs,
            nic_a=nic_nodes[0],
            nic_b=nic_nodes[1],
            newer=kvm2011.newer_than_2011(rec.settings, [str(n) for n in rec.extra.get("slot_names") or ()]),
            seed_guest=bool(seed) and rec.settings.get("built_to") == seed,
        )
    return sorted(out.values(), key=lambda lr: lr.config)


def _plain(obj: Any) -> Any:
    """A model result as plain dicts, whether it is a dict, a dataclass or an
    object with to_json()."""
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj

"""The /dev/kvm lookup benchmark's results: each point's and each slope's
95 % t-interval over fresh VMs (a replicate is one fresh VM), whether it
is resolved, the summary ``memqual memslots kvm --lookup`` prints, and the
measurement records (scenario "memslots.kvm_lookup").

The t-intervals are made here, beside the records they go into, and not in
memqual.host.judge.stats: a subject sits below the judge and cannot import
it, and the records carry them (``extra.ci95_ns``, ``resolved``).
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any

from memqual.host.core.record import Measurement
from memqual.host.core.record import write as write_record
from memqual.host.memslots.kvm_lookup import (
    EMULATED_ITERATION_NS,
    KINDS,
    POINT_RESOLUTION,
    SCENARIO,
    SLOPE_RESOLUTION_NS,
    LookupResult,
    VmSample,
)
from memqual.host.memslots.kvm_results import kvm_environment

# --- statistics ------------------------------------------------------------------
# Two-sided 95 % Student t quantiles by degrees of freedom (1-30).
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t_interval(values: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): the 95 % t interval of the mean of independent
    replicate values, or None with fewer than 2."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = _T975[min(len(values) - 1, len(_T975)) - 1] * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def point_summary(result: LookupResult, kind: str, n: int) -> dict[str, Any] | None:
    vms = [v for v in result.vms(n) if kind in v.access_ns]
    if not vms:
        return None
    medians = [statistics.median(v.access_ns[kind]) for v in vms]
    ci = t_interval(medians)
    out: dict[str, Any] = {
        "replicate_medians_ns": medians,
        "median_ns": statistics.median(medians),
        "raw_median_ns": statistics.median(statistics.median(v.raw_ns[kind]) for v in vms),
        "null_ns_per_iteration": statistics.median(statistics.median(v.null_ns_per_iteration) for v in vms),
    }
    if kind in vms[0].over_ram_ns:
        over = [statistics.median(v.over_ram_ns[kind]) for v in vms]
        over_ci = t_interval(over)
        out["over_ram_hit"] = {
            "replicate_medians_ns": over,
            "mean_ns": statistics.fmean(over),
            "ci95_ns": [over_ci[1], over_ci[2]] if over_ci else None,
        }
    if ci is not None:
        mean, lo, hi = ci
        out.update(mean_ns=mean, ci95_ns=[lo, hi], resolved=(hi - lo) / 2 <= POINT_RESOLUTION * abs(mean))
    else:
        out.update(mean_ns=medians[0], ci95_ns=None, resolved=False)
    return out


def slope_summary(result: LookupResult, kind: str, paired: bool | None = None) -> dict[str, Any] | None:
    """Per replicate, the least-squares slope of the VM's median cost
    against log2(N); then the mean slope and its t interval.

    ``paired`` (the default for miss and small_hit): the cost over the RAM
    hit of the same round, which walks no tree; what a VM's moment does to
    every access alike cancels, and what is left grows only with the
    lookup.  Unpaired (the RAM hit itself, or paired=False): access_ns, the
    cost over the null loop."""
    if paired is None:
        paired = kind != "ram_hit"

    def series(v: VmSample) -> list[float] | None:
        if paired:
            return v.over_ram_ns.get(kind)
        return v.access_ns.get(kind)

    per: list[dict[str, Any]] = []
    for r in range(result.config.replicates):
        pts = [
            (math.log2(v.slots), statistics.median(values))
            for v in result.samples
            if v.replicate == r and (values := series(v))
        ]
        if len({x for x, _ in pts}) < 2:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        slope, intercept = statistics.linear_regression(xs, ys)
        corr = statistics.correlation(xs, ys) if len(set(ys)) > 1 and len(pts) > 2 else None
        per.append({"replicate": r, "slope_ns": slope, "intercept_ns": intercept, "r": corr, "points": len(pts)})
    if not per:
        return None
    slopes = [p["slope_ns"] for p in per]
    ci = t_interval(slopes)
    out: dict[str, Any] = {
        "x": "log2(slots)",
        "y": f"{kind} minus ram_hit of the same round, ns" if paired else f"{kind} access_ns (minus the null loop)",
        "paired_with_ram_hit": paired,
        "per_replicate": per,
        "slopes_ns": slopes,
        "slots": sorted({v.slots for v in result.samples if series(v)}),
    }
    if ci is not None:
        mean, lo, hi = ci
        out.update(
            mean_ns=mean,
            ci95_ns=[lo, hi],
            resolved=(hi - lo) / 2 <= SLOPE_RESOLUTION_NS,
            resolution_target_ns=SLOPE_RESOLUTION_NS,
        )
    else:
        out.update(mean_ns=slopes[0], ci95_ns=None, resolved=False, resolution_target_ns=SLOPE_RESOLUTION_NS)
    return out


def execution_kind(result: LookupResult) -> str:
    """Emulated (every access a software lookup) or native, judged from the
    null loop: natively an iteration of a few register instructions takes
    nanoseconds, emulated microseconds."""
    values = [statistics.median(v.null_ns_per_iteration) for v in result.samples]
    if not values:
        return "unknown"
    per = statistics.median(values)
    # Natively a dozen register instructions take a few ns; emulated, each
    # takes hundreds.
    kind = "emulated" if per > EMULATED_ITERATION_NS else "native"
    return f"{kind} ({per:.0f} ns per loop iteration of {result.config.unroll + 4} register instructions)"


def summarize(result: LookupResult) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "scenario": SCENARIO,
        "nr_memslots": result.nr_memslots,
        "settings": result.config.settings(),
        "replicates": result.config.replicates,
        "slots": list(result.config.slots),
        "execution": execution_kind(result),
        "environment": environment(result),
        "points": {},
        "per_doubling": {},
        "duration_s": result.duration_s,
    }
    for kind in KINDS:
        doc["points"][kind] = {str(n): s for n in result.config.slots if (s := point_summary(result, kind, n))}
        slope = slope_summary(result, kind)
        if slope is not None:
            doc["per_doubling"][kind] = slope
    return doc


def environment(result: LookupResult) -> dict[str, Any]:
    return kvm_environment(result.host_kernel, result.kvm_module, result.nr_memslots, result.config.device)


# --- records ---------------------------------------------------------------------
SUBTRACTION = (
    "per round: (CPU time of the pass writing the target - CPU time of the same loop with each write "
    "replaced by mov ebx, ebx) / (iterations * unroll); the loop's fixed cost cancels"
)


def records(result: LookupResult) -> list[Any]:
    """``access_ns`` per (kind, N): samples = each round's per-access cost,
    replicates = one group per fresh VM; ``ns_per_doubling`` per kind:
    one fitted slope per replicate."""
    settings = result.config.settings()
    env = environment(result)
    execution = execution_kind(result)
    out = []
    for kind in KINDS:
        for n in result.config.slots:
            vms = [v for v in result.vms(n) if kind in v.access_ns]
            summary = point_summary(result, kind, n)
            if not vms or summary is None:
                continue
            extra = dict(summary)
            extra.update(
                subtraction=SUBTRACTION,
                execution=execution,
                model_rbtree_nodes=result.model_nodes.get(n, {}).get(kind),
                wall_over_cpu=[v.wall_over_cpu for v in vms],
                checks=[v.checks for v in vms],
                unit_of_replication="a fresh VM",
            )
            if not summary["resolved"]:
                extra["note"] = (
                    "not resolved: the 95 % CI over fresh VMs is wider than "
                    f"{POINT_RESOLUTION:.0%} of the value; read it as an order of magnitude"
                )
            out.append(
                Measurement(
                    scenario=SCENARIO,
                    metric="access_ns",
                    unit="ns",
                    better="lower",
                    samples=[],
                    replicates=[list(v.access_ns[kind]) for v in vms],
                    variant={"kind": kind, "slots": n},
                    settings=settings,
                    environment=env,
                    extra=extra,
                    duration_s=result.duration_s,
                )
            )
        slope = slope_summary(result, kind)
        if slope is None:
            continue
        unpaired = slope_summary(result, kind, paired=False) if slope["paired_with_ram_hit"] else None
        extra = {
            "fit": slope,
            "fit_over_null": unpaired,
            "execution": execution,
            "unit_of_replication": "a replicate: one fresh VM per slot count",
            "model_rbtree_nodes": {str(n): result.model_nodes.get(n, {}).get(kind) for n in result.config.slots},
        }
        if not slope["resolved"]:
            extra["note"] = (
                f"not resolved: the 95 % CI of the slope is wider than +-{SLOPE_RESOLUTION_NS:g} ns per "
                "doubling; no growth with the slot count can be told from none here"
            )
        out.append(
            Measurement(
                scenario=SCENARIO,
                metric="ns_per_doubling",
                unit="ns",
                better="lower",
                samples=[],
                replicates=[[s] for s in slope["slopes_ns"]],
                variant={"kind": kind},
                settings=settings,
                environment=env,
                extra=extra,
                duration_s=result.duration_s,
            )
        )
    return out


def write_records(result: LookupResult, directory: str | os.PathLike[str]) -> list[Any]:
    return [write_record(r, directory) for r in records(result)]

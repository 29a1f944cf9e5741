"""The /dev/kvm benchmark's results as read and recorded: each run's
figures per slot and per access, the summary ``memqual memslots kvm``
prints, the fit against the reference model, the host's environment, and
the measurement records (scenario "memslots.kvm").
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memqual.host.core import probe as host_probe
from memqual.host.core.environment import Environment
from memqual.host.core.record import Measurement, write
from memqual.host.memslots.kvm_bench import BenchResult, RunSample
from memqual.host.memslots.kvm_guest import MODEL_STRUCTURE, balanced_tree_nodes


def _spread(values: list[float]) -> list[float]:
    """[min, max] over the repeats (the median is the run's own field)."""
    return [min(values), max(values)]


def per_slot_metrics(sample: RunSample) -> dict[str, float]:
    """The figures of one run, normalised per slot or per access."""
    n = sample.slots
    out = {
        "setup_s": sample.setup_s,
        "move_s": sample.move_s,
        "delete_s": sample.delete_s,
        "setup_s_per_slot": sample.setup_s / n,
        "move_s_per_slot": sample.move_s / n,
        "delete_s_per_slot": sample.delete_s / n,
    }
    v = sample.vcpu
    if v is not None:
        # Per access, with the fixed cost of a pass (entry + report exit)
        # taken out; at N = 1 what remains is noisy, and says so in the spread.
        first = (v.first_touch_s - v.empty_pass_s) / n
        warm = (v.warm_touch_s - v.empty_pass_s) / n
        same = (v.same_slot_s - v.empty_pass_s) / n
        mmio = (v.mmio_s - v.empty_pass_s) / max(v.mmio_exits, 1)
        out.update(
            empty_pass_us=v.empty_pass_s * 1e6,
            first_touch_us=first * 1e6,
            warm_touch_us=warm * 1e6,
            same_slot_us=same * 1e6,
            fault_us=(first - warm) * 1e6,
            mmio_exit_us=mmio * 1e6,
            faults_per_s=1 / first if first > 0 else math.inf,
            mmio_exits_per_s=1 / mmio if mmio > 0 else math.inf,
        )
        if n > 1:
            # A warm access to another slot against one to the same slot:
            # with a single slot there is no other slot, and the difference
            # of two equal costs is noise (it came out negative).
            out["slot_switch_us"] = (warm - same) * 1e6
    return out


def summarize(result: BenchResult) -> dict[str, Any]:
    """The JSON document of ``memqual memslots kvm --json``."""
    runs = []
    for n in result.config.slots:
        samples = [s for s in result.samples if s.slots == n]
        if not samples:
            continue
        metrics = [per_slot_metrics(s) for s in samples]
        keys = [k for k in metrics[0] if all(k in m for m in metrics)]
        series = {k: [m[k] for m in metrics] for k in keys}
        nodes, _ = balanced_tree_nodes(n)
        run: dict[str, Any] = {"slots": n, "repeats": len(samples)}
        run.update({k: statistics.median(v) for k, v in series.items()})
        run["spread"] = {k: _spread(v) for k, v in series.items()}
        run["model_nodes"] = nodes
        if result.model_walks.get(n):
            run["model"] = result.model_walks[n]
        vs = [s.vcpu for s in samples if s.vcpu is not None]
        if vs:
            run["vcpu_checks"] = {
                "accesses": n,
                "reported": [list(v.reported) for v in vs],
                "touched_ok": [v.touched_ok for v in vs],
                "mmio_exits": [v.mmio_exits for v in vs],
                "mmio_mismatches": [v.mmio_mismatches for v in vs],
                "other_exits": [v.other_exits for v in vs],
            }
        limits = [s.limit for s in samples if s.limit is not None]
        if limits:
            run["limit_errno"] = sorted({p.observed for p in limits})
        runs.append(run)
    full = [s.limit for s in result.samples if s.limit is not None]
    limit_probe = next(p for p in result.probes if p.name == "limit")
    # Prefer the real "one slot past a full VM" outcome when a run filled it.
    limit_errno = full[0].observed if full else limit_probe.observed
    probes = {p.name: p.observed for p in result.probes}
    doc: dict[str, Any] = {
        "nr_memslots": result.nr_memslots,
        "runs": runs,
        "limit_errno": limit_errno,
        "limit_tested_on_full_vm": bool(full),
        "overlap_errno": probes["overlap"],
        "misaligned_errno": probes["misaligned_gpa"],
        "probes": [dict(asdict(p), ok=p.ok) for p in result.probes + full[:1]],
        "probes_ok": all(p.ok for p in result.probes + full),
        "vcpu": {
            "mode": "flat 32-bit protected mode, paging off (KVM_SET_SREGS)",
            "ran": any(s.vcpu is not None for s in result.samples),
            "error": result.vcpu_error,
            "execution": execution_kind(runs),
        },
        "model": {
            "structure": "balanced binary search tree",
            "nodes": "ceil(log2(n+1))",
            "source": result.model_source,
            "per_run": f"runs[].model: {MODEL_STRUCTURE} of the reference model on the same layout and accesses",
        },
        "fit": fit_against_model(runs),
        "settings": {
            "repeats": result.config.repeats,
            "slot_pages": result.config.slot_pages,
            "order": "repeat-major, alternating direction",
        },
        "environment": environment(result),
        "duration_s": result.duration_s,
    }
    return doc


NATIVE_ACCESS_CEILING_US = 0.1


def execution_kind(runs: list[dict[str, Any]]) -> str | None:
    """Whether the guest ran natively or through KVM's instruction emulator,
    judged from a write loop that stays in one page: natively an iteration
    takes nanoseconds; emulated (kvm_pvm runs non-paged protected-mode code
    this way) microseconds, and then every access is a software gfn -> slot
    lookup rather than a hardware TLB hit."""
    values = [r["same_slot_us"] for r in runs if "same_slot_us" in r and r["slots"] >= 32]
    values = values or [r["same_slot_us"] for r in runs if "same_slot_us" in r]
    if not values:
        return None
    per_access = statistics.median(values)
    kind = "native" if per_access < NATIVE_ACCESS_CEILING_US else "emulated"
    return f"{kind} ({per_access:.3g} us per same-page write)"


def fit_against_model(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least-squares lines of the per-access costs (fault, slot switch, MMIO
    exit) against the model's node count.  Informational: with 3-4 slot counts the fit says
    how much the cost grows per tree level, not that the growth is a tree
    walk (caches and TLBs grow with N too)."""
    # Each cost against the nodes the model examines for that access kind
    # (mean over the same accesses), or ceil(log2(n+1)) without the model.
    pairs = (
        ("fault_us", "touch_nodes_mean"),
        ("slot_switch_us", "touch_nodes_mean"),
        ("mmio_exit_us", "mmio_nodes_mean"),
    )
    out: dict[str, Any] = {}
    for name, model_key in pairs:
        pts = [r for r in runs if name in r]  # slot_switch_us needs 2+ slots
        if len(pts) < 3:
            continue
        xs = [float(r.get("model", {}).get(model_key, r["model_nodes"])) for r in pts]
        if len(set(xs)) < 2:
            continue
        ys = [float(r[name]) for r in pts]
        slope, intercept = statistics.linear_regression(xs, ys)
        r = statistics.correlation(xs, ys) if len(set(ys)) > 1 else 0.0
        out[name] = {
            "us_per_node": slope,
            "intercept_us": intercept,
            "r": r,
            "points": len(pts),
            "nodes": model_key if all("model" in p for p in pts) else "model_nodes",
        }
    return out or None


def kvm_environment(
    host_kernel: str, kvm_module: str, nr_memslots: int, device: str, base: Environment | None = None, **more: Any
) -> dict[str, Any]:
    """The host's environment (memqual.host.core.probe, or ``base``: the host
    under test's) with what /dev/kvm said: the facts every KVM benchmark of
    this package reads, and ``more`` kvm_* keys."""
    kvm = {"host_kernel": host_kernel, "kvm_module": kvm_module, "kvm_nr_memslots": nr_memslots, "kvm_device": device}
    return (base or host_probe.environment()).replace(**kvm, **more).to_json()


def environment(result: BenchResult) -> dict[str, Any]:
    return kvm_environment(
        result.host_kernel,
        result.kvm_module,
        result.nr_memslots,
        result.config.device,
        result.environment,
        kvm_api_version=result.api_version,
        kvm_address_spaces=result.address_spaces,
        kvm_vcpu_mmap_size=result.vcpu_mmap_size,
    )


# --- measurement records ------------------------------------------------------------------
RECORD_METRICS: dict[str, tuple[str, str]] = {
    # metric: (unit, better)
    "setup_s_per_slot": ("s", "lower"),
    "move_s_per_slot": ("s", "lower"),
    "delete_s_per_slot": ("s", "lower"),
    "first_touch_us": ("us", "lower"),
    "warm_touch_us": ("us", "lower"),
    "fault_us": ("us", "lower"),
    "empty_pass_us": ("us", "lower"),
    "same_slot_us": ("us", "lower"),
    "slot_switch_us": ("us", "lower"),
    "mmio_exit_us": ("us", "lower"),
}


SCENARIO = "memslots.kvm"
# The same operations run in a host under test (host/memslots/l1_slots.py):
# a row of their own, whose primaries decide an A/B of host kernels.
SCENARIO_L1 = "memslots.kvm_l1"


def records(result: BenchResult) -> list[Any]:
    """One memqual.host.core.record.Measurement per metric per slot count (scenario
    SCENARIO, or SCENARIO_L1 where it ran in a host under test; variant
    {"slots": n}), samples = one per repeat."""
    env = environment(result)
    on_l1 = result.environment is not None and result.environment.host_under_test is not None
    settings = {"repeats": result.config.repeats, "slot_pages": result.config.slot_pages}
    out = []
    for n in result.config.slots:
        samples = [s for s in result.samples if s.slots == n]
        metrics = [per_slot_metrics(s) for s in samples]
        nodes, source = balanced_tree_nodes(n)
        walk = result.model_walks.get(n, {})
        for metric, (unit, better) in RECORD_METRICS.items():
            values = [m[metric] for m in metrics if metric in m]
            if not values:
                continue
            out.append(
                Measurement(
                    scenario=SCENARIO_L1 if on_l1 else SCENARIO,
                    metric=metric,
                    unit=unit,
                    better=better,
                    samples=values,
                    variant={"slots": n},
                    settings=settings,
                    environment=env,
                    extra={"model_nodes": nodes, "model_source": source, "model_walk": walk},
                    duration_s=result.duration_s,
                )
            )
    return out


def write_records(result: BenchResult, directory: str | os.PathLike[str]) -> list[Path]:
    return [write(r, directory) for r in records(result)]

"""Which metrics of two runs are the same metric: whether two results can
be compared at all (``check_comparable``), their metrics paired by key and
then by scenario, metric and variant (``pair_metrics``), a metric's
replicates as a results.json holds them, and both sides' regimes for a
metric that holds under one (host/judge/regime.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memqual.host.core.clock import check_same as check_same_clock
from memqual.host.core.errors import BadInput
from memqual.host.core.nested import check_same_host
from memqual.host.judge.regime import RegimeCheck, condition_of
from memqual.host.judge.regime import check as check_regime
from memqual.host.judge.results import MetricEntry, Results, variant_label


def _version(results: Results) -> str | None:
    """The memqual version that wrote the file; None when it does not say."""
    return None if "memqual_version" in results.missing else results.memqual_version


def check_comparable(
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    a_name: str = "A",
    b_name: str = "B",
    across_hosts: bool = False,
) -> None:
    """BadInput, in one line, when two results cannot be compared at all.
    Metrics (or whole scenarios) present on one side only are not a reason:
    ``compare_runs`` lists them and compares the rest."""
    a, b = Results.from_json(a), Results.from_json(b)
    if _version(a) != _version(b):
        raise BadInput(
            f"{a_name} was written by memqual {_version(a)}, {b_name} by "
            f"{_version(b)}: re-run both with the same version"
        )
    if not a.metrics and not b.metrics:
        raise BadInput(f"{a_name} and {b_name} hold no metrics: nothing to compare")
    # Guest timings on icount count instructions, on wall they are time.
    check_same_clock({a_name: (a.environment or {}).get("clock", ""), b_name: (b.environment or {}).get("clock", "")})
    if not across_hosts:
        check_same_host(
            {a_name: (a.environment or {}).get("host_under_test"), b_name: (b.environment or {}).get("host_under_test")}
        )
    pairs, only_a, only_b = pair_metrics(a.metrics, b.metrics)
    if not pairs:
        sa, sb = set(a.scenarios), set(b.scenarios)
        first = (only_a or only_b or ["-"])[0]
        raise BadInput(
            f"no metric is in both: {len(only_a)} only in {a_name}, {len(only_b)} only in {b_name} "
            f"(scenarios only in {a_name}: {', '.join(sorted(sa - sb)) or '-'}; only in {b_name}: "
            f"{', '.join(sorted(sb - sa)) or '-'}; first metric: {first}): compare runs of the same scenarios"
        )
    for ma, mb in pairs:
        if (ma.unit, ma.better) != (mb.unit, mb.better):
            raise BadInput(f"metric {ma.key}: unit or direction differ between {a_name} and {b_name}")


def _loose_key(m: MetricEntry) -> str:
    """A metric without its settings: scenario, metric, variant."""
    return f"{m.scenario} {m.metric} [{variant_label(m.variant or {})}]"


def pair_metrics(
    a: Sequence[MetricEntry], b: Sequence[MetricEntry]
) -> tuple[list[tuple[MetricEntry, MetricEntry]], list[str], list[str]]:
    """Pairs of the same metric in two runs: by full key (settings
    included), then, for what is left, by scenario, metric and variant when
    that is unambiguous on both sides -- a run with a changed setting (say a
    smaller pages_to_scan) is what a comparison is for; the settings that
    differ are reported with the pair.  Returns pairs and the unpaired keys."""
    ka = {m.key: m for m in a}
    kb = {m.key: m for m in b}
    pairs = [(ka[k], kb[k]) for k in sorted(ka.keys() & kb.keys())]
    rest_a = [ka[k] for k in sorted(ka.keys() - kb.keys())]
    rest_b = [kb[k] for k in sorted(kb.keys() - ka.keys())]
    loose_a: dict[str, list[MetricEntry]] = {}
    loose_b: dict[str, list[MetricEntry]] = {}
    for m in rest_a:
        loose_a.setdefault(_loose_key(m), []).append(m)
    for m in rest_b:
        loose_b.setdefault(_loose_key(m), []).append(m)
    only_a, only_b = [], []
    for key in sorted(loose_a.keys() | loose_b.keys()):
        la, lb = loose_a.get(key, []), loose_b.get(key, [])
        if len(la) == 1 and len(lb) == 1:
            pairs.append((la[0], lb[0]))
        else:
            only_a += [m.key for m in la]
            only_b += [m.key for m in lb]
    return pairs, only_a, only_b


def settings_diff(ma: MetricEntry, mb: MetricEntry) -> dict[str, tuple[Any, Any]]:
    sa, sb = ma.settings or {}, mb.settings or {}
    return {k: (sa.get(k), sb.get(k)) for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)}


def replicates_of(m: MetricEntry) -> list[list[float]]:
    """A results.json metric entry's replicates; an entry written before
    replicates existed is one replicate (the conservative reading)."""
    given: object = m.replicates
    if given is None:
        return [list(m.samples)]
    if not isinstance(given, list) or not all(
        isinstance(r, list) and all(isinstance(x, (int, float)) for x in r) for r in given
    ):
        raise BadInput(f"metric {m.key}: 'replicates' is not a list of lists of numbers: hand-edited?")
    reps = [list(r) for r in given if r]
    return reps or [list(m.samples)]


def regime_of(
    ma: MetricEntry,
    mb: MetricEntry,
    a_metrics: Sequence[MetricEntry],
    b_metrics: Sequence[MetricEntry],
    a_name: str = "A",
    b_name: str = "B",
) -> RegimeCheck | None:
    """Both sides' regimes for a metric that holds under one (host/judge/regime.py); None for the rest."""
    condition = condition_of(ma.scenario, ma.metric)
    if condition is None:
        return None
    return check_regime(
        condition,
        [
            (a_name, a_metrics, ma.variant or {}, ma.settings or {}),
            (b_name, b_metrics, mb.variant or {}, mb.settings or {}),
        ],
    )

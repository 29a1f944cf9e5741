"""Run B against run A, metric by metric: the computation behind ``memqual
compare`` (host/compare.py, the command and its table) and comparison.html
(host/compare_report.py).

Two results.json files (``memqual run`` writes them) are compared metric by
metric, on independent replicates (a fresh guest or a round of ``memqual
run``; host/record.py): the ratio of pooled medians B / A with its two-stage
bootstrap CI, and a permutation test of the replicate medians (exact when
the arrangements fit in the resample budget).  A metric entry without
``replicates`` (results written before they existed) counts as one
replicate.  The p-values of one comparison are corrected together with
Holm's step-down method, so the chance that an A/A comparison flags any
metric at all is at most alpha, however many metrics there are.  Verdicts:

- ``faster``: Holm-adjusted p < alpha, the median moved by at least the
  threshold, and B is better (lower when lower is better, higher when
  higher is);
- ``slower``: the same the other way: a regression;
- ``underpowered``: adjusted p not below alpha, and the metric's
  replicate counts could not have been significant in this comparison
  whatever was measured: the smallest p a permutation test of na against
  nb replicates can give (2 / C(2n, n) for n a side) is not below the
  corrected alpha it faced, alpha / (m - R), with m metrics compared and R
  of them with a Holm-adjusted p below alpha (where the step-down
  stopped).  The entry says how many replicates a side would do.  Never
  read it as "no difference";
- ``no difference``: anything else (including a significant change smaller
  than the threshold, and metrics that did not vary at all).

Metrics present on one side only are listed (``only_in_a``, ``only_in_b``)
and the rest compared.

``check_comparable`` raises BadInput (one line) when the two cannot be
compared: another memqual version, a metric whose unit or direction
differs, or no metric at all present in both.  The command (host/compare.py)
exits 1 when, and only when, at least one metric is ``slower``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memqual.host.errors import BadInput
from memqual.host.results import MetricEntry, Results, variant_label

if TYPE_CHECKING:
    from memqual.host import stats

# Defaults (memqual.host.stats has the same values; not imported here so that
# `memqual --help` does not load numpy and scipy).
DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
CORRECTION = "holm"

FASTER = "faster"
SLOWER = "slower"
NO_DIFFERENCE = "no difference"
UNDERPOWERED = "underpowered"
VERDICTS = (SLOWER, FASTER, UNDERPOWERED, NO_DIFFERENCE)


@dataclasses.dataclass(frozen=True)
class MetricComparison:
    key: str
    scenario: str
    metric: str
    unit: str
    better: str
    comparison: stats.Comparison  # p_adjusted is the Holm-adjusted p
    verdict: str
    settings_changed: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    variant: dict[str, Any] = dataclasses.field(default_factory=dict)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # A's
    # The significance level this metric's raw p faced after the correction
    # (alpha / (m - k + 1) at its Holm step; for a metric not significant,
    # the level at which the step-down stopped).
    alpha_corrected: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "settings_changed": {k: {"a": va, "b": vb} for k, (va, vb) in self.settings_changed.items()},
            "scenario": self.scenario,
            "metric": self.metric,
            "unit": self.unit,
            "better": self.better,
            "verdict": self.verdict,
            **self.comparison.to_json(),
            "alpha_corrected": self.alpha_corrected,
        }


@dataclasses.dataclass(frozen=True)
class RunComparison:
    metrics: list[MetricComparison]
    claims: list[dict[str, Any]]  # id, verdict in A, verdict in B
    environment: dict[str, tuple[Any, Any]]  # keys whose values differ
    threshold: float
    alpha: float
    only_in_a: list[str] = dataclasses.field(default_factory=list)  # metric keys
    only_in_b: list[str] = dataclasses.field(default_factory=list)
    correction: str = CORRECTION

    @property
    def regressions(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == SLOWER]

    @property
    def underpowered(self) -> list[MetricComparison]:
        return [m for m in self.metrics if m.verdict == UNDERPOWERED]

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "alpha": self.alpha,
            "correction": self.correction,
            "regressions": len(self.regressions),
            "underpowered": len(self.underpowered),
            "metrics": [m.to_json() for m in self.metrics],
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "claims": self.claims,
            "environment_differences": {k: {"a": a, "b": b} for k, (a, b) in self.environment.items()},
        }


def _direction_verdict(comp: stats.Comparison, better: str) -> str:
    if comp.direction == 0:
        return NO_DIFFERENCE
    b_is_higher = comp.direction > 0
    return FASTER if b_is_higher == (better == "higher") else SLOWER


def check_comparable(
    a: Results | Mapping[str, Any], b: Results | Mapping[str, Any], a_name: str = "A", b_name: str = "B"
) -> None:
    """BadInput, in one line, when two results cannot be compared at all.
    Metrics (or whole scenarios) present on one side only are not a reason:
    ``compare_results`` lists them and compares the rest."""
    a, b = Results.from_json(a), Results.from_json(b)
    if a.get("memqual_version") != b.get("memqual_version"):
        raise BadInput(
            f"{a_name} was written by memqual {a.get('memqual_version')}, {b_name} by "
            f"{b.get('memqual_version')}: re-run both with the same version"
        )
    if not a.metrics and not b.metrics:
        raise BadInput(f"{a_name} and {b_name} hold no metrics: nothing to compare")
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
        if (ma["unit"], ma["better"]) != (mb["unit"], mb["better"]):
            raise BadInput(f"metric {ma['key']}: unit or direction differ between {a_name} and {b_name}")


def _loose_key(m: Mapping[str, Any]) -> str:
    """A metric without its settings: scenario, metric, variant."""

    return f"{m.get('scenario')} {m.get('metric')} [{variant_label(m.get('variant') or {})}]"


def pair_metrics(
    a: Sequence[MetricEntry | Mapping[str, Any]], b: Sequence[MetricEntry | Mapping[str, Any]]
) -> tuple[list[tuple[MetricEntry, MetricEntry]], list[str], list[str]]:
    """Pairs of the same metric in two runs: by full key (settings
    included), then, for what is left, by scenario, metric and variant when
    that is unambiguous on both sides -- a run with a changed setting (say a
    smaller pages_to_scan) is what a comparison is for; the settings that
    differ are reported with the pair.  Returns pairs and the unpaired keys."""
    ka = {m.key: m for m in map(MetricEntry.from_json, a)}
    kb = {m.key: m for m in map(MetricEntry.from_json, b)}
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
            only_a += [m["key"] for m in la]
            only_b += [m["key"] for m in lb]
    return pairs, only_a, only_b


def _settings_diff(ma: Mapping[str, Any], mb: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    sa, sb = ma.get("settings") or {}, mb.get("settings") or {}
    return {k: (sa.get(k), sb.get(k)) for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)}


def replicates_of(m: Mapping[str, Any]) -> list[list[float]]:
    """A results.json metric entry's replicates; an entry written before
    replicates existed is one replicate (the conservative reading)."""
    given = m.get("replicates")
    if given is None:
        return [list(m["samples"])]
    if not isinstance(given, list) or not all(
        isinstance(r, list) and all(isinstance(x, (int, float)) for x in r) for r in given
    ):
        raise BadInput(f"metric {m.get('key')}: 'replicates' is not a list of lists of numbers: hand-edited?")
    reps = [list(r) for r in given if r]
    return reps or [list(m["samples"])]


def _no_variation(a_reps: list[list[float]], b_reps: list[list[float]]) -> bool:
    values = {x for r in a_reps + b_reps for x in r}
    return len(values) <= 1


def compare_results(
    a: Results | Mapping[str, Any],
    b: Results | Mapping[str, Any],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    a_name: str = "A",
    b_name: str = "B",
    n_resamples: int | None = None,
    n_permutations: int | None = None,
) -> RunComparison:
    import dataclasses as dc

    from memqual.host import stats

    a, b = Results.from_json(a), Results.from_json(b)
    check_comparable(a, b, a_name, b_name)
    pairs, only_a, only_b = pair_metrics(a.metrics, b.metrics)
    pairs = sorted(pairs, key=lambda p: p[0].key)
    resamples = stats.DEFAULT_RESAMPLES if n_resamples is None else n_resamples
    budget = stats.DEFAULT_PERMUTATIONS if n_permutations is None else n_permutations
    reps = [(replicates_of(ma), replicates_of(mb)) for ma, mb in pairs]
    raw = [
        stats.compare_replicates(
            ra, rb, alpha=alpha, min_effect=threshold, n_resamples=resamples, n_permutations=budget
        )
        for ra, rb in reps
    ]
    # Holm across every metric of this comparison: the family is what one
    # `memqual compare` could flag.
    m = len(raw)
    adjusted = stats.holm([c.p_value for c in raw])
    order = sorted(range(m), key=lambda i: raw[i].p_value)
    step = {i: k for k, i in enumerate(order)}  # 0-based Holm step of each metric
    rejected = sum(1 for p in adjusted if p < alpha)
    # Where the step-down stopped: every metric not significant faced this
    # level at best (a more extreme result would have put it first among
    # the rest, compared with alpha / (m - R)).
    stop_alpha = alpha / (m - rejected) if m > rejected else alpha
    metrics = []
    for i, ((ma, mb), (ra, rb), comp) in enumerate(zip(pairs, reps, raw, strict=True)):
        significant_p = adjusted[i] < alpha
        alpha_i = alpha / (m - step[i]) if significant_p else stop_alpha
        floor = stats.min_attainable_p(comp.n_replicates_a, comp.n_replicates_b, budget)
        underpowered = not significant_p and floor >= alpha_i and not _no_variation(ra, rb)
        comp = dc.replace(
            comp,
            p_adjusted=adjusted[i],
            min_attainable_p=floor,
            underpowered=underpowered,
            replicates_needed=stats.replicates_needed(alpha_i),
        )
        verdict = UNDERPOWERED if underpowered else _direction_verdict(comp, ma.better)
        metrics.append(
            MetricComparison(
                key=ma.key,
                scenario=ma.scenario,
                metric=ma.metric,
                unit=ma.unit,
                better=ma.better,
                comparison=comp,
                verdict=verdict,
                settings_changed=_settings_diff(ma, mb),
                variant=ma.variant or {},
                settings=ma.settings or {},
                alpha_corrected=alpha_i,
            )
        )
    claims_b = {c.id: c for c in b.claims}
    claims = [
        {"id": c["id"], "a": c.get("verdict"), "b": claims_b[c.id].get("verdict") if c.id in claims_b else None}
        for c in a.claims
    ]
    env_a, env_b = a.environment or {}, b.environment or {}
    env = {
        k: (env_a.get(k), env_b.get(k))
        for k in sorted(set(env_a) | set(env_b))
        if k != "environment_sources" and env_a.get(k) != env_b.get(k)
    }
    return RunComparison(
        metrics=metrics,
        claims=claims,
        environment=env,
        threshold=threshold,
        alpha=alpha,
        only_in_a=sorted(only_a),
        only_in_b=sorted(only_b),
    )


def short_labels(metrics: list[MetricComparison]) -> dict[str, str]:
    """Row labels: scenario, metric, variant, and only those settings that
    tell two rows of the same metric apart (the full key is in --json)."""

    by_metric: dict[tuple[str, str], list[MetricComparison]] = {}
    for m in metrics:
        by_metric.setdefault((m.scenario, m.metric), []).append(m)
    labels = {}
    for (scenario, metric), group in by_metric.items():
        keys = sorted({k for m in group for k in m.settings})
        varying = [k for k in keys if len({json.dumps(m.settings.get(k), sort_keys=True) for m in group}) > 1]
        for m in group:
            label = f"{scenario} {metric}"
            if m.variant:
                label += f" [{variant_label(m.variant)}]"
            if varying:
                # Two settings are enough to tell rows apart on a terminal.
                label += " " + ", ".join(f"{k}={m.settings.get(k)}" for k in varying[:2])
            if m.key.endswith(tuple(f" #{i}" for i in range(2, 10))):
                label += " " + m.key.rsplit(" ", 1)[1]
            labels[m.key] = label
    return labels


def verdict_text(m: MetricComparison) -> str:
    """The verdict, with what an underpowered metric would need."""
    if m.verdict == UNDERPOWERED and m.comparison.replicates_needed:
        return f"{UNDERPOWERED} (needs {m.comparison.replicates_needed} a side)"
    return m.verdict

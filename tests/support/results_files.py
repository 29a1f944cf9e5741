"""Synthetic records and the results files memqual writes from them, for
the tests that need a results.json to read."""

from __future__ import annotations

from pathlib import Path

from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.results import build_results, write_results


def inflate_record(replicates: list[list[float]]) -> Measurement:
    """A balloon inflate time (seconds, lower is better) measured as these
    replicates, each a list of samples from one guest."""
    return Measurement(
        scenario="balloon.inflate", metric="inflate_s", unit="s", better="lower", samples=[], replicates=replicates
    )


def block_record(
    scenario: str, metric: str, replicates: list[list[float]], environment: dict[str, str] | None = None
) -> Measurement:
    """A lower-is-better time (seconds) whose replicates are each its own
    block, as one arm of an interleaved A/B: two such files are decided
    (one file a side outside blocks is only described)."""
    return Measurement(
        scenario=scenario,
        metric=metric,
        unit="s",
        better="lower",
        samples=[],
        replicates=replicates,
        blocks=list(range(1, len(replicates) + 1)),
        environment=environment or {},
    )


def write_results_file(path: Path, records: list[Measurement]) -> Path:
    """results.json at ``path`` for these records, the claims judged from
    them as a run would; no host description (the tests' host is not the
    point)."""
    write_results(build_results(evaluate(load(), records), records, host_fallback=False), path)
    return path

"""The input of a bisect: the series of kernels and the metric, checked
before anything runs (bad input is one line, exit status 2)."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import re
from collections.abc import Callable
from pathlib import Path

from memqual.host.core import scenario
from memqual.host.core.errors import BadInput
from memqual.host.core.kernelspec import KernelSpec as KernelSpec
from memqual.host.core.kernelspec import parse_kernel as parse_kernel
from memqual.host.core.record import Measurement
from memqual.host.judge.results import metric_key, variant_label


def parse_series(texts: list[str], option: str = "--kernels") -> list[KernelSpec]:
    if len(texts) < 2:
        raise BadInput(
            f"a bisect needs at least 2 kernels (the good K1 and the bad Kn), {len(texts)} given: {option} K1 K2 ... Kn"
        )
    series = [parse_kernel(t) for t in texts]
    if series[0] == series[-1]:
        raise BadInput(
            f"the first and the last kernel are the same ({series[0].name}): nothing can differ between them"
        )
    return series


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """--metric: "METRIC", "SCENARIO METRIC", "SCENARIO/METRIC", each
    optionally followed by " [variant]", or a results.json metric key; then
    any number of "KEY=VALUE" words that a setting or the variant must
    have (two tests that record one metric differ in their settings:
    "deflate_s guest_mib=1024")."""

    text: str

    @property
    def filters(self) -> dict[str, str]:
        if "{" in self.text:
            return {}  # a full key: its settings are JSON
        return dict(w.split("=", 1) for w in self.text.split(" [", 1)[0].split() if "=" in w)

    @property
    def head(self) -> str:
        """The spec without its KEY=VALUE words."""
        if "{" in self.text:
            return self.text.strip()
        first, bracket, rest = self.text.partition(" [")
        words = [w for w in first.split() if "=" not in w]
        return " ".join(words) + (f" [{rest}" if bracket else "")

    @property
    def name(self) -> str:
        """The metric's own name (what a scenario records)."""
        head = self.head.split(" [", 1)[0].strip()
        return re.split(r"[ /]", head)[-1]

    def forms(self) -> set[str]:
        return {self.head, self.head.replace("/", " ", 1)}

    def admits(self, rec: Measurement) -> bool:
        values = {
            **{k: str(v) for k, v in (rec.settings or {}).items()},
            **{k: str(v) for k, v in (rec.variant or {}).items()},
        }
        return all(values.get(k) == v for k, v in self.filters.items())


def parse_metric(text: str) -> MetricSpec:
    if not text.strip() or "\n" in text:
        raise BadInput("--metric: give a metric name such as deflate_s or 'balloon.deflate deflate_s'")
    return MetricSpec(" ".join(text.split()))


def _string_constants(tests_dir: Path) -> tuple[set[str], list[re.Pattern[str]]]:
    """Every string constant of the scenario files, and every f-string as
    a pattern: a metric name is one of them (literal, built with an
    f-string, or held in a table the test iterates)."""
    names: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    for path in sorted(tests_dir.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(), str(path))
        except (OSError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                names.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                parts = [
                    re.escape(str(v.value)) if isinstance(v, ast.Constant) else r"[A-Za-z0-9_.]+" for v in node.values
                ]
                if any(isinstance(v, ast.Constant) for v in node.values):
                    patterns.append(re.compile("".join(parts)))
    return names, patterns


def primary_metrics() -> set[str]:
    """Every primary's metric of the scenario table (and the ones it is
    read by on icount and on a host under test): a scenario's own module
    may record it, not its test file (fault.anon's ns_per_page is
    host/fault/anon.py's)."""
    return {
        m for row in scenario.table() for p in row.primaries for m in (p.metric, p.on_icount, p.on_host_under_test) if m
    }


def check_metric_known(metric: MetricSpec, tests_dir: Path) -> None:
    """A metric name no scenario file could produce is a typo: one line
    with the nearest names, exit 2, before an hour of guests is spent.
    (The first round checks it for real against the records.)"""
    if not tests_dir.is_dir():
        return
    names, patterns = _string_constants(tests_dir)
    if not names:
        return  # no scenario sources to read: the first round decides
    name = metric.name
    if name in names or name in primary_metrics() or any(p.fullmatch(name) for p in patterns):
        return
    plausible = sorted(n for n in names if re.fullmatch(r"[a-z][a-z0-9_]*_[a-z0-9]+", n))
    near = difflib.get_close_matches(name, plausible, n=4, cutoff=0.6)
    raise BadInput(
        f"unknown metric {name!r}: no scenario records it"
        + (f"; nearest: {', '.join(near)}" if near else "")
        + " (the metrics of a run are in its results.json)"
    )


def metric_forms(rec: Measurement) -> set[str]:
    """The names a record answers to (see MetricSpec)."""
    variant = variant_label(rec.variant or {})
    s, m = rec.scenario, rec.metric
    return {metric_key(rec), f"{s} {m} [{variant}]", f"{s} {m}", f"{s}/{m}", m, f"{m} [{variant}]"}


def select_metric(
    records: list[Measurement], metric: MetricSpec, key: str | None = None
) -> tuple[Measurement | None, list[str]]:
    """The record of the metric among one job's records (matched by its
    full key once the first round has fixed it), and every key there is.
    Several matches are bad input: the spec must say which."""
    keys = sorted({metric_key(r) for r in records})
    if key is not None:
        found = [r for r in records if metric_key(r) == key]
    else:
        found = [r for r in records if metric.forms() & metric_forms(r) and metric.admits(r)]
    distinct = sorted({metric_key(r) for r in found})
    if len(distinct) > 1:
        raise BadInput(
            f"--metric {metric.text!r} names {len(distinct)} metrics ({'; '.join(distinct[:3])}"
            f"{' ...' if len(distinct) > 3 else ''}): add the scenario, the [variant] or a setting as KEY=VALUE"
        )
    return (found[0] if found else None), keys


def unknown_in_run(metric: MetricSpec, keys: list[str]) -> BadInput:
    near = difflib.get_close_matches(metric.text, keys, n=3, cutoff=0.3)
    return BadInput(
        f"unknown metric {metric.text!r}: the first round recorded {len(keys)} metrics"
        + (f", nearest: {'; '.join(near)}" if near else "")
        + " (use --only to run the scenario that records it)"
    )


Resolver = Callable[[str], tuple[Path, Path]]


def resolve_kernels(series: list[KernelSpec], resolve: Resolver | None = None) -> dict[str, tuple[Path, Path]]:
    """(vmlinuz, modules dir) per distinct version; an unknown version is
    the one-line BadInput of memqual.images.packages (nearest names, exit 2).
    Revisions of a source tree (``DIR@commit``) are left out: each is
    built when a probe needs it (``Kernels``)."""
    # lazy: the image builder (~40-50 ms, with cryptography) only where an image is built
    from memqual.images.kernel_sources import is_source_revision

    if resolve is None:
        # lazy: the image builder (~40-50 ms, with cryptography) only where an image is built
        from memqual.images.build import debian_kernel_files

        resolve = debian_kernel_files
    out: dict[str, tuple[Path, Path]] = {}
    for spec in series:
        if spec.version not in out and not is_source_revision(spec.version):
            out[spec.version] = resolve(spec.version)
    return out


def build_revision(name: str) -> tuple[Path, Path]:
    """A revision's kernel, built with memqual's guest config (or found in
    the cache): bzImage and modules."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.kernel_build import build

    kernel = build(name)
    return kernel.bzimage, kernel.modules


@dataclasses.dataclass
class Kernels:
    """A series' kernel files: Debian kernels found before anything runs
    (an unknown one is bad input at once), revisions built when first
    probed, so a bisect over n revisions builds about log2(n) of them."""

    series: list[KernelSpec]
    resolve: Resolver | None = None
    build: Resolver = build_revision
    files: dict[str, tuple[Path, Path]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.files = resolve_kernels(self.series, self.resolve)

    def __getitem__(self, version: str) -> tuple[Path, Path]:
        if version not in self.files:
            self.files[version] = self.build(version)
        return self.files[version]

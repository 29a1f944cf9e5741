"""Location and spread of repeated measurements, the median first: what a
subject records beside its samples, and what every page and table shows.
numpy only; the inference on them (intervals, tests, sequential looks) is
memqual.host.judge.stats's.  docs/claims-and-report.md ("Statistics").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from memqual.host.core.jsonfile import MAX_MAGNITUDE

# Samples as callers hold them: a list, or an array this module made.
Samples: TypeAlias = Sequence[float] | np.ndarray


def as_array(samples: Samples) -> np.ndarray:
    arr = np.asarray(list(samples), dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("need at least one sample")
    if not np.all(np.isfinite(arr)):
        raise ValueError("samples must be finite numbers")
    return arr


def median(samples: Samples) -> float:
    return float(np.median(as_array(samples)))


def iqr(samples: Samples) -> float:
    """Interquartile range (linear interpolation between order statistics)."""
    q1, q3 = np.percentile(as_array(samples), [25, 75])
    return float(q3 - q1)


def mad(samples: Samples) -> float:
    """Median absolute deviation from the median (unscaled)."""
    arr = as_array(samples)
    return float(np.median(np.abs(arr - np.median(arr))))


def cv(samples: Samples) -> float:
    """Coefficient of variation: sample stdev / |mean|; NaN for a zero mean,
    0 for a single sample."""
    arr = as_array(samples)
    if arr.size < 2:
        return 0.0
    mean = float(np.mean(arr))
    if mean == 0.0:
        return math.nan
    return float(np.std(arr, ddof=1) / abs(mean))


@dataclasses.dataclass(frozen=True)
class Summary:
    """Location and spread of one sample set."""

    n: int
    median: float
    mean: float
    stdev: float  # sample standard deviation (ddof=1); 0 for n == 1
    iqr: float
    mad: float
    cv: float
    minimum: float
    maximum: float

    def to_json(self) -> dict[str, Any]:
        # A figure the results reader would refuse (a CV of samples whose
        # mean is near 0 can pass 1e150 though every sample is readable) is
        # written as null, "not known", so the file stays readable.
        return {
            k: None if isinstance(v, float) and abs(v) > MAX_MAGNITUDE else finite_or_none(v)
            for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_json(cls, data: Any) -> Summary:
        """A summary ``to_json`` wrote (null: not finite)."""
        fields = [f.name for f in dataclasses.fields(cls)]
        values = {k: float_or_nan(data.get(k)) for k in fields if k != "n"}
        return cls(n=int(data.get("n") or 0), **values)


def summarize(samples: Samples) -> Summary:
    arr = as_array(samples)
    return Summary(
        n=int(arr.size),
        median=float(np.median(arr)),
        mean=float(np.mean(arr)),
        stdev=float(np.std(arr, ddof=1)) if arr.size > 1 else 0.0,
        iqr=iqr(arr),
        mad=mad(arr),
        cv=cv(arr),
        minimum=float(arr.min()),
        maximum=float(arr.max()),
    )


def ratio_of_medians(a: Samples, b: Samples) -> float:
    """median(B) / median(A); inf when A's median is 0 and B's is not."""
    ma, mb = median(a), median(b)
    if ma == 0.0:
        return math.nan if mb == 0.0 else math.copysign(math.inf, mb)
    return mb / ma


def float_or_nan(value: Any) -> float:
    """A number ``finite_or_none`` wrote back as a float (null: NaN)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

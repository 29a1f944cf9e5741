"""Where a family's runs changed: at each boundary the sum over its series
of their R^2 there, the largest, its null drawn from the covariance of the
series' residuals (a Gaussian multiplier bootstrap), so a drift common to a
run is no signal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

SCAN_DRAWS = 1999
SCAN_SEED = 20261203  # fixed: the same runs give the same page


def _scan_statistic(block: Any) -> Any:
    """For each boundary of rows of centred, standardised run values
    (``...`` x series x runs), the share of each series' variance between
    the two sides (its R^2 at that boundary: monotone in its |t|), summed
    over the series; the largest over the boundaries and where it is
    (its index: the boundary before run index + 1), each of shape ``...``."""
    import numpy as np

    n = block.shape[-1]
    k = np.arange(1, n)
    before = np.cumsum(block, axis=-1)[..., :-1]  # rows sum to 0: after = -before
    r2 = before * before * n / (k * (n - k) * (n - 1))
    return r2.sum(axis=-2).max(axis=-1), r2.sum(axis=-2).argmax(axis=-1)


def family_scan(values: Sequence[Sequence[float]], i: int, j: int) -> tuple[float, int]:
    """Where the family's runs changed: at each boundary of [i, j) the sum
    over the series of their R^2 there (each series standardised: a sign
    does not matter, so a change that makes some primaries faster and
    others slower adds up), the largest over the boundaries.  Its null is
    simulated: new runs drawn as normal vectors with the covariance of the
    series' residuals within both sides of the best boundary (a Gaussian
    multiplier bootstrap), so a drift common to the series of a run --
    correlated residuals -- widens the null as much as it widens the
    statistic, and independent series keep the sum's own spread.  Not a
    permutation of the runs: 8 runs split 4 and 4 in 35 ways, so no
    permutation p goes below 1/35.  Series with a run missing in the
    segment, or no spread, are left out.  Returns the p and the boundary
    (-1: none)."""
    import numpy as np

    rows = [list(v[i:j]) for v in values]
    rows = [r for r in rows if all(math.isfinite(x) for x in r)]
    n = j - i
    if n < 4 or not rows:
        return 1.0, -1
    block = np.array(rows, dtype=float)
    block -= block.mean(axis=1, keepdims=True)
    sd = block.std(axis=1, ddof=1)
    block = block[sd > 0.0] / sd[sd > 0.0, None]
    if not len(block):
        return 1.0, -1
    observed, at = _scan_statistic(block)
    cut = int(at) + 1
    resid = block.copy()
    for side in (slice(0, cut), slice(cut, None)):
        resid[:, side] -= resid[:, side].mean(axis=1, keepdims=True)
    rng = np.random.default_rng(SCAN_SEED)
    exceed = 0
    for start in range(0, SCAN_DRAWS, 250):
        count = min(250, SCAN_DRAWS - start)
        draws = np.einsum("gm,bmn->bgn", resid, rng.standard_normal((count, n, n)))
        draws -= draws.mean(axis=2, keepdims=True)
        spread = draws.std(axis=2, ddof=1, keepdims=True)
        draws = np.divide(draws, spread, out=np.zeros_like(draws), where=spread > 0.0)
        exceed += int((_scan_statistic(draws)[0] >= observed).sum())
    return (1 + exceed) / (SCAN_DRAWS + 1), i + cut

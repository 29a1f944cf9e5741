"""The claims registry and the verdicts: model.py what a claim and a
verdict are, load.py claims/claims.json read and checked, evaluate.py each
claim judged from a run's evidence (records.py, order.py, layouts.py by the
claim's source; rule.py B / A to a verdict).  docs/claims-and-report.md is the
manual.  This package's names are re-exported here, so a caller writes
``claims.load`` and ``claims.evaluate``.
"""

from __future__ import annotations

from memqual.host.judge.claims.evaluate import (
    evaluate as evaluate,
)
from memqual.host.judge.claims.evaluate import (
    judge_claim as judge_claim,
)
from memqual.host.judge.claims.layouts import (
    layout_results as layout_results,
)
from memqual.host.judge.claims.load import (
    load as load,
)
from memqual.host.judge.claims.load import (
    parse as parse,
)
from memqual.host.judge.claims.model import (
    ANALOGUE as ANALOGUE,
)
from memqual.host.judge.claims.model import (
    ANCHOR_IDS as ANCHOR_IDS,
)
from memqual.host.judge.claims.model import (
    CLAIM_ALPHA as CLAIM_ALPHA,
)
from memqual.host.judge.claims.model import (
    DEFAULT_CLAIMS_FILE as DEFAULT_CLAIMS_FILE,
)
from memqual.host.judge.claims.model import (
    DEFAULT_MIN_EFFECT as DEFAULT_MIN_EFFECT,
)
from memqual.host.judge.claims.model import (
    DIRECTION_ONLY as DIRECTION_ONLY,
)
from memqual.host.judge.claims.model import (
    DIRECTIONS as DIRECTIONS,
)
from memqual.host.judge.claims.model import (
    EVIDENCE_CLASSES as EVIDENCE_CLASSES,
)
from memqual.host.judge.claims.model import (
    LAYOUT_SCENARIO as LAYOUT_SCENARIO,
)
from memqual.host.judge.claims.model import (
    MEASURED as MEASURED,
)
from memqual.host.judge.claims.model import (
    MIN_REPLICATES as MIN_REPLICATES,
)
from memqual.host.judge.claims.model import (
    MODEL as MODEL,
)
from memqual.host.judge.claims.model import (
    NOT_MEASURABLE as NOT_MEASURABLE,
)
from memqual.host.judge.claims.model import (
    NOT_REPRODUCED as NOT_REPRODUCED,
)
from memqual.host.judge.claims.model import (
    REPRODUCED as REPRODUCED,
)
from memqual.host.judge.claims.model import (
    SCHEMA as SCHEMA,
)
from memqual.host.judge.claims.model import (
    SOURCES as SOURCES,
)
from memqual.host.judge.claims.model import (
    SUCCESSOR as SUCCESSOR,
)
from memqual.host.judge.claims.model import (
    UNDERPOWERED as UNDERPOWERED,
)
from memqual.host.judge.claims.model import (
    UNMEASURABLE as UNMEASURABLE,
)
from memqual.host.judge.claims.model import (
    Accelerator as Accelerator,
)
from memqual.host.judge.claims.model import (
    Beside as Beside,
)
from memqual.host.judge.claims.model import (
    BesideResult as BesideResult,
)
from memqual.host.judge.claims.model import (
    CeilingResult as CeilingResult,
)
from memqual.host.judge.claims.model import (
    CeilingSpec as CeilingSpec,
)
from memqual.host.judge.claims.model import (
    Claim as Claim,
)
from memqual.host.judge.claims.model import (
    Evidence as Evidence,
)
from memqual.host.judge.claims.model import (
    LayoutResult as LayoutResult,
)
from memqual.host.judge.claims.model import (
    Measure as Measure,
)
from memqual.host.judge.claims.model import (
    NoEvidence as NoEvidence,
)
from memqual.host.judge.claims.model import (
    Quantity as Quantity,
)
from memqual.host.judge.claims.model import (
    Skip as Skip,
)
from memqual.host.judge.claims.model import (
    TodayLayouts as TodayLayouts,
)
from memqual.host.judge.claims.model import (
    Verdict as Verdict,
)
from memqual.host.judge.claims.model import (
    finite as finite,
)
from memqual.host.judge.claims.model import (
    format_ratio as format_ratio,
)
from memqual.host.judge.claims.rule import (
    judge as judge,
)

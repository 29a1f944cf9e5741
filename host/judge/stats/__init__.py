"""The statistics of memqual, in one room: the location and spread every
subject records (memqual.host.core.descriptive, re-exported here), the
intervals of pooled medians (intervals.py), permutation and sign-flip tests
and Holm (permutation.py), the A/B decision tests (ab_tests.py), the
recursion of the sequential looks (group_sequential.py) and the t-intervals
of log ratios (ratio_ci.py).  docs/claims-and-report.md ("Statistics") and
docs/ab-calibration.md say why each is made as it is.

``from memqual.host.judge import stats`` gives the first three by name;
ab_tests and group_sequential import scipy and are imported on their own.
"""

from memqual.host.core.descriptive import Samples as Samples
from memqual.host.core.descriptive import Summary as Summary
from memqual.host.core.descriptive import cv as cv
from memqual.host.core.descriptive import iqr as iqr
from memqual.host.core.descriptive import mad as mad
from memqual.host.core.descriptive import median as median
from memqual.host.core.descriptive import ratio_of_medians as ratio_of_medians
from memqual.host.core.descriptive import summarize as summarize
from memqual.host.judge.stats.intervals import CONFIDENCE as CONFIDENCE
from memqual.host.judge.stats.intervals import DEFAULT_RESAMPLES as DEFAULT_RESAMPLES
from memqual.host.judge.stats.intervals import DEFAULT_SEED as DEFAULT_SEED
from memqual.host.judge.stats.intervals import hierarchical_ratio_ci as hierarchical_ratio_ci
from memqual.host.judge.stats.intervals import median_ci as median_ci
from memqual.host.judge.stats.intervals import pooled_ratio as pooled_ratio
from memqual.host.judge.stats.intervals import replicate_medians as replicate_medians
from memqual.host.judge.stats.intervals import two_stage_medians as two_stage_medians
from memqual.host.judge.stats.permutation import DEFAULT_PERMUTATIONS as DEFAULT_PERMUTATIONS
from memqual.host.judge.stats.permutation import PermutationResult as PermutationResult
from memqual.host.judge.stats.permutation import holm as holm
from memqual.host.judge.stats.permutation import min_attainable_p as min_attainable_p
from memqual.host.judge.stats.permutation import permutation_test as permutation_test
from memqual.host.judge.stats.permutation import replicate_permutation_test as replicate_permutation_test
from memqual.host.judge.stats.permutation import sign_flip_pvalue as sign_flip_pvalue

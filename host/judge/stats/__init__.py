"""The statistics of memqual, in one room: the intervals of pooled medians
(intervals.py), permutation and sign-flip tests and Holm (permutation.py),
the A/B decision tests (ab_tests.py), the recursion of the sequential
looks (group_sequential.py), the t-intervals of log ratios (ratio_ci.py)
and the exact intervals and tests of rates (binomial.py); the location and spread
every subject records are memqual.host.core.descriptive's.  Each is
imported from its own module.  docs/claims-and-report.md ("Statistics")
and docs/ab-calibration.md say why each is made as it is.
"""

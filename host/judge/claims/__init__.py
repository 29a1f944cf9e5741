"""The claims registry and the verdicts: model.py what a claim and a
verdict are, load.py claims/claims.json read and checked, evaluate.py each
claim judged from a run's evidence (records.py, order.py, layouts.py by the
claim's source; rule.py B / A to a verdict; ran_on.py where each ran).
docs/claims-and-report.md is the manual.  Each name is imported from the
module that defines it (``claims.load.load``, ``claims.evaluate.evaluate``).
"""

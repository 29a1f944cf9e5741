"""Judging: claims (model, load, evaluate), results.json, the comparison
of two runs, regimes and change points.  Reads records and results; draws
no page and parses no option."""

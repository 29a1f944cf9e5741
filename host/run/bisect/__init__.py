"""Bisection of a kernel series (``memqual bisect``): decide.py the
decisions (pure), series.py the input, run.py the probes, rounds, state and
log, axis.py what the series is of (guest or host kernels) and the arms a
step runs, jobs.py the Avocado jobs, until.py the same decisions for ``memqual run
--until-decided``, page.py bisect.html.  The command is host/cli/bisect.py.
"""

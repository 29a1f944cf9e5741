"""``memqual run`` and what drives jobs: the Avocado job under its
supervisor, its result events, progress, signals, outputs and an A/B in
blocks (ab_run.py); bisect/ and the fleet of lab hosts (hosts/).  Parses
no option (host/cli/)."""

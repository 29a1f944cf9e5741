"""``memqual run`` and what drives jobs: the Avocado job under its
supervisor, its result events, progress, signals, outputs and A/B rounds;
bisect/ and the fleet of lab hosts (hosts/).  Parses no option (host/cli/)."""

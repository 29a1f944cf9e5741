"""hugetlbfs-backed guests: guest RAM on 2 MiB host pages (pool.py: the
host's pool, reserved and given back; scenarios.py: what KSM and the
balloon do to such a guest; table.py: the rows).  docs/hugetlbfs.md."""

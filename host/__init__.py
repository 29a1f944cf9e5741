"""memqual's host side, in rooms: core <- subjects (ksm, memslots, balloon,
virtio_mem, hugetlbfs, fault) <- judge <- report <- run <- cli, imports one
way (the import-linter contracts in pyproject.toml;
tests/house/test_architecture.py); images/ sits between core's base and the
rest of core."""

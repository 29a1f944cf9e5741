"""memqual's host side, in rooms: core <- subjects (ksm, memslots, balloon,
virtio_mem) <- judge <- report <- run <- cli, imports one way (the
import-linter contracts in pyproject.toml; tests/house/test_architecture.py)."""

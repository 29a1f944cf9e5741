"""Split test files between ./run-tests' pytest processes by their measured
seconds (tests/shard_seconds.txt), greedily, the slowest first: with every
other file to each, one process ran 178 s and the other 107 s.

    python tests/support/shards.py K N FILE...   # the files of shard K of N
"""

from __future__ import annotations

import sys
from pathlib import Path

SECONDS = Path(__file__).resolve().parent.parent / "shard_seconds.txt"
UNLISTED_S = 0.3  # a file under a second: most take a tenth or two


def weights(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        name, _, seconds = line.partition(" ")
        if name and not name.startswith("#"):
            found[name] = float(seconds)
    return found


def split(files: list[str], shards: int, known: dict[str, float]) -> list[list[str]]:
    """Each file to the shard with the least seconds so far, the slowest
    file first; ties by name, so the split is the same every run."""
    out: list[list[str]] = [[] for _ in range(shards)]
    loads = [0.0] * shards
    for name in sorted(files, key=lambda f: (-known.get(f, UNLISTED_S), f)):
        k = loads.index(min(loads))
        out[k].append(name)
        loads[k] += known.get(name, UNLISTED_S)
    return out


def main(argv: list[str]) -> int:
    k, n, files = int(argv[0]), int(argv[1]), argv[2:]
    known = weights(SECONDS.read_text()) if SECONDS.exists() else {}
    print("\n".join(split(files, n, known)[k]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

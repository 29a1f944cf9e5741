"""./run-tests' pytest split (tests/support/shards.py): every file in
exactly one shard, the measured seconds balanced."""

from __future__ import annotations

import shards


def test_every_file_lands_in_one_shard_and_the_seconds_balance() -> None:
    known = {"a.py": 30.0, "b.py": 20.0, "c.py": 10.0, "d.py": 10.0}
    files = ["d.py", "c.py", "b.py", "a.py", "e.py"]
    out = shards.split(files, 2, known)
    assert sorted(out[0] + out[1]) == sorted(files)
    loads = [sum(known.get(f, shards.UNLISTED_S) for f in part) for part in out]
    assert abs(loads[0] - loads[1]) <= 10.3
    # alternate files would have given 40.3 against 30
    assert out == shards.split(list(reversed(files)), 2, known)  # the same split whatever the order given


def test_the_committed_seconds_parse() -> None:
    known = shards.weights(shards.SECONDS.read_text())
    assert known and all(name.startswith("tests/") and seconds >= 1.0 for name, seconds in known.items())

"""The order ./run-tests starts its e2e tests in.  Avocado runs two at a
time, but a test that measures holds the host's measurement lock alone
(e2e/base.py): a test that measures nothing, started between two that
measure, runs with the other slot idle.  In three fresh-clone jobs of
392-457 s in file order, such tests ran 63-68 s so; the same jobs replayed
in this order (their tests' seconds, two slots, the lock) took 35-39 s
less.  So, each group in Avocado's own order (file, then source):

1. the tests that hold the lock shared, two at a time beside each other;
2. the first test that holds the lock alone: its runner starts in the
   first slot the shared tests leave, and it takes the lock the moment the
   last of them ends.  Behind the lab hosts' test instead, it started only
   when that last one ended: the lock stood unused 1.6-3.7 s (7 fresh-clone
   jobs of 2026-12-06, 2.0 s the median) while its runner started;
3. the tests that are not GuestTests and hold no lock for their run: the
   lab hosts' test, which waits most of its minute for its fleet's tasks,
   which take the lock.  Started among the measuring tests, its waits
   overlap their work instead of a shared test's;
4. the other tests that hold the lock alone (GuestTests that measure, and
   classes that say ``holds_the_lock_alone``), one after the other, the
   next one's runner starting in the other slot (beside the lab hosts'
   test, after the one before it: the longer those tests, the fewer such
   starts).

    python tests/support/e2e_order.py    # references for `avocado run`, one a line

Nothing is left out: the tests are the ones ``avocado list e2e/`` finds, and
where it or an import fails, the one reference ``e2e/`` (Avocado's order)
with the reason on stderr.
"""

from __future__ import annotations

import enum
import importlib
import subprocess
import sys
from pathlib import Path

from memqual.e2e.base import HOLDS_THE_LOCK_ALONE, MEASURES_NOTHING, GuestTest

REPO = Path(__file__).resolve().parent.parent.parent
AVOCADO = Path(sys.executable).with_name("avocado")
E2E = "e2e/"


class Group(enum.IntEnum):
    """Where a test starts, earliest first."""

    BESIDE_OTHERS = 1  # holds the measurement lock shared
    NO_LOCK = 2  # no GuestTest, and no lock for its run
    ALONE = 3  # holds the measurement lock exclusive


def group(cls: type, method: str) -> Group:
    """The group of test ``method`` of ``cls``, as GuestTest decides its
    hold on the wall clock outside a host under test (``./run-tests``'):
    shared when the method measures nothing or every figure of the class
    is a count of its own guests' instructions."""
    if not issubclass(cls, GuestTest):
        return Group.ALONE if getattr(cls, HOLDS_THE_LOCK_ALONE, False) else Group.NO_LOCK
    if cls.counts_only_its_guests or getattr(getattr(cls, method), MEASURES_NOTHING, False):
        return Group.BESIDE_OTHERS
    return Group.ALONE


def group_of(name: str) -> Group:
    """The group of ``e2e/test_x.py:Class.method``, its module imported."""
    path, _, test = name.partition(":")
    class_name, _, method = test.partition(".")
    module = importlib.import_module(f"memqual.e2e.{Path(path).stem}")
    return group(getattr(module, class_name), method)


def reference(name: str) -> str:
    """An `avocado run` reference that selects test ``name`` alone: the
    part after the colon is a regular expression searched in
    ``Class.method``, so it is anchored at both ends."""
    path, _, test = name.partition(":")
    return f"{path}:^{test}$"


def ordered(names: list[str]) -> list[str]:
    """``names`` (``e2e/test_x.py:Class.method``, in Avocado's order) by
    group, each group in the order given, the first of those that hold the
    lock alone ahead of those that hold none."""
    groups = {name: group_of(name) for name in names}
    out = sorted(names, key=groups.__getitem__)  # stable: ties keep Avocado's order
    alone = [name for name in out if groups[name] == Group.ALONE]
    no_lock = [name for name in out if groups[name] == Group.NO_LOCK]
    if alone and no_lock:
        out.remove(alone[0])
        out.insert(out.index(no_lock[0]), alone[0])
    return out


def listed() -> list[str]:
    """The tests ``avocado list e2e/`` finds, in its order."""
    out = subprocess.run(
        [str(AVOCADO), "list", E2E], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return [line.split()[1] for line in out.splitlines() if line.startswith("avocado-instrumented ")]


def main() -> int:
    try:
        names = ordered(listed())
    except (OSError, subprocess.SubprocessError, ImportError, AttributeError) as exc:
        print(f"e2e_order: {exc}; Avocado's own order instead", file=sys.stderr)
        names = []
    print("\n".join(reference(n) for n in names) if names else E2E)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What every step of a build (a kernel's, a QEMU's) runs with: the build
parent folder, kbuild's fixed stamps, ccache's folder and counters,
``run_ok`` (a build user's step, its failure one line) and ``run_compile``
(the long compile, its output read within bounds, its failure the file
that failed).  docs/patch-qualification.md, "images/kernel_build.py"."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from memqual.host.core import bounded, settings
from memqual.host.core.errors import BadInput
from memqual.host.core.printable import printable
from memqual.images import unprivileged

BUILD_PARENT = Path("/var/tmp/memqual-kbuild")
BUILD_PARENT_ENV = settings.KBUILD_DIR
STEP_TIMEOUT_S = 1800.0
STAMP_ENV = {
    "KBUILD_BUILD_USER": "memqual",
    "KBUILD_BUILD_HOST": "memqual",
    "KBUILD_BUILD_VERSION": "1",
    "KBUILD_BUILD_TIMESTAMP": "1970-01-01",
}
# ccache's masquerade folder (gcc -> ccache links, root's) goes first in
# the build's PATH when ccache is installed: the compiler's command lines
# stay the same with and without it, so a tree built with ccache is
# incremental for a build without it and the other way round.
CCACHE_LINKS = Path("/usr/lib/ccache")
CCACHE_SIZE = "4G"


def kbuild_parent() -> Path:
    """The folder every build's folders, kept base trees and ccache's folder are in."""
    return unprivileged.build_parent(settings.kbuild_dir() or BUILD_PARENT)


def ccache_folder(user: unprivileged.BuildUser) -> Path | None:
    """The build user's compiler cache, beside the build folders (so it
    outlives them), or None when ccache is not installed or the folder is
    not the build user's alone.  Only the build user's compilers read it:
    root never does, and what comes back from a build is checked as any
    build's output is (unprivileged.receive, check_artefacts)."""
    try:
        st = os.lstat(CCACHE_LINKS / "gcc")
        links = os.stat(CCACHE_LINKS)
    except OSError:
        return None
    if links.st_uid != 0 or links.st_mode & 0o022 or st.st_uid != 0:
        return None
    return unprivileged.user_folder(kbuild_parent(), user, f"ccache-{user.uid}")


def build_env(user: unprivileged.BuildUser) -> dict[str, str]:
    """The environment of every step of a build: kbuild's fixed stamps
    (a build is the same whoever runs it, whenever), and ccache's folder
    when there is one.  CCACHE_BASEDIR makes paths below the build parent
    relative, so build folders of different names share hits; depend
    mode (kbuild passes -Wp,-MMD) spares a miss the preprocessor run
    ccache would otherwise add to each compile."""
    env = dict(STAMP_ENV)
    # a confined build (a patch's) runs as a uid of its own, which cannot
    # read the build user's 0700 cache: it compiles without ccache, and so
    # adds nothing to it either
    cache = ccache_folder(user) if user.confined_to is None else None
    if cache is not None:
        env |= {
            "PATH": f"{CCACHE_LINKS}:{unprivileged.BUILD_PATH}",
            "CCACHE_DIR": str(cache),
            "CCACHE_BASEDIR": str(cache.parent),
            "CCACHE_NOHASHDIR": "1",
            "CCACHE_DEPEND": "1",
            "CCACHE_SLOPPINESS": "time_macros,locale",
            "CCACHE_MAXSIZE": CCACHE_SIZE,
            "CCACHE_TEMPDIR": str(cache / "tmp"),
        }
    return env


CCACHE_HITS = ("direct_cache_hit", "preprocessed_cache_hit")


def ccache_counts(user: unprivileged.BuildUser, folder: Path) -> dict[str, int]:
    """ccache's lifetime counters of the build user's cache (hits, misses),
    read by the build user; empty without ccache.  A step's lookups are the
    difference of two readings (another build at the same time would add
    its own: builds of one source are serialized, of two are not)."""
    env = build_env(user)
    if "CCACHE_DIR" not in env:
        return {}
    proc = unprivileged.run(user, ["ccache", "--print-stats"], folder, folder / "home", env=env, timeout=120)
    counters: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        name, _, value = line.partition("\t")
        if value.strip().isdigit():
            counters[name.strip()] = int(value)
    if proc.returncode != 0 or "cache_miss" not in counters:
        return {}
    return {"hits": sum(counters.get(n, 0) for n in CCACHE_HITS), "misses": counters["cache_miss"]}


def run_ok(
    user: unprivileged.BuildUser, argv: list[str], cwd: Path, home: Path, what: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    proc = unprivileged.run(user, argv, cwd, home, stdin=stdin, env=build_env(user), timeout=STEP_TIMEOUT_S)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()][-3:]
        raise BadInput(f"{what} failed: {' | '.join(lines) or 'no output'}")
    return proc


@dataclasses.dataclass
class CompileLog:
    """A compile's output as it comes (make's, ninja's): its last lines and
    its first errors, and the one line its failure says."""

    tail: collections.deque[str] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=40))
    errors: list[str] = dataclasses.field(default_factory=list)

    def line(self, text: str) -> None:
        self.tail.append(text)
        if re.search(r"\berror\b", text) and len(self.errors) < 5:
            self.errors.append(text)

    def failure(self, what: str, fallback: str) -> BadInput:
        """The last lines on stderr (the tree's text, which a patch chose:
        shown printable), and one line naming the file that failed."""
        print(printable("\n".join(self.tail)), file=sys.stderr)
        where = next((m.group(1) for e in self.errors if (m := re.match(r"([^\s:]+):\d+(?::\d+)?: .*error", e))), "")
        first = self.errors[0].strip() if self.errors else (self.tail[-1] if self.tail else fallback)
        return BadInput(f"{what} failed{' in ' + where if where else ''}: {first[:200]}")


def run_compile(
    user: unprivileged.BuildUser,
    argv: Sequence[str],
    cwd: Path,
    home: Path,
    timeout_s: float,
    on_line: Callable[[str], None],
    what: str,
) -> None:
    """A long compile as the build user, each line of its output to
    ``on_line`` (progress) as it comes; read within bounds
    (host/core/bounded.py): the deadline holds while it is silent, and a
    line without end keeps bounded.LINE_MAX bytes.  A failure is
    ``CompileLog.failure``; the deadline one line too."""
    proc = unprivileged.popen(user, argv, cwd, home, env=build_env(user))
    log = CompileLog()

    def line(raw: str) -> None:
        text = raw.rstrip()
        log.line(text)
        on_line(text)

    try:
        # the lines are kept here (the log), not the stream's bytes
        status = bounded.collect(proc, time.monotonic() + timeout_s, on_line=line, keep=0).returncode
    except bounded.Overdue:
        raise BadInput(f"{what} did not finish in {timeout_s / 3600:.3g} h") from None
    finally:
        if proc.poll() is None:
            unprivileged.end_group(proc)
    if status != 0:
        raise log.failure(what, f"{argv[0]} failed")

"""A patched build's confinement (images/unprivileged.py ``confined``)
against another process of the build user running beside it: the other
build's folder and ccache's are the build user's too, so only the
confinement keeps a hostile step out of them, through every way the
host's /proc offers (another process's ``root`` and ``cwd`` links)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from memqual.host.core.polling import poll
from memqual.images import build_uids, unprivileged

needs_confinement = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv") or not unprivileged.can_confine(),
    reason="confining a build step needs root, util-linux's unshare and setpriv, and a mount namespace",
)

# What a hostile step tries: the other build's folder and ccache's, by
# their paths and through every process /proc shows it.  The paths are
# its arguments; it prints how many processes it saw.
REACH_OUT = """
other=$1 cache=$2
touch "$other/direct" "$cache/direct" 2>/dev/null
for p in /proc/[0-9]*; do
    touch "$p/root$other/via-root" "$p/root$cache/via-root" "$p/cwd/via-cwd" 2>/dev/null
done
ls -d /proc/[0-9]* | wc -l
"""


@pytest.fixture
def parent() -> Iterator[Path]:
    """A root-owned 0711 build parent the build user can pass through (a
    test's tmp_path is root's 0700), as images/kernel_env.py makes one."""
    outer = Path(tempfile.mkdtemp(prefix="mq-confine-test-", dir="/tmp"))
    os.chmod(outer, 0o711)
    yield unprivileged.build_parent(outer / "kbuild")
    shutil.rmtree(outer)


@pytest.fixture
def beside(parent: Path) -> Iterator[tuple[Path, Path]]:
    """Another build of the build user, running in its own folder beside
    the confined one's (unconfined, as an unpatched build runs), and
    ccache's folder: (its folder, ccache's)."""
    user = unprivileged.build_user()
    other = unprivileged.user_folder(parent, user, "work-other")
    cache = unprivileged.user_folder(parent, user, f"ccache-{user.uid}")
    assert other is not None and cache is not None
    proc = subprocess.Popen(
        unprivileged.as_user(user.uid, user.gid, ["sleep", "60"]), cwd=other, start_new_session=True
    )
    try:
        # its sleep is up once a process of the build user works in its folder
        poll(lambda: _working_in(other, user.uid), 10.0, 0.05, what="the other build's process")
        yield other, cache
    finally:
        unprivileged.end_group(proc)


def _working_in(folder: Path, uid: int) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid and os.readlink(entry / "cwd") == str(folder):
                return True
        except OSError:
            continue
    return False


def _reach_out(user: unprivileged.BuildUser, folder: Path, other: Path, cache: Path) -> int:
    proc = unprivileged.run(user, ["sh", "-c", REACH_OUT, "sh", str(other), str(cache)], folder, folder / "home")
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


@needs_confinement
def test_a_confined_step_cannot_reach_another_build_user_process_or_ccache(
    parent: Path, beside: tuple[Path, Path]
) -> None:
    """The confined step sees its own processes only (a procfs of its own),
    so no other process's root or cwd leads it past the read-only bind:
    neither the other build's folder nor ccache's gets a file."""
    other, cache = beside
    with build_uids.own_uid() as uid:
        user = unprivileged.confined(unprivileged.build_user(), parent, parent / "work-own", uid)
        own = unprivileged.fresh_folder(parent, user, "work-own")
        seen = _reach_out(user, own, other, cache)
        unprivileged.remove_folder(user, own)
    assert sorted(os.listdir(other)) == [] and sorted(os.listdir(cache)) == []
    assert seen <= 3  # its shell, ls and the namespace's first process: nothing of the host's


@needs_confinement
def test_unconfined_the_same_step_writes_into_both(parent: Path, beside: tuple[Path, Path]) -> None:
    """The test above can fail: the same step unconfined (as the build
    user, its PID namespace only) writes into both folders, directly and
    through the other process's links."""
    other, cache = beside
    user = unprivileged.build_user()
    own = unprivileged.user_folder(parent, user, "work-own")
    assert own is not None
    seen = _reach_out(user, own, other, cache)
    assert {"direct", "via-root", "via-cwd"} <= set(os.listdir(other))
    assert {"direct", "via-root"} <= set(os.listdir(cache)) and seen > 3


@needs_confinement
def test_a_confined_step_runs_as_a_uid_of_its_own_that_no_other_build_holds(parent: Path) -> None:
    """Two confined builds at once get two uids of the reserved range, and
    neither is the build user's; a uid a process already has is passed over."""
    user = unprivileged.build_user()
    with build_uids.own_uid() as first, build_uids.own_uid() as second:
        assert first != second and {first, second} <= set(build_uids.BUILD_UIDS) and user.uid not in (first, second)
        confined = unprivileged.confined(user, parent, parent / "work-own", first)
        own = unprivileged.fresh_folder(parent, confined, "work-own")
        ids = unprivileged.run(confined, ["id", "-u"], own, own / "home").stdout.split()
        unprivileged.remove_folder(confined, own)
        assert ids == [str(first)]
    squatter = build_uids.BUILD_UIDS[0]
    proc = subprocess.Popen(unprivileged.as_user(squatter, squatter, ["sleep", "60"]), cwd="/", start_new_session=True)
    try:
        poll(lambda: squatter in build_uids.running_uids(), 10.0, 0.05, what="a process of the first build uid")
        with build_uids.own_uid() as uid:
            assert uid != squatter
    finally:
        unprivileged.end_group(proc)

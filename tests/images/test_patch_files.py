"""The files a patch touches, as GNU ``patch -p1`` may touch them
(images/patch_files.py), through every reader of a patch: ``read_patch``
(kernel build, run --patch's arms) and run --patch's scope.  Every name
a header offers counts; what memqual cannot tell is one line, exit 2,
never "nothing to qualify"; reading is bounded and listing linear."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from one_line_errors import assert_one_line_error, in_process

from memqual.host.core.errors import BadInput
from memqual.images import kernel_patches
from memqual.images.patch_files import Unreadable, patch_files

HUNK = "@@ -1 +1 @@\n-a\n+b\n"
E_ACUTE = "mm/\\303\\251.c"  # mm/é.c as git quotes it


def unified(old: str, new: str, body: str = HUNK) -> str:
    return f"--- {old}\n+++ {new}\n{body}"


@pytest.mark.parametrize(
    ("text", "files"),
    [
        # GNU patch patches whichever name exists: both count
        (unified("a/mm/page_alloc.c", "b/Documentation/x.c"), ("mm/page_alloc.c", "Documentation/x.c")),
        (unified("a/mm/gone.c", "/dev/null", "@@ -1 +0,0 @@\n-x\n"), ("mm/gone.c",)),
        (unified("/dev/null", "b/mm/new.c", "@@ -0,0 +1 @@\n+x\n"), ("mm/new.c",)),
        # the names end at a tab (diff -u's timestamp, git's name with a space)
        (unified("a/mm/x.c\t2026-01-01 00:00:00", "b/mm/x c.c\t"), ("mm/x.c", "mm/x c.c")),
        # an Index: line's name counts beside ---/+++ names -p1 cannot strip
        ("Index: a/mm/ksm.c\n" + unified("ksm.c", "ksm.c"), ("mm/ksm.c",)),
        # a git rename or copy changes both files, with or without a hunk
        (
            "diff --git a/mm/old.c b/mm/new.c\nsimilarity index 100%\nrename from mm/old.c\nrename to mm/new.c\n",
            ("mm/old.c", "mm/new.c"),
        ),
        (
            "diff --git a/mm/a.c b/virt/kvm/a.c\nsimilarity index 90%\ncopy from mm/a.c\ncopy to virt/kvm/a.c\n"
            + unified("a/mm/a.c", "b/virt/kvm/a.c"),
            ("mm/a.c", "virt/kvm/a.c"),
        ),
        # the rename lines count too when the diff --git line says otherwise
        (
            "diff --git a/Documentation/a b/Documentation/b\nrename from mm/a.c\nrename to Documentation/b\n",
            ("Documentation/a", "Documentation/b", "mm/a.c"),
        ),
        # a git binary patch and a mode change: no ---/+++ and no hunk
        (
            "diff --git a/drivers/x.bin b/drivers/x.bin\nindex 1..2 100644\nGIT binary patch\nliteral 5\n"
            "McmZ?l00000\n\nliteral 0\nHcmV?d00001\n\n",
            ("drivers/x.bin",),
        ),
        ("diff --git a/scripts/x.sh b/scripts/x.sh\nold mode 100644\nnew mode 100755\n", ("scripts/x.sh",)),
        # git's quoted names, decoded (octal bytes as UTF-8)
        (f'diff --git "a/{E_ACUTE}" "b/{E_ACUTE}"\n' + unified(f'"a/{E_ACUTE}"', "b/mm/e"), ("mm/é.c", "mm/e")),
        # a removed line that reads like a header is a hunk's line, not a name
        (unified("a/mm/x.c", "b/mm/x.c", "@@ -1,2 +1 @@\n--- /etc/passwd\n-@@ -9 +9 @@\n+b\n"), ("mm/x.c",)),
        # several hunks, no newline at the end, CRLF, a mail's signature
        (
            unified("a/mm/x.c", "b/mm/x.c", "@@ -1 +1 @@\r\n-a\r\n+b\r\n\\ No newline at end of file\n")
            + "@@ -9 +9 @@\n-c\n+d\n-- \n2.39.0\n",
            ("mm/x.c",),
        ),
        # a cover letter's stars, ./ and // in a name
        ("*** SUBJECT HERE ***\n" + unified("a/./mm//x.c", "b/mm/x.c"), ("mm/x.c",)),
        # git's header names and ---/+++ names that differ: all of them
        ("diff --git a/mm/x.c b/mm/x.c\n" + unified("a/mm/y.c", "b/mm/z.c"), ("mm/x.c", "mm/y.c", "mm/z.c")),
    ],
)
def test_every_name_gnu_patch_may_take_counts(text: str, files: tuple[str, ...]) -> None:
    assert patch_files(text) == files


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (HUNK, "a hunk whose header names no file"),
        (unified("a/mm/x.c", "b/mm/x.c") + "some text\n" + HUNK, "line 7: a hunk whose header names no file"),
        (unified("x.c", "x.c"), "a hunk whose header names no file"),
        (unified("a/../../etc/passwd", "b/../../etc/passwd"), "is not a name below the tree's top"),
        (unified("/etc/passwd", "/etc/passwd"), "is an absolute name"),
        (unified('"a/mm/x\\q.c"', "b/mm/x.c"), "a quoted name memqual cannot decode"),
        (unified('"a/mm/x.c', "b/mm/x.c"), "a quoted name with no closing quote"),
        ("diff --git a/mm/a b.c b/mm/a b.c\n", "cannot tell the two names"),
        ("diff --git a/x b/y\nrename from /etc/passwd\nrename to y\n", "is not a name below the tree's top"),
        ("*** a/mm/x.c\n--- b/mm/x.c\n***************\n*** 1 ****\n! a\n--- 1 ----\n! b\n", "a context diff"),
        ("Index: mm/x.c\n1c1\n< a\n---\n> b\n", "a normal or ed diff command"),
        ("  --- a/mm/x.c\n  +++ b/mm/x.c\n  @@ -1 +1 @@\n  -a\n  +b\n", "an indented diff header"),
        (unified("a/mm/x.c", "b/mm/x.c", "@@ -1,3 +1,3 @@\n-a\n+b\n"), "the last hunk is cut short"),
        (unified("a/mm/x.c", "b/mm/x.c", "@@ -1,2 +1,2 @@\n-a\n+b\n=c\n"), "line 6: a hunk cut short"),
        (unified("a/mm/x.c", "b/mm/x.c", "@@ -1 +1 @@\n-a\n-b\n"), "line 5: a hunk longer than"),
        (unified("a/mm/x.c", "b/mm/x.c", "@@ -1 +1 @@ f()\n-a\n+b\n@@ -x +1 @@\n"), "is not a unified hunk header"),
    ],
)
def test_what_memqual_cannot_tell_is_refused(text: str, why: str) -> None:
    with pytest.raises(Unreadable, match=why):
        patch_files(text)


def test_a_patch_memqual_cannot_read_is_one_line_and_exit_2_for_each_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """kernel build and run --patch's scope refuse it before anything is
    fetched or built (run --patch's arms read it as kernel build does)."""
    from memqual.host.cli.kernel import patch_scope_of

    patch = tmp_path / "headless.patch"
    patch.write_text("Subject: [PATCH] x\n\n" + HUNK)
    result = in_process(["kernel", "build", str(tmp_path), "--patch", str(patch)], {}, monkeypatch, capsys)
    line = assert_one_line_error(result, "headless.patch: line 3: a hunk whose header names no file")
    assert "memqual cannot tell which files it changes" in line
    args = argparse.Namespace(kernel_source=[], patch=[str(patch)], only=[], all_scenarios=False, profile="ab")
    with pytest.raises(BadInput, match="a hunk whose header names no file"):
        patch_scope_of(args)


def test_run_patch_qualifies_the_file_the_old_name_changes(tmp_path: Path) -> None:
    """The issue's patch: --- mm/page_alloc.c over +++ Documentation/: not
    "nothing to qualify" but every scenario (mm/page_alloc.c is in no
    row's kernel_paths)."""
    from memqual.host.cli.kernel import patch_scope_of

    patch = tmp_path / "doc.patch"
    patch.write_text(unified("a/mm/page_alloc.c", "b/Documentation/page_alloc.c"))
    args = argparse.Namespace(kernel_source=[], patch=[str(patch)], only=[], all_scenarios=False, profile="ab")
    scope = patch_scope_of(args)
    assert scope.kind == "everything" and scope.files == ("mm/page_alloc.c", "Documentation/page_alloc.c")
    assert "mm/page_alloc.c is in no scenario's kernel_paths" in scope.line()


def test_a_huge_sparse_patch_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """3 GB, sparse: its size is read from the open descriptor, so it is
    one line under an address-space limit where reading it would be
    MemoryError."""
    huge = tmp_path / "huge.patch"
    with open(huge, "wb") as out:
        out.truncate(3 << 30)
    script = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, ({1 << 30}, {1 << 30}))
        from memqual.host.core.errors import BadInput
        from memqual.images.kernel_patches import read_patch
        try:
            read_patch({str(huge)!r})
        except BadInput as exc:
            print(exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-400:]
    assert (
        proc.stdout.strip() == f"--patch {huge}: 3221225472 bytes, more than a patch may have (64 MiB): give one patch"
    )


def test_a_patch_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.patch"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="no such file"):  # not waited on: nothing writes to it
        kernel_patches.read_patch(fifo)


def big_patch(files: int) -> str:
    """A patch of many small files: the most headers a byte."""
    return "".join(unified(f"a/drivers/x/f{n}.c", f"b/drivers/x/f{n}.c") for n in range(files))


def test_listing_a_large_patch_is_linear(tmp_path: Path) -> None:
    """4 MB and 62,500 files: read, listed and scoped in well under a
    second of CPU (31 s when each file was looked up in a list).  CPU
    time: the machine's other load does not count."""
    from memqual.host.cli.kernel import patch_scope_of

    patch = tmp_path / "big.patch"
    patch.write_text(big_patch(62_500))
    assert patch.stat().st_size > 4 << 20
    args = argparse.Namespace(kernel_source=[], patch=[str(patch)], only=[], all_scenarios=False, profile="ab")
    begun = time.process_time()
    assert len(kernel_patches.read_patch(patch).files) == 62_500
    listed = time.process_time() - begun
    scope = patch_scope_of(args)
    scoped = time.process_time() - begun - listed
    assert scope.kind == "everything" and len(scope.files) == 62_500
    assert listed < 1.0 and scoped < 1.5, (listed, scoped)

"""A kernel tree's copy for an incremental build: sources hard-linked,
build outputs copied with their times.

Run by the build user, never by root: ``python3 -I -S - BASE DEST STAMP``
with this file on stdin (images/kernel_build.py); standard library only.

A regular file no newer than STAMP (made when the base's source was
unpacked, before its first build step) is a source: it is linked, and made
read-only first (the base's file too: it is the same inode), so that a
build writing into it in place fails instead of changing the base.  GNU
patch writes a new file and renames it over the old one, so patching a
linked source breaks the link and leaves the base as it was.  Everything
newer (objects, generated headers, .config, the host tools) is copied with
its times, so make finds the copy exactly as up to date as the base.
Symbolic links are copied as links; anything else is left out.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys


def copy_tree(base: str, dest: str, stamp_ns: int) -> tuple[int, int, int]:
    """BASE's tree as DEST (which must not exist): (files linked, files
    copied, bytes copied)."""
    linked = copied = copied_bytes = 0
    os.mkdir(dest, 0o755)
    for root, dirs, files in os.walk(base):
        rel = os.path.relpath(root, base)
        target = dest if rel == "." else os.path.join(dest, rel)
        for name in list(dirs):
            path = os.path.join(root, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), os.path.join(target, name))
                dirs.remove(name)
            else:
                os.mkdir(os.path.join(target, name), 0o755)
        for name in files:
            path, out = os.path.join(root, name), os.path.join(target, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(path), out)
            elif not stat.S_ISREG(st.st_mode):
                continue
            elif st.st_mtime_ns <= stamp_ns:
                if st.st_mode & 0o222:
                    os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o222)
                os.link(path, out)
                linked += 1
            else:
                shutil.copy2(path, out, follow_symlinks=False)
                copied += 1
                copied_bytes += st.st_size
    return linked, copied, copied_bytes


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: tree_copy.py BASE DEST STAMP", file=sys.stderr)
        return 2
    base, dest, stamp = argv
    linked, copied, size = copy_tree(base, dest, os.stat(stamp).st_mtime_ns)
    print(f"linked {linked} copied {copied} bytes {size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The patches of a kernel build: ``read_patch`` (its subject, the files it
touches as images/patch_files.py reads them, its hash), ``apply_patch`` as the build user with a failure named
by file and hunk, and which patches can change the config."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput
from memqual.images import unprivileged
from memqual.images.built_kernels import PatchRecord
from memqual.images.kernel_env import STEP_TIMEOUT_S
from memqual.images.patch_files import Unreadable, patch_files

PATCH_LIMIT = 64 << 20
# What a patch may touch that changes the config the fragments give:
# Kconfig files, what they run (scripts/) and the defconfigs.
CONFIG_INPUTS = re.compile(r"(^|/)Kconfig[^/]*$|^scripts/|/configs/")


@dataclasses.dataclass(frozen=True)
class Patch:
    path: Path
    data: bytes = dataclasses.field(repr=False)
    sha256: str
    subject: str
    files: tuple[str, ...]

    def record(self) -> PatchRecord:
        return PatchRecord(str(self.path), self.sha256, self.subject, self.files)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_patch(path: str | os.PathLike[str]) -> Patch:
    """A patch file, with its subject line, the files it touches and its hash."""
    file = Path(path)
    if not file.is_file():
        raise BadInput(f"--patch {file}: no such file: give a patch (git format-patch or diff -u output)")
    try:
        data = bounded.read_file(file, PATCH_LIMIT, "patch", "give one patch")
    except BadInput as exc:
        raise BadInput(f"--patch {exc}") from None
    text = data.decode(errors="replace")
    try:
        files = patch_files(text)
    except Unreadable as exc:
        raise BadInput(f"--patch {file}: {exc}: memqual cannot tell which files it changes") from None
    if not files:
        raise BadInput(
            f"--patch {file}: no unified diff in it (no ---/+++ lines): give git format-patch or diff -u output"
        )
    return Patch(file.resolve(), data, _sha256(data), patch_subject(text, file.name), files)


def patch_subject(text: str, fallback: str) -> str:
    """The Subject of a ``git format-patch`` mail (continuation lines
    joined), else the first non-diff line, else the file's name."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Subject:"):
            subject = line.removeprefix("Subject:").strip()
            for more in lines[index + 1 :]:
                if not more.startswith((" ", "\t")):
                    break
                subject += " " + more.strip()
            return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
        if line.startswith(("diff ", "--- ", "Index: ")):
            break
    first = next((line.strip() for line in lines if line.strip()), "")
    return first if first and not first.startswith(("diff ", "--- ")) else fallback


def config_touched(patches: Sequence[Patch]) -> list[str]:
    """The files of ``patches`` that can change what the config step
    gives (CONFIG_INPUTS); none, and a patched build keeps its base's
    .config instead of assembling it again."""
    return [f for p in patches for f in p.files if CONFIG_INPUTS.search(f)]


def apply_patch(user: unprivileged.BuildUser, folder: Path, patch: Patch, tree: str = "linux") -> None:
    """``patch -p1`` as the build user in ``folder``/``tree``; a patch that
    does not apply is one line naming the file and the hunk."""
    proc = unprivileged.run(
        user,
        # --read-only=ignore: a copy of a base tree has its sources read-only
        # (linked); patch writes a new file and renames it, the base's stays
        ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "--reject-file=-", "--read-only=ignore"],
        folder / tree,
        folder / "home",
        stdin=patch.data,
        timeout=STEP_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise BadInput(f"--patch {patch.path.name} does not apply: {patch_failure(proc.stdout + proc.stderr)}")


def patch_failure(output: str) -> str:
    """The first failure in GNU patch's output: the file and the hunk."""
    current = "?"
    for line in output.splitlines():
        file = re.match(r"(?:patching|checking) file (.+)", line)
        if file:
            current = file.group(1).strip("'\"")
            continue
        hunk = re.match(r"Hunk #(\d+) FAILED at (\d+)", line)
        if hunk:
            return f"{current} hunk #{hunk.group(1)} (at line {hunk.group(2)}) fails"
        if "can't find file to patch" in line or "No file to patch" in line:
            return f"{current}: the file to patch is not in the tree"
        if "Reversed (or previously applied) patch detected" in line:
            return f"{current}: already applied (reversed patch detected)"
        if "Only garbage was found" in line or "malformed patch" in line:
            return f"not a patch ({line.strip()})"
        if "Invalid file name" in line or "is not a directory" in line or "symbolic link" in line:
            return f"{current}: {line.strip()}"
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "patch failed"

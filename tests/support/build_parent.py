"""A build parent for tests that run builds through the real privilege
drop: a fresh root-owned 0711 folder the build user can pass through (a
test's tmp_path is root's 0700), named by $MEMQUAL_KBUILD_DIR, the build
user the default one; what the builds left removed after."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from memqual.images import kernel_env, unprivileged


@contextmanager
def build_parent(monkeypatch: pytest.MonkeyPatch, prefix: str) -> Iterator[Path]:
    outer = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        os.chmod(outer, 0o711)
        monkeypatch.setenv(kernel_env.BUILD_PARENT_ENV, str(outer / "kbuild"))
        monkeypatch.delenv(unprivileged.BUILD_USER_ENV, raising=False)
        yield outer / "kbuild"
    finally:
        user = unprivileged.build_user()
        for folder in (outer / "kbuild").glob("*"):
            unprivileged.remove_folder(user, folder)
        shutil.rmtree(outer)

"""A /dev/kvm program of guest/ (kvm_lookup.c, kvm_slots.c) built here as
images/agents.py builds it, with a test's own -D defines, and run to its
end: what the tests of the programs L1 runs share."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from memqual.images import agents


def build(name: str, directory: Path, binary: str, *defines: str) -> str:
    """guest/<name>.c built static into ``directory``/``binary``; a skip
    where there is no gcc."""
    if shutil.which("gcc") is None:
        pytest.skip(f"gcc is needed to build guest/{name}.c")
    out = directory / binary
    source = agents.GUEST_DIR / f"{name}.c"
    subprocess.run(["gcc", *agents.CFLAGS, *defines, "-o", str(out), str(source)], check=True, timeout=120)
    return str(out)


def call(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def program_fixture(name: str) -> Any:
    """A module's fixture of guest/<name>.c, built once for the module:
    ``program = guest_program.program_fixture("kvm_slots")``."""

    @pytest.fixture(scope="module")
    def program(tmp_path_factory: pytest.TempPathFactory) -> str:
        return build(name, tmp_path_factory.mktemp(name), name)

    return program

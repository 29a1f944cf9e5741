"""Hand-assembled guest code read back by objdump, for the tests that check
it against the instructions its comments document."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")


def instructions(code: bytes, workdir: Path) -> list[str]:
    """The instructions of ``code`` (32-bit x86, Intel syntax), one string
    each as objdump prints it: mnemonic and operands, no address or bytes."""
    blob = workdir / "code.bin"
    blob.write_bytes(code)
    out = subprocess.run(
        ["objdump", "-D", "-b", "binary", "-m", "i386", "-M", "intel", str(blob)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # An instruction line is "address:\tbytes\tinstruction"; the rest is headers.
    return [line.split("\t")[2] for line in out.splitlines() if line.count("\t") >= 2]

"""A ``memqual`` start builds the parser, which imports every command module:
the heavy packages wait inside the functions that need them (CONTRIBUTING.md,
"A new command": a ``# lazy:`` import only for 15 ms or more)."""

from __future__ import annotations

import json
import subprocess
import sys

from memqual.host.core.paths import REPO_ROOT

HEAVY = ("scipy", "numpy", "rich", "jinja2", "avocado", "matplotlib", "paramiko", "cryptography", "jsonschema")


def _loaded_after_the_parser(*then: str) -> list[str]:
    """The heavy packages a fresh interpreter holds once build_parser() has
    run (and then ``then`` imported)."""
    code = (
        "import json, sys\n"
        "from memqual.host.cli.main import build_parser\n"
        "build_parser()\n" + "".join(f"import {name}\n" for name in then) + f"heavy = {HEAVY!r}\n"
        "print(json.dumps([h for h in heavy if h in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=True
    )
    return json.loads(done.stdout)


def test_the_probe_sees_a_heavy_import() -> None:
    assert _loaded_after_the_parser("numpy") == ["numpy"]


def test_building_the_parser_loads_no_heavy_package() -> None:
    assert _loaded_after_the_parser() == []

"""No e2e test is silently left undiscovered: ``avocado list e2e/`` must name
every ``test_*`` method of every class in e2e/*.py (found here by reading
the source, inherited methods included).  Avocado's discovery is static
and drops, without a word, a class whose base it cannot resolve unless the
class says ``:avocado: enable``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from memqual.host.core.paths import REPO_ROOT

E2E = REPO_ROOT / "e2e"
AVOCADO = Path(sys.executable).with_name("avocado")


def source_tests() -> set[str]:
    """'e2e/file.py:Class.test_x' for every test method in the source."""
    classes: dict[str, tuple[list[str], set[str]]] = {}  # name -> (bases, own tests)
    where: dict[str, list[str]] = {}  # class name -> files defining it
    for path in sorted(E2E.glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                bases = [
                    b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                    for b in node.bases
                ]
                tests = {
                    f.name
                    for f in node.body
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")
                }
                key = f"{path.name}:{node.name}"
                classes[key] = (bases, tests)
                where.setdefault(node.name, []).append(key)

    def all_tests(key: str, seen: frozenset[str] = frozenset()) -> set[str]:
        bases, tests = classes[key]
        found = set(tests)
        for base in bases:
            # a base defined in e2e/ (same file first) contributes its tests
            candidates = where.get(base, [])
            same_file = [c for c in candidates if c.split(":")[0] == key.split(":")[0]]
            for parent in (same_file or candidates)[:1]:
                if parent not in seen:
                    found |= all_tests(parent, seen | {key})
        return found

    return {f"e2e/{key}.{test}" for key in classes for test in all_tests(key)}


def avocado_tests() -> set[str]:
    out = subprocess.run(
        [str(AVOCADO), "list", "e2e/"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("e2e/"):
            found.add(parts[1])
    return found


def test_the_source_scan_finds_tests() -> None:
    # guards against a scan that finds nothing and so "agrees" with anything
    assert "e2e/test_boot.py:Boot.test_ssh_echo_memory_cpus_drivers" in source_tests()


@pytest.mark.skipif(not AVOCADO.exists(), reason="avocado is not installed in this virtualenv (pip install -e .)")
def test_avocado_lists_every_test_method_in_e2e() -> None:
    expected = source_tests()
    listed = avocado_tests()
    missing = sorted(expected - listed)
    assert not missing, (
        "avocado does not discover these (add ':avocado: enable' to the class docstring, "
        f"or make its base class resolvable): {missing}"
    )
    assert not sorted(listed - expected), "avocado lists tests the source scan does not see"

"""A scenario is one row: its name is a literal only in its own subject
(host/<subject>/, its e2e files).  The judge, the reports, the run, the
commands, core, images/ and lab/ read what they need of a scenario from
the table (host/core/scenario.py), so a new scenario touches none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from memqual.host.core import scenario
from memqual.host.core.paths import REPO_ROOT


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants: words, not literals the code uses."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def literals(path: Path, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of each string constant of ``path`` that is one of ``names``."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
        if id(node) not in docs
    ]


def owner(path: Path) -> str:
    """The subject a file belongs to ("" for none): host/<subject>/ or
    host/<subject>.py, and e2e/test_<subject>*.py."""
    relative = path.relative_to(REPO_ROOT)
    subjects = {row.subject for row in scenario.table()}
    if relative.parts[0] == "host":
        top = relative.parts[1].removesuffix(".py")
        return top if top in subjects else ""
    if relative.parts[0] == "e2e":
        return next((s for s in sorted(subjects) if relative.stem.startswith(f"test_{s}")), "")
    return ""


def code_files() -> list[Path]:
    return sorted(p for top in ("host", "e2e", "images", "lab") for p in (REPO_ROOT / top).rglob("*.py"))


def test_no_scenario_is_named_outside_its_subject() -> None:
    rows = {row.name: row for row in scenario.table()}
    names = frozenset(rows)
    strays = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {name}"
        for path in code_files()
        for line, name in literals(path, names)
        if owner(path) != rows[name].subject
    ]
    assert not strays, "read these from the scenario table (host/core/scenario.py):\n" + "\n".join(strays)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('X = "ksm.merge"\n', [(1, "ksm.merge")]),
        ('def f():\n    """ksm.merge is one."""\n    return "ksm.merge"\n', [(3, "ksm.merge")]),
        ('"""ksm.merge, in words"""\n', []),
        ('X = "ksm.merged"\n', []),
    ],
)
def test_a_literal_is_found_and_a_docstring_is_not(tmp_path: Path, text: str, found: list[tuple[int, str]]) -> None:
    path = tmp_path / "m.py"
    path.write_text(text)
    assert literals(path, frozenset({"ksm.merge"})) == found


def test_a_file_s_subject_is_its_folder_or_its_e2e_file_s_name() -> None:
    assert owner(REPO_ROOT / "host" / "ksm" / "table.py") == "ksm"
    assert owner(REPO_ROOT / "host" / "virtio_mem.py") == "virtio_mem"
    assert owner(REPO_ROOT / "e2e" / "test_balloon_driver.py") == "balloon"
    assert owner(REPO_ROOT / "host" / "judge" / "regime.py") == ""
    assert owner(REPO_ROOT / "lab" / "block_spread.py") == ""

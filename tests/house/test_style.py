"""The style rules no tool checks: a type checker's silence is allowed only
with its reason beside it, and a module's docstring is at most ten lines;
a module over 600 lines is a warning."""

from __future__ import annotations

import ast
import os
import re
import warnings
from pathlib import Path

from memqual.host.core.paths import REPO_ROOT

# Built from parts so that this file does not match itself.
IGNORE = re.compile(r"#\s*type" + r":\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def _unexplained(text: str) -> list[int]:
    """Line numbers of ignores without codes or without a ``# why`` after them."""
    bad = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = IGNORE.search(line)
        if match and not (match["codes"] and re.match(r"\s+#\s*\S", match["rest"])):
            bad.append(number)
    return bad


def test_the_rule_itself() -> None:
    ignore = "# type" + ": ignore"
    assert _unexplained(f"x = f()  {ignore}[arg-type]  # a fake on purpose") == []
    assert _unexplained(f"x = f()  {ignore}[arg-type]") == [1]
    assert _unexplained(f"x = f()  {ignore}  # no code") == [1]


def test_every_type_ignore_says_why() -> None:
    found = {
        str(path.relative_to(REPO_ROOT)): lines
        for top in ("host", "images", "e2e", "lab", "tests")
        for path in sorted((REPO_ROOT / top).rglob("*.py"))
        if (lines := _unexplained(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"give each its reason after it (# type: ignore[code]  # why): {found}"


# A module's docstring says what it holds; the reasons are in docs/architecture.md, "Module notes"
# (docs/lab.md for the lab's tools).
MODULE_DOCSTRING_LINES = 10
# None over the limit; a module added here must be shortened soon.
LONG_DOCSTRING_ALLOWED: set[str] = set()


def _docstring_lines(text: str) -> int:
    doc = ast.get_docstring(ast.parse(text), clean=False)
    return 0 if doc is None else len(doc.strip("\n").splitlines())


def test_the_docstring_rule_itself() -> None:
    assert _docstring_lines('"""One line."""\n') == 1
    assert _docstring_lines('"""A\n\nB\nC\n"""\nx = 1\n') == 4
    assert _docstring_lines("x = 1\n") == 0


def test_every_module_docstring_is_at_most_ten_lines() -> None:
    long = {
        rel: n
        for top in ("host", "images", "e2e", "lab")
        for path in sorted((REPO_ROOT / top).rglob("*.py"))
        if (rel := str(path.relative_to(REPO_ROOT))) not in LONG_DOCSTRING_ALLOWED
        and (n := _docstring_lines(path.read_text(encoding="utf-8"))) > MODULE_DOCSTRING_LINES
    }
    stale = {rel for rel in LONG_DOCSTRING_ALLOWED if _docstring_lines((REPO_ROOT / rel).read_text()) <= 10}
    assert not stale, f"now short: take them off LONG_DOCSTRING_ALLOWED: {stale}"
    assert long == {}, f"say what the module holds in {MODULE_DOCSTRING_LINES} lines; reasons go to docs/: {long}"


# One module per job.  What the house enforces is a function's complexity
# (ruff's C901, at most 15 paths: pyproject.toml); a module's length is a
# hint only, warned of past this many lines: a long module that holds one
# idea in short functions is not split for its length alone.
MODULE_LINES = 600
PACKAGE = REPO_ROOT / "src" / "memqual"


def test_a_module_over_600_lines_is_a_warning() -> None:
    # Through src/memqual/'s links (followed): every folder the package holds.
    modules = sorted(
        Path(top) / name
        for top, _, names in os.walk(PACKAGE, followlinks=True)
        for name in names
        if name.endswith(".py")
    )
    assert len(modules) > 100, f"found only {len(modules)} modules under {PACKAGE}: the links moved?"
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in modules
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    }
    if long:
        warnings.warn(f"modules over {MODULE_LINES} lines (one job each? split by idea if not): {long}", stacklevel=1)

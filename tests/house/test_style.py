"""The style gates' one rule that no tool checks: a type checker's silence
is allowed only with its reason beside it."""

from __future__ import annotations

import re

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
        for top in ("host", "images", "e2e", "tests")
        for path in sorted((REPO_ROOT / top).rglob("*.py"))
        if (lines := _unexplained(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"give each its reason after it (# type: ignore[code]  # why): {found}"

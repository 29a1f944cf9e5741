"""No hand-written polling loop: a loop that sleeps belongs in
host/core/polling.py (``poll``, ``poll_async``), which gives every wait a
deadline, a fake-able clock and the seconds and polls it took.

Read from the source with ast: a ``for`` or ``while`` loop of host/,
images/ or e2e/ whose body calls anything named ``sleep`` (``time.sleep``,
``asyncio.sleep``, an injected ``sleep``, ``self.sleep``) is a polling loop,
unless the allow-list below names it with the reason it is not a poll.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("host", "images", "e2e")
POLL_MODULE = Path("host/core/polling.py")

# (file, function) of loops that sleep and are not polls, each with why.
# Delete an entry once its loop is gone.
ALLOWED: dict[tuple[str, str], str] = {}


def _calls_sleep(node: ast.AST) -> bool:
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "sleep":
                return True
    return False


def sleeping_loops(path: Path) -> Iterator[tuple[str, int]]:
    """(enclosing function, line) of each outermost loop that sleeps."""
    tree = ast.parse(path.read_text(), str(path))

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, child.name)
            elif isinstance(child, ast.For | ast.AsyncFor | ast.While) and _calls_sleep(child):
                yield function, child.lineno
            else:
                yield from visit(child, function)

    yield from visit(tree, "<module>")


def found(root: Path = ROOT) -> dict[tuple[str, str], list[int]]:
    loops: dict[tuple[str, str], list[int]] = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root)
            if relative == POLL_MODULE:
                continue
            for function, line in sleeping_loops(path):
                loops.setdefault((str(relative), function), []).append(line)
    return loops


def test_no_hand_written_polling_loop() -> None:
    loops = found()
    unexpected = sorted(
        f"{file}:{lines[0]} in {function}"
        for (file, function), lines in loops.items()
        if (file, function) not in ALLOWED
    )
    assert unexpected == [], f"a loop that sleeps is a poll: use memqual.host.core.polling.poll: {unexpected}"


def test_the_allow_list_holds_only_what_still_exists() -> None:
    stale = sorted(set(ALLOWED) - set(found()))
    assert stale == [], f"delete from ALLOWED: {stale}"


def test_the_checker_finds_loops_that_sleep(tmp_path: Path) -> None:
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "m.py").write_text(
        textwrap.dedent(
            """\
            import asyncio, time

            def waits(ready):
                while not ready():
                    time.sleep(0.1)

            async def waits_async(ready, sleep=asyncio.sleep):
                for _ in range(10):
                    if ready():
                        break
                    await sleep(0.1)

            class C:
                def method(self, ready):
                    while True:
                        if ready():
                            return
                        self.sleep(0.05)

            def measures():
                time.sleep(1.0)  # a measurement window: no loop, no poll

            def reads(lines):
                for line in lines:  # a loop that never sleeps
                    print(line)
            """
        )
    )
    assert found(tmp_path) == {
        ("host/m.py", "waits"): [4],
        ("host/m.py", "waits_async"): [8],
        ("host/m.py", "method"): [15],
    }

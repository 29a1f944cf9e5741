"""The house rules of host/, images/ and lab/.

The import-linter contracts of pyproject.toml hold, each fails on an
import planted against it, and they name every room and subject; then,
from the source with ast: no import cycle, no private name imported across
modules, no package that re-exports (an __init__ is its docstring alone),
nothing reaches into a machine's underscored attributes, and only
host/cli/ and lab/'s tools use argparse.  A lazy import or one under TYPE_CHECKING counts.
docs/architecture.md, "How the folders fit together"."""

from __future__ import annotations

import ast
import copy
import functools
import re
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import api
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("host", "images", "lab")

# Cycles that exist today, each to be removed by the work that owns its
# modules; a cycle is allowed only while its modules are a subset of one
# of these.  Delete an entry once its cycle is gone.
ALLOWED_CYCLES: tuple[frozenset[str], ...] = ()

# Private names other modules import today, each to be removed by the work
# that owns the importing module.  (importing module, "module._name").
# Delete an entry once it is gone.
ALLOWED_PRIVATE_IMPORTS: frozenset[tuple[str, str]] = frozenset()


def module_name(path: Path) -> str:
    """The name a file of host/, images/, lab/ or e2e/ is imported by (src/memqual/
    links those folders under one package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["memqual", *parts])


def project_modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(p): p for package in packages for p in sorted((ROOT / package).rglob("*.py"))}


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones too (under ``if TYPE_CHECKING`` too)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, None) or ():
                # except handlers and match cases hold statements in .body
                yield from _statements([child] if isinstance(child, ast.stmt) else child.body)


def _absolute(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for each import of a
    project module by ``name``."""
    for node in _statements(_parse(path).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(name, path, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    yield submodule, None, node.lineno
                elif source in modules:
                    yield source, alias.name, node.lineno


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: {target for target, _, _ in imports(name, path, modules)} - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module
    (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def private_imports(modules: dict[str, Path]) -> set[tuple[str, str, int]]:
    """(importing module, "module._name", line) for every private name of
    another project module that a module imports or reaches into."""
    found = set()
    for name, path in modules.items():
        bound: dict[str, str] = {}  # local name -> project module
        for target, imported, line in imports(name, path, modules):
            if imported is not None and imported.startswith("_") and not imported.startswith("__"):
                found.add((name, f"{target}.{imported}", line))
        tree = _parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        bound[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(name, path, node)
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and bound[node.value.id] != name
            ):
                found.add((name, f"{bound[node.value.id]}.{node.attr}", node.lineno))
    return found


# --- the import contracts (pyproject.toml, [tool.importlinter]) --------------------
CONTRACT_TYPES: dict[str, type[Contract]] = {
    "layers": LayersContract,
    "independence": IndependenceContract,
    "forbidden": ForbiddenContract,
}
# all of host/ that images/ may use
CORE_BASE = frozenset({"errors", "paths", "trust", "leftovers", "locks", "polling", "settings", "printable", "bounded"})


def _declared_subjects() -> frozenset[str]:
    """The subjects are the names of the scenario table's entry points
    (pyproject.toml, ``memqual.scenarios``): named there once."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return frozenset(project["entry-points"]["memqual.scenarios"])


SUBJECTS = _declared_subjects()
ROOMS = frozenset({"core", "judge", "report", "run", "cli"}) | SUBJECTS


@functools.cache
def _configuration() -> Any:
    return api.read_configuration(str(ROOT / "pyproject.toml"))


def _contract_options(contract_id: str) -> dict[str, Any]:
    (options,) = [o for o in _configuration()["contracts_options"] if o["id"] == contract_id]
    return dict(options)


def _contracts() -> dict[str, Contract]:
    config = _configuration()
    return {
        options["id"]: CONTRACT_TYPES[options["type"]](
            name=options["name"],
            session_options=config["session_options"],
            contract_options={k: v for k, v in options.items() if k not in ("id", "name", "type")},
        )
        for options in config["contracts_options"]
    }


@functools.cache
def _graph() -> grimp.ImportGraph:
    # scipy, jinja2, matplotlib too: the contracts that keep statistics in
    # judge and pages in report name them.
    return grimp.build_graph("memqual", cache_dir=None, include_external_packages=True)


def _kept(planted: tuple[str, str] | None = None) -> dict[str, bool]:
    """Each contract's verdict on the code, with one more import planted."""
    graph = copy.deepcopy(_graph())
    if planted:
        graph.add_import(importer=planted[0], imported=planted[1], line_number=1, line_contents="planted")
    return {cid: contract.check(copy.deepcopy(graph), verbose=False).kept for cid, contract in _contracts().items()}


def test_the_import_contracts_hold() -> None:
    kept = _kept()
    assert set(kept) >= {
        "host-rooms",
        "core-inside",
        "images-beside-core",
        "core-base-below-images",
        "reports-import-no-subject",
        "statistics-only-in-judge",
        "pages-only-in-report",
        "lab-outside-the-product",
    }
    assert all(kept.values()), kept


@pytest.mark.parametrize(
    ("importer", "imported", "broken"),
    [
        # the probe reaching a subject: every subject reaches that one through the machine
        ("memqual.host.core.probe", "memqual.host.ksm.sysfs", {"host-rooms"}),
        ("memqual.host.core.snapshot", "memqual.host.core.machine", {"core-inside"}),
        ("memqual.host.judge.results", "memqual.host.run.job", {"host-rooms"}),
        ("memqual.host.judge.history", "memqual.host.report.html", {"host-rooms"}),
        ("memqual.host.report.export", "memqual.host.cli.args", {"host-rooms"}),
        ("memqual.host.balloon.measure", "memqual.host.cli.args", {"host-rooms"}),
        ("memqual.host.balloon.measure", "memqual.host.memslots.layout", {"host-rooms"}),
        # through a third subject: independent siblings may not reach each other at all
        ("memqual.host.hugetlbfs.pool", "memqual.host.ksm.sysfs", {"host-rooms"}),
        ("memqual.images.build", "memqual.host.core.machine", {"images-beside-core"}),
        ("memqual.images.build", "memqual.host.cli.args", {"images-beside-core"}),
        ("memqual.host.core.paths", "memqual.images.build", {"core-base-below-images"}),
        ("memqual.host.report.report", "memqual.host.balloon.table", {"reports-import-no-subject"}),
        # statistics in judge alone: not in core, a subject, the run or the pages
        ("memqual.host.core.descriptive", "scipy", {"statistics-only-in-judge"}),
        ("memqual.host.ksm.volatile", "scipy", {"statistics-only-in-judge"}),
        ("memqual.host.run.ab_run", "scipy", {"statistics-only-in-judge"}),
        ("memqual.host.report.balloon_curve", "scipy", {"statistics-only-in-judge"}),
        # pages in report alone: the run, the judge and core render none
        ("memqual.host.run.ab_run", "jinja2", {"pages-only-in-report"}),
        ("memqual.host.judge.comparison", "markupsafe", {"pages-only-in-report"}),
        ("memqual.host.core.machine", "matplotlib", {"pages-only-in-report"}),
        # the lab's tools are left out of the wheel: the product may not need them
        ("memqual.host.cli.main", "memqual.lab", {"lab-outside-the-product"}),
        ("memqual.host.judge.primaries", "memqual.lab", {"lab-outside-the-product"}),
        ("memqual.images.build", "memqual.lab", {"lab-outside-the-product"}),
        ("memqual.e2e.base", "memqual.lab", {"lab-outside-the-product"}),
    ],
)
def test_an_import_against_a_contract_breaks_it(importer: str, imported: str, broken: set[str]) -> None:
    kept = _kept((importer, imported))
    assert {cid for cid, ok in kept.items() if not ok} >= broken


def test_host_is_rooms_and_the_contracts_name_them_all() -> None:
    """host/ holds rooms and subjects only, no flat floor of modules;
    host-rooms and core-inside are exhaustive (import-linter checks that
    every room, and every module of core, is in a layer);
    images-beside-core names what images/ must not use one by one, so here:
    every room but core, and every module of core but its base, which is
    what the bottom layer of core-inside holds."""
    host = {p.stem for p in (ROOT / "host").glob("*.py")} - {"__init__"}
    host |= {p.parent.name for p in (ROOT / "host").glob("*/__init__.py")}
    assert host == ROOMS
    rooms = {m.strip() for layer in _contract_options("host-rooms")["layers"] for m in re.split(r"[:|]", layer)}
    assert rooms == ROOMS
    core = {p.stem for p in (ROOT / "host" / "core").glob("*.py")} - {"__init__"}
    options = _contract_options("images-beside-core")
    assert options["source_modules"] == ["memqual.images"]
    assert set(options["forbidden_modules"]) == {f"memqual.host.{r}" for r in ROOMS - {"core"}} | {
        f"memqual.host.core.{m}" for m in core - CORE_BASE
    }
    assert set(_contract_options("core-base-below-images")["source_modules"]) == {
        f"memqual.host.core.{m}" for m in CORE_BASE
    }
    bottom = _contract_options("core-inside")["layers"][-1]
    assert {m.strip() for m in bottom.split(":")} == CORE_BASE


def test_the_contracts_name_exactly_the_declared_subjects() -> None:
    """A subject is declared once, by its scenario rows' entry point; every
    contract that lists subjects lists exactly those, the subjects of the
    scenario table's rows."""
    from memqual.host.core import scenario

    assert {row.subject for row in scenario.table()} == SUBJECTS
    subject_layer = next(
        layer for layer in _contract_options("host-rooms")["layers"] if "|" in layer or layer in SUBJECTS
    )
    assert {m.strip() for m in subject_layer.split("|")} == SUBJECTS
    modules = {f"memqual.host.{s}" for s in SUBJECTS}
    assert set(_contract_options("reports-import-no-subject")["forbidden_modules"]) == modules
    assert modules <= set(_contract_options("images-beside-core")["forbidden_modules"])


def test_the_lab_contract_names_every_folder_of_the_product() -> None:
    """The product is every package src/memqual/ links but lab/: none of
    them may use it, a new one included."""
    code = {p.parent.name for p in (ROOT / "src" / "memqual").glob("*/__init__.py")}
    assert {"host", "images", "e2e", "lab"} <= code
    assert set(_contract_options("lab-outside-the-product")["source_modules"]) == {
        f"memqual.{top}" for top in code - {"lab"}
    }


# Variables an e2e test sets for the child processes it starts (left to that test file).
TEST_OWN_VARIABLES = frozenset(
    {("memqual.e2e.test_cleanup", "MEMQUAL_LEAK_PIDFILE"), ("memqual.e2e.test_cleanup", "MEMQUAL_STATE_DIR")}
)


def test_every_memqual_variable_is_named_in_settings_only() -> None:
    """The MEMQUAL_* environment variables are read through
    memqual.host.core.settings, which names each once."""
    named = sorted(
        f"{name}:{node.lineno} {node.value}"
        for name, path in {**project_modules(), **project_modules(("e2e",))}.items()
        if name != "memqual.host.core.settings"
        for node in ast.walk(_parse(path))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"MEMQUAL_[A-Z_]+", node.value)
        and (name, node.value) not in TEST_OWN_VARIABLES
    )
    assert named == []


def test_only_the_commands_use_argparse() -> None:
    """Domain code is called with typed values; parsing options is the
    commands' room's job (host/cli/), and the lab's tools' (lab/)."""
    users = sorted(
        name
        for name, path in project_modules().items()
        if not name.startswith(("memqual.host.cli.", "memqual.lab."))
        for node in _statements(_parse(path).body)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and "argparse" in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
    )
    assert users == []


# --- the rules ----------------------------------------------------------------------
def test_no_import_cycle_among_host_and_images_modules() -> None:
    modules = project_modules()
    assert "memqual.host.core.machine" in modules and "memqual.images.build" in modules
    unexpected = [
        sorted(c) for c in cycles(import_graph(modules)) if not any(c <= allowed for allowed in ALLOWED_CYCLES)
    ]
    assert unexpected == [], f"import cycles: {unexpected}"


def test_nothing_reaches_into_a_machine() -> None:
    """Start strategies and tools use Machine's public steps, not its
    underscored attributes (``machine._proc``, ``vm._kill()``)."""
    reached = sorted(
        f"{name}:{node.lineno} {node.value.id}.{node.attr}"
        for name, path in project_modules().items()
        if name != "memqual.host.core.machine"
        for node in ast.walk(_parse(path))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("machine", "vm", "guest")
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    )
    assert reached == []


def test_no_module_imports_a_private_name_of_another() -> None:
    modules = {**project_modules(), **project_modules(("e2e",))}
    found = private_imports(modules)
    unexpected = sorted(
        f"{name}:{line} uses {what}" for name, what, line in found if (name, what) not in ALLOWED_PRIVATE_IMPORTS
    )
    assert unexpected == []


def package_bodies(modules: dict[str, Path]) -> list[str]:
    """The packages whose __init__.py holds more than a docstring (an
    import there is a re-export: a caller names the defining module)."""
    found = []
    for name, path in modules.items():
        body = _parse(path).body if path.name == "__init__.py" else []
        docstring = (
            body[:1] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else []
        )
        if body[len(docstring) :]:
            found.append(name)
    return found


def test_a_package_is_its_docstring_alone() -> None:
    assert package_bodies({**project_modules(), **project_modules(("e2e",))}) == []


def test_the_checker_finds_a_package_that_re_exports(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        """
        -- p/__init__.py --
        \"""p.\"""
        from p.a import f as f
        -- q/__init__.py --
        \"""q: its modules, named.\"""
        -- p/a.py --
        def f(): ...
        """,
    )
    assert package_bodies(modules) == ["p"]


def test_the_allow_lists_hold_only_what_still_exists() -> None:
    """An entry whose cycle or private import is gone must be deleted from
    this file (entries of modules not in this checkout are left alone)."""
    modules = {**project_modules(), **project_modules(("e2e",))}
    found = {(name, what) for name, what, _ in private_imports(modules)}
    stale = sorted(entry for entry in ALLOWED_PRIVATE_IMPORTS - found if entry[0] in modules)
    assert stale == [], f"delete from ALLOWED_PRIVATE_IMPORTS: {stale}"
    present = cycles(import_graph(project_modules()))
    gone = [sorted(a) for a in ALLOWED_CYCLES if not any(c <= a for c in present)]
    assert gone == [], f"delete from ALLOWED_CYCLES: {gone}"


# --- the checker itself ---------------------------------------------------------------
def _tree(tmp_path: Path, listing: str) -> dict[str, Path]:
    """Write the files of ``listing`` under tmp_path: each starts at a line
    ``-- path --`` (txtar's form) and runs to the next; their modules."""
    modules = {}
    for header, text in re.findall(r"^-- (\S+) --\n(.*?)(?=^-- |\Z)", textwrap.dedent(listing), re.M | re.S):
        path = tmp_path / header
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        modules[".".join(Path(header).with_suffix("").parts).removesuffix(".__init__")] = path
    return modules


def test_the_checker_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        """\
        -- p/__init__.py --
        -- p/a.py --
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from p import b
        -- p/b.py --
        def f():
            from p.a import x
        -- p/c.py --
        def g():
            import p.d
        -- p/d.py --
        from p import c
        """,
    )
    graph = import_graph(modules)
    assert graph["p.a"] == {"p.b"} and graph["p.b"] == {"p.a"}
    assert sorted(map(sorted, cycles(graph))) == [["p.a", "p.b"], ["p.c", "p.d"]]


def test_the_checker_finds_private_names(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        """\
        -- p/__init__.py --
        -- p/a.py --
        _x = 1
        def _f(): pass
        -- p/b.py --
        from p.a import _x
        -- p/c.py --
        from p import a
        def g():
            return a._f()
        -- p/d.py --
        import argparse
        from p.a import __doc__
        def h(s: argparse._SubParsersAction): pass
        -- p/e.py --
        from .a import _x
        """,
    )
    assert {(n, w) for n, w, _ in private_imports(modules)} == {("p.b", "p.a._x"), ("p.c", "p.a._f"), ("p.e", "p.a._x")}


def test_every_import_of_the_code_goes_through_memqual() -> None:
    """``import host...`` would load a second copy of a module in a checkout
    (so ``except BadInput`` could miss its own error) and fail in a wheel."""
    bare = []
    for top in (*PACKAGES, "e2e", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(_parse(path)):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                bare += [f"{where} {name}" for name in names if name.split(".")[0] in (*PACKAGES, "e2e")]
    assert bare == []

"""The wheel holds everything memqual reads at run time, and an installed
memqual finds it there rather than in a checkout.

The wheel is built once, from a copy of the source tree (a build in place
would leave build/ in the checkout other runs share), without build
isolation so that it needs no network: a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2]
# What the checkout holds that is no input of the build.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".tox", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "memqual-*"
)
CODE = ("host", "images", "e2e")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(SOURCE, src, ignore=NOT_SOURCE)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work), str(src)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (built,) = work.glob("memqual-*.whl")
    return built


@pytest.fixture(scope="module")
def names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_every_module_is_in_the_wheel(names: set[str]) -> None:
    modules = {f"memqual/{p.relative_to(SOURCE)}" for top in CODE for p in (SOURCE / top).rglob("*.py")}
    assert modules
    assert modules - names == set()


def test_the_lab_is_not_in_the_wheel(names: set[str]) -> None:
    # lab/'s tools are run from a checkout; no installed command needs them.
    assert (SOURCE / "lab" / "__init__.py").is_file()
    assert {name for name in names if name.startswith("memqual/lab/")} == set()


def test_the_guest_sources_claims_and_layouts_are_in_the_wheel(names: set[str]) -> None:
    guest = {f"memqual/guest/{p.name}" for p in (SOURCE / "guest").iterdir() if p.is_file()}
    layouts = {f"memqual/{p.relative_to(SOURCE)}" for p in (SOURCE / "host" / "memslots" / "layouts").glob("*.json")}
    assert guest and layouts
    assert {"memqual/claims/claims.json", *guest, *layouts} - names == set()


def test_the_results_and_record_schemas_are_in_the_wheel(names: set[str], wheel: Path) -> None:
    # load_results and record.load validate against these at run time.
    assert {
        "memqual/host/judge/results.schema.json",
        "memqual/host/core/record.schema.json",
        "memqual/host/judge/claims/claims.schema.json",
    } <= names
    with zipfile.ZipFile(wheel) as archive:
        shipped = json.loads(archive.read("memqual/host/judge/results.schema.json"))
    assert shipped == json.loads((SOURCE / "host" / "judge" / "results.schema.json").read_text())


def test_memqual_is_the_only_top_level_name(names: set[str]) -> None:
    # host/, images/, e2e/, guest/ and claims/ as top-level names would
    # collide with other distributions' in site-packages.
    tops = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"memqual"}


def test_the_memqual_command_is_the_cli(names: set[str], wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "memqual = memqual.host.cli.main:main" in archive.read(entry_points).decode().splitlines()


def test_an_unpacked_wheel_reads_its_own_data(wheel: Path, tmp_path: Path) -> None:
    """Imported from the wheel's contents (not the checkout), the code finds
    claims.json and the guest sources among them."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    # memqual.host.judge.claims itself imports the statistics (seconds): its constant is
    # shipped("claims") / "claims.json", checked here without it.
    probe = (
        "import json; from memqual.host.core.paths import shipped;"
        " from memqual.images import agents, balloon_driver, build;"
        "print(json.dumps([str(shipped('claims') / 'claims.json'), str(agents.GUEST_DIR), str(build.GUEST_DIR),"
        " str(balloon_driver.PATCH), agents.available()]))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60
    )
    claims_file, agents_dir, build_dir, patch, available = json.loads(out.stdout)
    for path in (claims_file, agents_dir, build_dir, patch):
        assert Path(path).is_relative_to(site / "memqual"), path
        assert Path(path).exists(), path
    assert available == sorted(p.stem for p in (SOURCE / "guest").glob("*.c"))
    assert json.loads(Path(claims_file).read_text())


def test_only_memqual_imports_from_the_installed_environment(tmp_path: Path) -> None:
    """The editable install puts src/ on sys.path, which holds memqual alone:
    the checkout's folders do not import under their bare names."""
    names = ("memqual", "host", "images", "e2e", "lab", "tests", "guest", "claims")
    probe = f"import importlib.util, json; print(json.dumps([n for n in {names!r} if importlib.util.find_spec(n)]))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == ["memqual"]


def test_the_page_templates_are_in_the_wheel_and_pages_render_from_them(
    names: set[str], wheel: Path, tmp_path: Path
) -> None:
    templates = {f"memqual/{p.relative_to(SOURCE)}" for p in (SOURCE / "host" / "report" / "templates").iterdir()}
    assert {"memqual/host/report/templates/memqual.css", "memqual/host/report/templates/base.html.j2"} <= templates
    assert templates - names == set()
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    probe = (
        "import json; from memqual.host.report import pages; from memqual.host.report import fleet_page as page;"
        "print(json.dumps([pages.environment().get_template('fleet.html.j2').filename,"
        " page.render(page.Fleet(columns=()))]))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60
    )
    template, html = json.loads(out.stdout)
    assert Path(template).is_relative_to(site / "memqual"), template
    assert "memqual: 0 lab hosts" in html
    assert (SOURCE / "host" / "report" / "templates" / "memqual.css").read_text() in html  # inlined, as it is


def test_the_balloon_driver_build_imports_on_the_standard_library_alone() -> None:
    # ./setup builds the driver with `python -S` while pip installs: nothing
    # it imports may need a package from site-packages.
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import memqual.images.balloon_driver"],
        env={"PYTHONPATH": str(src), "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr

"""The scenario table (host/core/scenario.py): the rows the subjects
declare through entry points, read by profiles, the knob restore and the
judge (each row's primaries, control and regime)."""

from __future__ import annotations

import dataclasses
import re
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from memqual.host.core import knobs, profiles, scenario
from memqual.host.core.primary import Primary, Regime
from memqual.host.core.scenario import Scenario
from memqual.host.judge import primaries
from memqual.host.ksm.state import KNOBS as KSM_KNOBS


@dataclasses.dataclass(frozen=True)
class Row:
    n: int


SIZES = {profiles.QUICK: Row(1), profiles.FULL: Row(5), profiles.AB: Row(2)}


def test_a_row_gives_its_sizes_in_the_run_s_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    row = Scenario("subject.thing", ("subject",), SIZES)
    monkeypatch.setenv(profiles.ENV_PROFILE, "full")
    assert row.sizes_for().n == 5
    monkeypatch.setenv(profiles.ENV_PROFILE, "ab")
    assert row.sizes_for().n == 2 and row.sizes_for(profiles.QUICK).n == 1
    assert row.subject == "subject"


def test_a_row_may_size_a_profile_otherwise_on_the_icount_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    from memqual.host.balloon.table import INFLATE

    row = Scenario("subject.thing", sizes=SIZES, icount_sizes={profiles.AB: Row(9)})
    assert row.sizes_for(profiles.AB, icount=True).n == 9
    assert row.sizes_for(profiles.AB, icount=False).n == 2 and row.sizes_for(profiles.FULL, icount=True).n == 5
    assert INFLATE.sizes_for(profiles.AB, icount=True).repeats == 1
    assert INFLATE.sizes_for(profiles.AB, icount=False).repeats == 3


def test_the_smoke_profile_is_ab_s_sizes_unless_a_row_asks_for_fewer() -> None:
    from memqual.host.balloon.table import INFLATE
    from memqual.host.ksm.table import VOLATILE_SCAN

    row = Scenario("subject.thing", sizes=SIZES)
    assert row.sizes_for(profiles.SMOKE, icount=False) == row.sizes_for(profiles.AB, icount=False)
    assert INFLATE.sizes_for(profiles.SMOKE, icount=False).repeats == 1
    smoke, ab = (VOLATILE_SCAN.sizes_for(p, icount=False) for p in (profiles.SMOKE, profiles.AB))
    assert (smoke.smart_windows, ab.smart_windows) == (1, 3)
    assert dataclasses.replace(smoke, smart_windows=ab.smart_windows) == ab


def test_a_row_must_size_every_profile_and_be_named_by_its_subject() -> None:
    with pytest.raises(ValueError, match="not for"):
        Scenario("subject.thing", sizes={profiles.QUICK: Row(1)})
    with pytest.raises(ValueError, match="subject.scenario"):
        Scenario("thing")


def _points(monkeypatch: pytest.MonkeyPatch, **rows: object) -> None:
    points = [EntryPoint(name, f"x:{name}", scenario.SCENARIOS_GROUP) for name in rows]
    monkeypatch.setattr(scenario, "entry_points", lambda group: points)
    monkeypatch.setattr(EntryPoint, "load", lambda self: rows[self.name])


def test_rows_are_found_through_entry_points_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _points(monkeypatch, a=(Scenario("a.x"), Scenario("a.y", knobs=(KSM_KNOBS,))), b=(Scenario("b.z"),))
    rows = scenario.load()
    assert [r.name for r in rows] == ["a.x", "a.y", "b.z"]
    assert scenario.knob_sets(rows) == (KSM_KNOBS,)
    _points(monkeypatch, a=(Scenario("b.x"),))
    with pytest.raises(ValueError, match="not a a.\\* Scenario"):
        scenario.load()
    _points(monkeypatch, a=(Scenario("a.x"), Scenario("a.x")))
    with pytest.raises(ValueError, match="declared twice"):
        scenario.load()


def test_a_row_s_primaries_and_regime_are_bound_to_it_and_the_judge_finds_them() -> None:
    """A row carries its primaries with their reasons; the judge's roles
    come from the rows and nowhere else."""
    for row in scenario.table():
        for p in row.primaries:
            assert p.scenario == row.name and p.why, (row.name, p.metric)
            variant = dict(p.variant)
            assert primaries.primary_of(row.name, p.metric, variant) is p
            assert primaries.role(row.name, p.metric, variant) == primaries.PRIMARY
            if p.on_host_under_test:
                assert primaries.primary_of(row.name, p.on_host_under_test, variant, host_under_test=True) is p
                assert p.spread_host_under_test is not None, (row.name, p.metric)
        assert row.regime is None or row.regime.scenario == row.name
        assert primaries.is_control(row.name) is row.control
    assert primaries.controls() == {row.name for row in scenario.table() if row.control}
    assert primaries.controls() and scenario.every_primary()
    assert primaries.role("synthetic.none", "m") == primaries.EXPLORATORY


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (lambda: Scenario("a.x", primaries=(Primary("m", "w", scenario="b.y"),)), "b.y's"),
        (lambda: Scenario("a.x", primaries=(Primary("m", "w"), Primary("m", "v"))), "named twice"),
        (
            lambda: Scenario(
                "a.x", primaries=(Primary("m", "w", variant=(("k", 1),)), Primary("m", "v", variant=(("k", 1),)))
            ),
            "named twice",
        ),
        (lambda: Scenario("a.x", primaries=(Primary("m", "w"),), control=True), "negative control"),
        (lambda: Scenario("a.x", regime=Regime("r", "l", "u", 2.0, scenario="b.y")), "b.y's"),
        (lambda: Primary("m", "w", instrument="a ruler"), "instrument"),
    ],
)
def test_a_row_refuses_parts_that_are_not_its_own(row, why) -> None:
    with pytest.raises(ValueError, match=why):
        row()


def test_a_row_with_a_primary_or_a_control_runs_in_the_ab_blocks() -> None:
    for row in scenario.table():
        if row.primaries or row.control:
            assert profiles.AB_TAG in row.tags, row.name


def test_the_ksm_rows_name_the_ksm_knobs_a_start_restores() -> None:
    assert KSM_KNOBS in scenario.knob_sets()
    assert knobs.KnobState(KSM_KNOBS).state_path.name == "ksm-state.json"


def test_a_row_s_report_section_is_a_registered_one() -> None:
    from importlib.metadata import entry_points

    from memqual.host.report.report import SECTIONS_GROUP

    sections = {point.name for point in entry_points(group=SECTIONS_GROUP)}
    named = {row.section for row in scenario.table() if row.section}
    assert named and named <= sections


def test_no_rows_at_all_is_a_stale_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from memqual.host.core.errors import BadInput

    _points(monkeypatch)
    with pytest.raises(BadInput, match="run ./setup"):
        scenario.load()


def test_a_row_names_the_e2e_test_that_carries_its_tags() -> None:
    """Each row's ``e2e`` is a test of e2e/ whose Avocado tags hold the
    row's: the tags an A/B or a profile selects by are the row's."""
    from avocado.core.safeloader import find_avocado_tests

    from memqual.host.core.paths import REPO_ROOT

    tests: dict[str, set[str]] = {}
    for path in sorted((REPO_ROOT / "e2e").glob("test_*.py")):
        classes, _ = find_avocado_tests(str(path))
        for cls, methods in classes.items():
            for name, tags, *_ in methods:
                tests[f"{path.stem}:{cls}.{name}"] = set(tags)
    for row in scenario.table():
        assert row.e2e in tests, row.name
        assert set(row.tags) <= tests[row.e2e], (row.name, row.tags, tests[row.e2e])


def _unwritten(doc: str, root: Path) -> list[str]:
    """What of a spread's write-up (``path, "Heading", ...``) is not there:
    the file, or a quoted heading no heading of it starts with."""
    path, _, sections = doc.partition(",")
    page = root / path.strip()
    if not page.is_file():
        return [path.strip()]
    lines = page.read_text(encoding="utf-8").splitlines()
    headings = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    return [s for s in re.findall(r'"([^"]+)"', sections) if not any(h.startswith(s) for h in headings)]


@pytest.mark.parametrize(
    ("doc", "missing"),
    [
        ("docs/runs.md", []),
        ('docs/runs.md, "The A/A"', []),
        ('docs/runs.md, "The A/A", "Its blocks"', []),
        ('docs/runs.md, "The A/A", "Moved away"', ["Moved away"]),
        ('docs/gone.md, "The A/A"', ["docs/gone.md"]),
    ],
)
def test_a_spread_s_write_up_is_found_by_its_file_and_headings(tmp_path: Path, doc: str, missing: list[str]) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "runs.md").write_text("# Runs\n\n## The A/A (2026-12-04)\n\n### Its blocks\n\ntext\n")
    assert _unwritten(doc, tmp_path) == missing


def test_every_measured_spread_names_a_write_up_that_is_there() -> None:
    """A primary's spread names the run that measured it and where that run
    is written up (host/core/primary.py ``Measured.doc``): a page moved or a
    heading renamed leaves a pointer to nothing."""
    from memqual.host.core.paths import REPO_ROOT

    spreads = [
        s
        for p in scenario.every_primary()
        for s in (p.spread_wall, p.spread_icount, p.spread_host_under_test)
        if s is not None
    ]
    assert spreads
    assert {s.run.doc: _unwritten(s.run.doc, REPO_ROOT) for s in spreads} == {s.run.doc: [] for s in spreads}


def test_one_metric_may_be_two_primaries_of_two_variants_each_found_by_its_own() -> None:
    row: Scenario[object] = Scenario(
        "a.x",
        primaries=(Primary("m", "with", variant=(("k", 1),)), Primary("m", "without", variant=(("k", 0),))),
    )
    with_k, without_k = row.primaries
    assert [p.matches("m", {"k": 1}) for p in row.primaries] == [True, False]
    assert [p.matches("m", {"k": 0}) for p in row.primaries] == [False, True]
    assert (with_k.named(), without_k.named()) == ("m [k=1]", "m [k=0]")


def test_a_primary_read_in_l1_on_a_host_under_test_is_decided_there_by_that_figure_alone() -> None:
    """Where a row's figure is read on this machine, which is not the
    guest's host under --host-kernel, its figure read in L1 decides it
    there; on this machine that figure (never recorded here) decides
    nothing, and there the machine's own figure is exploratory."""
    row: Scenario[object] = Scenario(
        "a.hut", primaries=(Primary("rss_s", "why", variant=(("k", True),), on_host_under_test="rss_l1_s"),)
    )
    (p,) = row.primaries
    assert p.matches("rss_s", {"k": True}) and not p.matches("rss_l1_s", {"k": True})
    assert p.matches("rss_l1_s", {"k": True}, "icount:0", host_under_test=True)
    assert p.matches("rss_l1_s", {"k": True}, "wall", host_under_test=True)
    assert not p.matches("rss_s", {"k": True}, "icount:0", host_under_test=True)
    assert not p.matches("rss_l1_s", {"k": False}, "icount:0", host_under_test=True)
    assert (p.named("wall"), p.named("icount:0", host_under_test=True)) == ("rss_s [k=True]", "rss_l1_s [k=True]")

"""Each verdict names the host its evidence ran on (this machine, or a host
under test with its kernel and parameters), its evidence class and its
clock, from its records' environments; records that disagree are named as
mixed.  The records are the scenarios' own (ksm_volatile_runs,
balloon_records), with the environment e2e/base.py's record() gives them;
every rendering (results.json, checked against its schema, the card, the
summary row, the terminal) is checked to say the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from balloon_records import balloon_records
from ksm_volatile_runs import ksm_records
from markupsafe import escape
from results_files import write_results_file
from rich.console import Console
from undrawn_figures import undraw

from memqual.host.core import nested
from memqual.host.core.environment import Environment
from memqual.host.core.errors import BadInput
from memqual.host.core.record import Measurement
from memqual.host.judge.claims.evaluate import evaluate
from memqual.host.judge.claims.load import load
from memqual.host.judge.claims.model import ANALOGUE, MIN_REPLICATES, NOT_MEASURABLE, SUCCESSOR
from memqual.host.judge.claims.ran_on import EMULATED_ON_ICOUNT, EMULATED_ON_WALL, NO_MEASUREMENT
from memqual.host.judge.results import build_results, check_results, load_results, write_results
from memqual.host.report import claim_lines
from memqual.host.report.report import render_html, report_page
from memqual.host.report.terminal import print_tables

L1_RELEASE = "6.12.111+deb12-amd64"
# How e2e/base.py names a host under test: Machine.host_label.
L1_ON_TCG = nested.parse_host(L1_RELEASE, ["kvm.mmio_caching=0"]).label("tcg")
L1_ON_KVM = nested.parse_host(L1_RELEASE).label("kvm")
THIS_TCG = "this machine (accel tcg)"


def here(clock: str) -> dict[str, object]:
    """A record's environment on this machine, its guest under TCG."""
    return Environment(accel="tcg", clock=clock).to_json()


def on_l1(label: str, clock: str) -> dict[str, object]:
    """A record's environment under a host under test: the guest under L1's KVM."""
    return Environment(accel="kvm", clock=clock).with_host(label, L1_RELEASE).to_json()


def ksm(a_env: dict[str, object], b_env: dict[str, object]) -> list[Measurement]:
    """A KSM volatile-scan run whose smart_scan=1 records (A, and the
    run's other records) came from ``a_env`` and smart_scan=0's (B) from
    ``b_env``."""
    records = ksm_records(7.5, skip_share=0.9)
    for rec in records:
        rec.environment = dict(b_env if rec.variant.get("smart_scan") == 0 else a_env)
    return records


def balloon(env: dict[str, object]) -> list[Measurement]:
    """A balloon request-size run on the fewest guests a verdict takes (its
    fits cost a second of CPU a run)."""
    records = balloon_records(2e-3, n=MIN_REPLICATES)
    for rec in records:
        rec.environment = dict(env)
    return records


@dataclass(frozen=True)
class Case:
    name: str
    claim: str
    records: Callable[[], list[Measurement]]
    host: str
    clock: str
    emulated: str


CASES = [
    Case("this machine, wall", "ksm-volatile-4k", lambda: ksm(here("wall"), here("wall")), THIS_TCG, "wall", ""),
    Case(
        "a host under test on icount",
        "balloon-bitmap",
        lambda: balloon(on_l1(L1_ON_TCG, "icount:0")),
        L1_ON_TCG,
        "icount:0",
        EMULATED_ON_ICOUNT,
    ),
    Case(
        "a host under test on the wall clock",
        "ksm-volatile-4k",
        lambda: ksm(on_l1(L1_ON_TCG, "wall"), on_l1(L1_ON_TCG, "wall")),
        L1_ON_TCG,
        "wall",
        EMULATED_ON_WALL,
    ),
    Case(
        "a host under test under KVM: a real CPU",
        "ksm-volatile-4k",
        lambda: ksm(on_l1(L1_ON_KVM, "wall"), on_l1(L1_ON_KVM, "wall")),
        L1_ON_KVM,
        "wall",
        "",
    ),
    Case(
        "A on this machine, B on a host under test",
        "ksm-volatile-4k",
        lambda: ksm(here("wall"), on_l1(L1_ON_TCG, "icount:0")),
        f"mixed: {THIS_TCG}; {L1_ON_TCG}",
        "mixed: wall; icount:0",
        EMULATED_ON_WALL,
    ),
    Case(
        "one host, two clocks",
        "ksm-volatile-4k",
        lambda: ksm(here("wall"), here("icount:4")),
        THIS_TCG,
        "mixed: wall; icount:4",
        "",
    ),
    Case(
        "records that do not say",
        "ksm-volatile-4k",
        lambda: ksm({}, {}),
        "this machine (accel not recorded)",
        "not recorded",
        "",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_claim_names_the_host_class_and_clock_of_its_records_everywhere(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    undraw(monkeypatch)  # the pictures are tests/report's subject
    records = case.records()
    verdicts = evaluate(load(), records)
    v = next(v for v in verdicts if v.claim.id == case.claim)
    assert v.verdict != NOT_MEASURABLE, v.reason
    assert (v.ran_on.host, v.ran_on.clock, v.ran_on.emulated_cpu) == (case.host, case.clock, case.emulated)

    path = write_results(build_results(verdicts, records, host_fallback=False), tmp_path / "results.json")
    results = load_results(path)  # checked against the schema
    entry = next(c for c in results.claims if c.id == case.claim)
    kind = claim_lines.evidence_class(entry.data)
    assert kind == v.evidence and kind in (SUCCESSOR, ANALOGUE)
    ran = entry.data["ran_on"]
    assert (ran["host"], ran["clock"], ran["emulated_cpu"]) == (case.host, case.clock, case.emulated)
    line = f"host: {case.host} · evidence: {kind} · clock: {case.clock}"

    page = report_page(results)
    card = next(c for c in page.cards if c.id == case.claim)
    assert (card.ran_on, card.emulated) == (line, case.emulated)
    row = next(r for r in page.summary if r.claim == case.claim)
    assert (row.host, row.clock) == (case.host, case.clock)
    html = render_html(results)
    start = html.index(f"<section class='card' id='{case.claim}'>")
    shown = html[start : html.index("<details>", start)]
    assert f"<p class='ran-on'>{escape(line)}</p>" in shown
    assert ("<p class='emulated'>" in shown) == bool(case.emulated)

    console = Console(record=True, width=300)
    print_tables(results, console=console)
    text = console.export_text()
    assert f"{case.claim} {line}" in text
    assert (EMULATED_ON_ICOUNT in text or EMULATED_ON_WALL in text) == bool(case.emulated)


def test_a_claim_not_measured_has_no_host_or_clock_of_its_own() -> None:
    for v in evaluate(load(), ksm(on_l1(L1_ON_TCG, "icount:0"), on_l1(L1_ON_TCG, "icount:0"))):
        if v.verdict != NOT_MEASURABLE:
            continue
        assert not v.ran_on.measured and v.ran_on.host == v.ran_on.clock == NO_MEASUREMENT
        assert claim_lines.ran_on_line(v.to_json()) == (
            "host: no measurement · evidence: not measurable · clock: no measurement"
        )
        assert claim_lines.emulated_line(v.to_json()) == ""


def test_a_file_written_before_verdicts_named_their_host_says_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    undraw(monkeypatch)
    path = write_results_file(tmp_path / "results.json", ksm(here("wall"), here("wall")))
    data = json.loads(path.read_text())
    for c in data["claims"]:
        del c["ran_on"]
    path.write_text(json.dumps(data))
    results = load_results(path)
    row = next(r for r in report_page(results).summary if r.claim == "ksm-volatile-4k")
    assert (row.host, row.clock) == ("not recorded", "not recorded")
    card = next(c for c in report_page(results).cards if c.id == "ksm-volatile-4k")
    assert card.ran_on == "host: not recorded · evidence: successor · clock: not recorded" and card.emulated == ""


@pytest.mark.parametrize(
    "field, value",
    [("hosts", "this machine (accel tcg)"), ("clock", ""), ("emulated_svm", "yes"), ("host", None)],
)
def test_the_schema_refuses_a_malformed_host(field: str, value: object, tmp_path: Path) -> None:
    path = write_results_file(tmp_path / "results.json", ksm(here("wall"), here("wall")))
    data = json.loads(path.read_text())
    check_results(data, "results.json")
    data["claims"][4]["ran_on"][field] = value
    with pytest.raises(BadInput, match="ran_on"):
        check_results(data, "results.json")

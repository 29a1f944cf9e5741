"""What memqual shows of what others wrote: a metric name that is
matplotlib mathtext is a label, not a formula, and a figure that cannot be
drawn leaves only itself out; control characters from a test, a results
file or a lab host never reach the terminal; and ``memqual compare`` exits
1 only when a primary is slower, whatever figures two schema-valid files
hold."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from results_files import block_record, write_results_file
from rich.console import Console

from memqual.host.cli import compare
from memqual.host.cli import main as cli
from memqual.host.core.record import Measurement
from memqual.host.judge.results import load_results
from memqual.host.judge.stats.ab_tests import ratio_test
from memqual.host.report import report

MATHTEXT = r"$\frac{1}{$"
# An OSC that retitles the window, a CSI that clears the screen and one
# that moves the cursor up over what was printed.
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[1A"


def _record(metric: str, replicates: list[list[float]], scenario: str = "balloon.inflate") -> Measurement:
    return block_record(scenario, metric, replicates)


def _results(path: Path, metric: str, replicates: list[list[float]]) -> Path:
    return write_results_file(path, [_record(metric, replicates)])


# -- 9. mathtext in a label, a figure that fails ----------------------------------------
def test_a_metric_named_in_mathtext_is_drawn_as_text(tmp_path: Path) -> None:
    results = _results(tmp_path / "r.json", MATHTEXT, [[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])
    page = report.write_html(load_results(results), tmp_path / "report.html").read_text()
    assert "\\frac{1}{" in page and page.count("data:image/png;base64,") >= 1


def test_compare_html_of_a_mathtext_metric_is_written(tmp_path: Path, capsys) -> None:
    a = _results(tmp_path / "a.json", MATHTEXT, [[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])
    b = _results(tmp_path / "b.json", MATHTEXT, [[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])
    assert cli.main(["compare", str(a), str(b), "--html", str(tmp_path / "c.html")]) == 0, capsys.readouterr().err
    assert "\\frac{1}{" in (tmp_path / "c.html").read_text()


def test_a_figure_that_cannot_be_drawn_leaves_only_itself_out(tmp_path: Path, monkeypatch) -> None:
    from memqual.host.report import figures

    results = _results(tmp_path / "r.json", "inflate_s", [[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])
    real_png = figures.png

    def failing(fig):
        figures.pyplot().close(fig)
        raise ValueError("matplotlib refused a label")

    monkeypatch.setattr("memqual.host.report.plots.png", failing)
    page = report.write_html(load_results(results), tmp_path / "report.html").read_text()
    assert "data:image/png;base64," not in page and "inflate_s" in page
    assert not figures.pyplot().get_fignums()  # nothing left open
    monkeypatch.setattr("memqual.host.report.plots.png", real_png)
    page = report.write_html(load_results(results), tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page


# -- 10. no control character reaches the terminal ----------------------------------------
def _no_foreign_escapes(text: str) -> None:
    assert "\x1b]" not in text and "\x1b[2J" not in text and "\x1b[1A" not in text, repr(text)


def test_printable_shows_controls_and_keeps_text() -> None:
    from memqual.host.core.printable import one_line, printable

    assert printable("a\x1b[2Jb\tc\nd\x9b\u202e") == "a\\x1b[2Jb\tc\nd\\x9b\\u202e"
    assert one_line("a\nb\tc") == "a\\nb\\tc"
    assert printable("plain – text ✓") == "plain – text ✓"


def test_a_fail_reason_from_a_test_is_shown_not_obeyed() -> None:
    from memqual.host.run import jobevents
    from memqual.host.run.progress import Progress

    progress = Progress("memqual run", Console(file=io.StringIO()))
    line = progress.feed(
        jobevents.TestEnded("1", f"e2e/t.py:T.test{ESCAPES}", 1, "FAIL", f"guest said {ESCAPES}", 1.0, "/x")
    )
    assert line is not None
    _no_foreign_escapes(line)
    assert "\\x1b]0;owned" in line
    progress.feed(jobevents.TestStarted("2", f"e2e/t.py:T.next{ESCAPES}", 2, "/y"))
    shown = io.StringIO()
    Console(file=shown, force_terminal=True, width=200).print(progress.render())
    _no_foreign_escapes(shown.getvalue())


def test_a_lab_hosts_facts_are_shown_not_obeyed(tmp_path: Path) -> None:
    from memqual.host.run.hosts import check, config
    from memqual.host.run.hosts.probe import HostProbe

    key = tmp_path / "k"
    key.write_text("x")
    host = config.LabHost(name="lab1", address="10.0.0.1", key=key, known_hosts=key)
    probe = HostProbe("1", "b", {"host_kernel": f"6.1{ESCAPES}", "qemu_origin": ESCAPES}, "/l", True, None)
    lines = check.lines([check.HostCheck(host, f"busy{ESCAPES}", probe, {"qemu_version": ESCAPES})])
    for line in lines:
        _no_foreign_escapes(line)
    assert "\\x1b[2J" in lines[0]


def test_metric_names_and_reasons_of_a_results_file_are_shown_not_obeyed(tmp_path: Path) -> None:
    from memqual.host.core.printable import console
    from memqual.host.report.terminal import print_tables

    results = _results(tmp_path / "r.json", f"inflate_s{ESCAPES}", [[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])
    out = io.StringIO()
    print_tables(load_results(results), console(file=out, force_terminal=True, width=200))
    _no_foreign_escapes(out.getvalue())
    assert "inflate_s\\x1b]0;owned" in out.getvalue()


def test_compare_prints_no_escape_of_a_results_file(tmp_path: Path, capsys) -> None:
    a = _results(tmp_path / "a.json", f"m{ESCAPES}", [[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])
    assert cli.main(["compare", str(a), str(a)]) == 0
    captured = capsys.readouterr()
    _no_foreign_escapes(captured.out + captured.err)


def test_an_error_line_quoting_a_file_is_shown_not_obeyed(tmp_path: Path, capsys) -> None:
    missing = tmp_path / f"results{ESCAPES}.json"
    assert cli.main(["compare", str(missing), str(missing)]) == 2
    err = capsys.readouterr().err
    _no_foreign_escapes(err)
    assert err.count("\n") == 1 and "results\\x1b]0;owned" in err


# -- 11. exit 1 means slower -------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b",
    [
        (1e-100, -1e100),  # the relative scale: a spread of 1e200
        (1.0, -1e100),
        (-1e-100, 1.0),
        (5e-324, -1e100),  # the smallest double against the largest figure allowed
    ],
)
def test_extreme_but_finite_samples_are_compared_in_range(a: float, b: float) -> None:
    # No OverflowError: an estimate, or (beyond float's range) none, and then no decision either.
    test = ratio_test([[a, a], [a, a], [a, a * 1.0000001 or 1e-300]], [[b, b], [b * 0.9999999, b], [b, b]])
    assert math.isfinite(test.estimate) or test.se == math.inf


@pytest.mark.parametrize(
    "a, b, slower",
    [
        (1e-100, -1e100, False),
        (-1e-100, 1.0, True),
        (1.0, -1e100, False),
        (5e-324, -1e100, False),
        (1e-100, 1e100, True),
    ],
)
def test_compare_of_extreme_samples_exits_1_only_when_slower(tmp_path: Path, capsys, a, b, slower) -> None:
    path_a = _results(tmp_path / "a.json", "inflate_s", [[a, a], [a, a * 1.0000001 or 1e-300], [a, a]])
    path_b = _results(tmp_path / "b.json", "inflate_s", [[b, b], [b, b], [b * 0.9999999, b]])
    status = cli.main(["compare", str(path_a), str(path_b), "--json", "--html", str(tmp_path / "c.html")])
    captured = capsys.readouterr()
    assert "unexpected" not in captured.err and "Traceback" not in captured.err, captured.err
    assert status in (0, 1, 2), captured.err
    if status != 2:
        verdicts = {m["verdict"] for m in json.loads(captured.out)["metrics"]}
        assert (status == 1) == ("slower" in verdicts), (status, verdicts)
        assert (status == 1) == slower


def test_anything_else_the_comparison_meets_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    a = _results(tmp_path / "a.json", "inflate_s", [[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])

    def broken(*args, **kwargs):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(compare, "of_results", broken)
    assert cli.main(["compare", str(a), str(a)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not be compared (ZeroDivisionError" in err


def test_a_figures_labels_reach_neither_the_picture_nor_the_terminal_raw(recwarn) -> None:
    """matplotlib warns of a glyph it lacks with the character itself in
    the message: a metric named with an escape sequence would reach the
    operator's terminal through that warning unless every text of a
    figure is escaped before it is drawn."""
    from memqual.host.report import figures

    plt = figures.pyplot()
    fig, ax = plt.subplots()
    ax.set_yticks([0])
    ax.set_yticklabels(["balloon.inflate \x1b]0;retitled\x07"])
    ax.set_title("\x1b[2J")
    figures.tidy(fig)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["balloon.inflate \\x1b]0;retitled\\x07"]
    assert ax.get_title() == "\\x1b[2J"
    assert figures.png(fig)
    assert not [w for w in recwarn if "\x1b" in str(w.message) or "\x07" in str(w.message)]

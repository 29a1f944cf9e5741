"""Every output memqual writes goes through paths.write_private_atomic, and
no output folder another user owns or may write is used.

memqual runs as root on lab hosts.  A writer that opens a predictable name
(``results.tmp``, ``.out.json.tmp``) or the target itself with a plain
open follows a link that someone who can write the folder planted there,
and root overwrites the file the link names.  Each writer is run with such
links planted at the old temporary names and at the target: the file they
point to must stay as it was, and the output must be written."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from results_files import inflate_record, write_results_file

from memqual.host.cli import main as cli
from memqual.host.core import record
from memqual.host.core.paths import write_private_atomic
from memqual.host.judge.results import load_results, write_results
from memqual.host.report import bisect_page as page
from memqual.host.report import report
from memqual.host.run.bisect import run, series

VICTIM_TEXT = "root's file, not to be overwritten\n"


def _plant(folder: Path, target_name: str, victim: Path) -> None:
    """Links at every name a writer could open without O_EXCL: the target
    and the temporary names the writers used to take."""
    target = folder / target_name
    for name in {target.name, target.with_suffix(".tmp").name, f".{target.name}.tmp", target.stem + ".tmp.html"}:
        (folder / name).symlink_to(victim)


def _results(tmp_path: Path) -> Path:
    return write_results_file(tmp_path / "in" / "results.json", [inflate_record([[0.8, 0.81], [0.79], [0.82]])])


def _write_results(tmp_path: Path, out: Path) -> Path:
    return write_results(load_results(_results(tmp_path)), out / "results.json")


def _write_record(tmp_path: Path, out: Path) -> Path:
    rec = inflate_record([[1.0], [2.0]])
    return record.write(rec, out)


def _write_report(tmp_path: Path, out: Path) -> Path:
    return report.write_html(load_results(_results(tmp_path)), out / "report.html")


def _write_bisect(tmp_path: Path, out: Path) -> Path:
    kernels = tuple(series.KernelSpec("6.1.0-57-amd64", f"memqual.k={i}") for i in range(3))
    b = run.Bisector(run.Settings(kernels=kernels, metric="deflate_s"), out, lambda *a: ([], "", 0, None), say=print)
    b.save()
    return out / "bisect.json"


def _write_bisect_page(tmp_path: Path, out: Path) -> Path:
    kernels = tuple(series.KernelSpec("6.1.0-57-amd64", f"memqual.k={i}") for i in range(3))
    b = run.Bisector(run.Settings(kernels=kernels, metric="deflate_s"), tmp_path / "b", lambda *a: ([], "", 0, None))
    return page.write_page(b.to_json(), out / "bisect.html")


def _cli(argv: Callable[[Path, Path], list[str]], target: str) -> Callable[[Path, Path], Path]:
    def write(tmp_path: Path, out: Path) -> Path:
        assert cli.main(argv(_results(tmp_path), out / target)) in (0, 1)
        return out / target

    return write


WRITERS: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "results.json": (_write_results, "results.json"),
    "a record": (_write_record, inflate_record([[1.0]]).filename()),
    "report.html": (_write_report, "report.html"),
    "bisect.json": (_write_bisect, "bisect.json"),
    "bisect.html": (_write_bisect_page, "bisect.html"),
    "compare --html": (_cli(lambda r, t: ["compare", str(r), str(r), "--html", str(t)], "cmp.html"), "cmp.html"),
    "export --kcidb": (_cli(lambda r, t: ["export", "--kcidb", str(t), str(r)], "k.json"), "k.json"),
    "history --html": (_cli(lambda r, t: ["history", str(r), "--html", str(t)], "h.html"), "h.html"),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_never_writes_through_a_planted_link(tmp_path: Path, writer: str) -> None:
    write, name = WRITERS[writer]
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    _plant(out, name, victim)
    written = write(tmp_path, out)
    assert victim.read_text() == VICTIM_TEXT
    assert not written.is_symlink() and written.stat().st_size > 0
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    # Nothing of the writer's own left beside it: only the planted links.
    left = {p.name for p in out.iterdir() if not p.is_symlink()} - {written.name}
    assert not {n for n in left if n.startswith(".")}


def test_the_writer_leaves_the_old_file_whole_when_it_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old\n")

    with pytest.raises(TypeError):
        write_private_atomic(target, "not bytes", 0o644)  # type: ignore[arg-type]  # a failing write, on purpose
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


# ------------------------------------------------------------ output folders


def _main(argv: list[str]) -> int:
    """memqual's exit status, a usage error (argparse's exit) included."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def _others_may_write(folder: Path) -> None:
    os.chmod(folder, 0o777)


def _another_user_owns(folder: Path) -> None:
    os.chown(folder, 54321, 54321)


OUTPUTS: dict[str, Callable[[Path, Path], list[str]]] = {
    "run --output": lambda r, d: ["run", "--tests", str(d), "--output", str(d / "job")],
    "bisect --output": lambda r, d: ["bisect", "--kernels", "a", "b", "--metric", "m", "--output", str(d / "b")],
    "compare --html": lambda r, d: ["compare", str(r), str(r), "--html", str(d / "cmp.html")],
    "export --kcidb": lambda r, d: ["export", "--kcidb", str(d / "k.json"), str(r)],
    "history --html": lambda r, d: ["history", str(r), "--html", str(d / "h.html")],
    "balloon curve --png": lambda r, d: ["balloon", "curve", str(r), "--png", str(d / "c.png")],
}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
@pytest.mark.parametrize("damage", [_others_may_write, _another_user_owns], ids=["others-may-write", "another-user"])
@pytest.mark.parametrize("command", sorted(OUTPUTS))
def test_an_output_folder_someone_else_controls_is_refused_before_anything(
    tmp_path: Path, command: str, damage: Callable[[Path], None], capsys: pytest.CaptureFixture[str]
) -> None:
    results = _results(tmp_path)
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o700)
    damage(folder)
    status = _main(OUTPUTS[command](results, folder))
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert "folder of your own" in err
    assert list(folder.iterdir()) == []


def test_the_default_output_folder_is_checked_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir(mode=0o777)
    os.chmod(cwd, 0o777)
    here = os.getcwd()
    os.chdir(cwd)
    try:
        status = _main(["run", "--tests", str(tmp_path)])
    finally:
        os.chdir(here)
    assert status == 2 and "writable by others" in capsys.readouterr().err
    assert list(cwd.iterdir()) == []


def test_a_folder_of_ones_own_is_used(tmp_path: Path) -> None:
    results = _results(tmp_path)
    out = tmp_path / "mine" / "new"  # made by the writer, below a private folder
    (tmp_path / "mine").mkdir(mode=0o755)
    assert _main(["export", "--kcidb", str(out / "k.json"), str(results)]) == 2  # no such folder: said so
    out.mkdir()
    assert cli.main(["export", "--kcidb", str(out / "k.json"), str(results)]) == 0
    assert json.loads((out / "k.json").read_text())["tests"]

"""A results file or a record larger than its cap is refused before it is
read (host/core/bounded.py, from the open descriptor): one line, exit 2,
at once, not a minute of schema checking."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from memqual.host.cli import main as cli
from memqual.host.core import record
from memqual.host.core.errors import BadInput
from memqual.host.judge import results

DATA = Path(__file__).resolve().parents[1] / "data" / "results.json"


def _padded(path: Path, size: int) -> Path:
    """tests/data/results.json grown to ``size`` bytes with whitespace: a
    valid results file, which only its size makes unusable."""
    text = DATA.read_bytes()
    path.write_bytes(text + b" " * (size - len(text)))
    return path


def test_an_oversize_results_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = _padded(tmp_path / "results.json", results.RESULTS_MAX + 1)
    begun = time.monotonic()
    with pytest.raises(BadInput, match="more than a results file may have"):
        results.load_results(big)
    assert time.monotonic() - begun < 0.5
    assert results.load_results(_padded(tmp_path / "ok.json", results.RESULTS_MAX)).claims


def test_memqual_compare_of_an_oversize_file_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    big = _padded(tmp_path / "results.json", results.RESULTS_MAX + 1)
    assert cli.main(["compare", str(big), str(big)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than a results file may have (8 MiB)" in err


def test_an_oversize_record_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    path.write_bytes(json.dumps({"scenario": "x"}).encode() + b" " * record.RECORD_MAX)
    with pytest.raises(BadInput, match="more than a record file may have"):
        record.load(path)

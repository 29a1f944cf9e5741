"""The negative controls' power tool (lab/control_power.py): the grid of
spreads, levels and blocks, and one line for bad input."""

from __future__ import annotations

from memqual.lab import control_power


def test_the_power_tool_prints_the_grid_and_refuses_one_file(capsys, tmp_path):
    assert control_power.main(["--trials", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("spread") == 9 and "8: " in out
    assert control_power.main([str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "two results files" in err

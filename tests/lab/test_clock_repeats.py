"""The clock's repeatability tool (lab/clock_repeats.py) under a host under
test: the host reaches every guest, on the clock and vCPUs L1 can run; with
--warm one untimed boot saves the snapshot the timed ones restore."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from memqual.host.core import nested
from memqual.lab import clock_repeats
from memqual.lab.clock_repeats import Boot


@pytest.fixture
def boots(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every boot the tool asks for, with what it was given; the first
    restores nothing, the others are warm when their config is."""
    asked: list[dict[str, Any]] = []

    def one_boot(config: Any, image: Any, repeats: int, settle_s: int, keepalive: bool, host: Any) -> Boot:
        asked.append({"config": config, "repeats": repeats, "host": host})
        return Boot([0.0632 + 0.0001 * len(asked)] * repeats, 2.5, config.warm and len(asked) > 1)

    monkeypatch.setattr(clock_repeats, "one_boot", one_boot)
    monkeypatch.setattr(clock_repeats, "build", lambda: SimpleNamespace())
    monkeypatch.setattr(clock_repeats, "choose_for_clock", lambda *_: (SimpleNamespace(version="10.0.2"), ""))
    return asked


@pytest.mark.parametrize(("warm", "started"), [(True, 3), (False, 2)])
def test_guests_run_under_the_host_asked_and_warm_ones_restore_a_saved_one(
    boots: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], warm: bool, started: int
) -> None:
    argv = ["--clock", "icount:2", "--cpus", "2", "--boots", "2", "--repeats", "2", "--host-kernel", "6.1.0-57-amd64"]
    assert clock_repeats.main([*argv, "--json", *(["--warm"] if warm else [])]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(boots) == started  # --warm: one untimed boot first, to save the snapshot
    assert {b["host"].name for b in boots} == {"6.1.0-57-amd64"}
    assert {b["config"].clock for b in boots} == {f"icount:{nested.MAX_SHIFT}"}
    assert {b["config"].cpus for b in boots} == {1}
    assert result["host"] == "6.1.0-57-amd64"
    assert result["warm"] == [warm, warm]
    assert len(result["seconds"]) == 2


def test_a_host_parameter_without_a_host_is_one_line_and_exit_2(
    boots: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert clock_repeats.main(["--host-kernel-param", "kvm_amd.npt=0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--host-kernel" in err
    assert boots == []

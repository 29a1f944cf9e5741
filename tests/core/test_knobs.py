"""host/core/knobs.py on a fake tree: any subject's knobs saved before a
change and put back after it, and after a kill by the next start."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from memqual.host.core import knobs
from memqual.host.core.errors import BadInput


def _set(tmp_path: Path) -> knobs.KnobSet:
    root = tmp_path / "hugepages-2048kB"
    root.mkdir()
    (root / "nr_hugepages").write_text("0\n")
    (root / "free_hugepages").write_text("0\n")
    return knobs.KnobSet("pages", "host huge pages", (knobs.KnobGroup("huge", root, names=("nr_hugepages",)),))


def test_changing_restores_on_exit_and_on_an_exception(tmp_path: Path) -> None:
    knob_set = _set(tmp_path)
    state_dir = tmp_path / "state"
    fs = knob_set.groups[0].dir()
    with knobs.changing(knob_set, state_dir) as state:
        saved = json.loads(state.state_path.read_text())
        assert saved["huge"] == {"nr_hugepages": "0"} and saved["schema"] == "memqual.pages-state/1"
        fs.write("nr_hugepages", 64)
    assert fs.read("nr_hugepages") == "0" and not (state_dir / "pages-state.json").exists()
    with pytest.raises(RuntimeError), knobs.changing(knob_set, state_dir):
        fs.write("nr_hugepages", 8)
        raise RuntimeError("the scenario failed")
    assert fs.read("nr_hugepages") == "0"


def _die_holding(knob_set: knobs.KnobSet, state_dir: Path) -> None:
    with knobs.changing(knob_set, state_dir):
        knob_set.groups[0].dir().write("nr_hugepages", 32)
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_holder_s_knobs_come_back_at_the_next_start(tmp_path: Path) -> None:
    knob_set = _set(tmp_path)
    state_dir = tmp_path / "state"
    child = multiprocessing.get_context("fork").Process(target=_die_holding, args=(knob_set, state_dir))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    fs = knob_set.groups[0].dir()
    assert fs.read("nr_hugepages") == "32", "the kill left the knob changed"
    (restored,) = knobs.restore_every_stale((knob_set,), state_dir)
    assert restored.written == ["huge/nr_hugepages"] and not restored.owner_alive
    assert fs.read("nr_hugepages") == "0"
    assert knobs.restore_every_stale((knob_set,), state_dir) == []


def test_a_state_file_naming_another_root_or_knob_is_refused(tmp_path: Path) -> None:
    knob_set = _set(tmp_path)
    state = knobs.KnobState(knob_set, tmp_path / "state")
    assert state.try_lock()
    snapshot = state.new_snapshot()
    snapshot.roots["huge"] = "/etc"
    with pytest.raises(BadInput, match="refusing to write knobs there"):
        state.restore(snapshot)
    snapshot = state.new_snapshot()
    snapshot.values["huge"] = {"nr_overcommit_hugepages": "9"}
    with pytest.raises(BadInput, match="nr_overcommit_hugepages are not memqual's"):
        state.restore(snapshot)
    state.unlock()


def test_what_a_killed_holder_left_beside_its_knobs_is_removed_with_the_restore(tmp_path: Path) -> None:
    calls: list[Path] = []
    knob_set = dataclasses.replace(_set(tmp_path), after_restore=calls.append)
    state_dir = tmp_path / "state"
    assert knobs.restore_every_stale((knob_set,), state_dir) == [] and calls == []  # nothing stale: untouched
    child = multiprocessing.get_context("fork").Process(target=_die_holding, args=(knob_set, state_dir))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    (restored,) = knobs.restore_every_stale((knob_set,), state_dir)
    assert restored.written == ["huge/nr_hugepages"] and calls == [state_dir]

"""What the looks of one ``memqual run --until-decided`` did: the Tracker's
decisions (host/judge/until_decided.py) and the run's part of them (the
blocks added after each look, when each look fell, the controls' blocks,
why it stopped).  until-decided.json is its serialization; a finished
run's file is read back only by another process (the lab's page again),
never by the run that wrote it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.judge.exit_status import ExitStatus
from memqual.host.judge.until_decided import Tracker


@dataclasses.dataclass(frozen=True)
class AddedBlock:
    """A block added after a look, and what it ran."""

    block: int
    scenarios: tuple[str, ...]
    tests: tuple[str, ...]
    controls: bool  # the negative controls' tests rode along
    left_out: tuple[str, ...]  # undecided scenarios it did not run

    def to_json(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "scenarios": list(self.scenarios),
            "tests": list(self.tests),
            "controls": self.controls,
            "left_out": list(self.left_out),
        }

    @classmethod
    def from_json(cls, data: Any) -> AddedBlock:
        return cls(
            int(data["block"]),
            tuple(map(str, data.get("scenarios") or ())),
            tuple(map(str, data.get("tests") or ())),
            bool(data.get("controls")),
            tuple(map(str, data.get("left_out") or ())),
        )


@dataclasses.dataclass(frozen=True)
class ControlLook:
    """The negative controls at a look: their blocks then and the alpha it spent."""

    look: int
    blocks: int
    alpha: float

    def to_json(self) -> dict[str, Any]:
        return {"look": self.look, "blocks": self.blocks, "alpha": self.alpha}

    @classmethod
    def from_json(cls, data: Any) -> ControlLook:
        return cls(int(data.get("look", 0)), int(data.get("blocks", 0)), float(data.get("alpha", 0.0)))


@dataclasses.dataclass(frozen=True)
class SequentialRun:
    """One run's looks, as the outcome reads them."""

    tracker: Tracker
    stopped: str
    budget_min: float
    blocks: int  # every block of the run
    added: tuple[AddedBlock, ...] = ()
    look_wall_s: tuple[float, ...] = ()  # when each look fell, from the run's start
    checks_reserved_s: float = 0.0
    control_tests: tuple[str, ...] = ()
    control_blocks: int = 0
    min_control_blocks: int = 0
    control_looks: tuple[ControlLook, ...] = ()
    wall_s: float = 0.0

    @property
    def exit_status(self) -> ExitStatus:
        return self.tracker.exit_status()

    @property
    def first_block(self) -> int:
        """The blocks before the first look (--rounds): the block added
        after look k is block k + that."""
        return self.blocks - len(self.added)

    def minutes_at(self, look: int) -> float | None:
        """When look ``look`` (1-based) fell, in minutes from the run's start."""
        return self.look_wall_s[look - 1] / 60.0 if 0 < look <= len(self.look_wall_s) else None

    def added_after(self, look: int) -> AddedBlock | None:
        """The block added after look ``look``, if any."""
        return next((a for a in self.added if a.block == look + self.first_block), None)

    def to_json(self) -> dict[str, Any]:
        """until-decided.json."""
        return {
            **self.tracker.to_json(self.stopped, self.budget_min),
            "blocks": self.blocks,
            "added_blocks": [a.to_json() for a in self.added],
            "look_wall_s": list(self.look_wall_s),
            "checks_reserved_s": self.checks_reserved_s,
            "controls": {
                "tests": list(self.control_tests),
                "blocks": self.control_blocks,
                "min_blocks": self.min_control_blocks,
                "looks": [c.to_json() for c in self.control_looks],
            },
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "until-decided.json") -> SequentialRun:
        """A finished run's until-decided.json; BadInput, one line, when it
        is not what a run writes."""
        try:
            controls = data.get("controls") or {}
            return cls(
                tracker=Tracker.from_json(data),
                stopped=str(data.get("stopped") or ""),
                budget_min=float(data.get("budget_min") or 0.0),
                blocks=int(data.get("blocks") or 0),
                added=tuple(AddedBlock.from_json(a) for a in data.get("added_blocks") or ()),
                look_wall_s=tuple(float(x) for x in data.get("look_wall_s") or ()),
                checks_reserved_s=float(data.get("checks_reserved_s") or 0.0),
                control_tests=tuple(map(str, controls.get("tests") or ())),
                control_blocks=int(controls.get("blocks") or 0),
                min_control_blocks=int(controls.get("min_blocks") or 0),
                control_looks=tuple(ControlLook.from_json(x) for x in controls.get("looks") or ()),
                wall_s=float(data.get("wall_s") or 0.0),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{where}: not the JSON memqual run writes ({type(exc).__name__}: {exc})") from None

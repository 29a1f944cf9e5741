"""A balloon as the hugetlbfs procedures drive it: each inflate frees a
number of whole huge pages."""

from __future__ import annotations

import dataclasses

from memqual.host.hugetlbfs import scenarios as hs


@dataclasses.dataclass
class Reach:
    reached: bool
    seconds: float
    moved_bytes: int


class FakeBalloon:
    """A balloon whose inflates free ``whole`` huge pages each."""

    def __init__(self, free: list[int], whole: int, stops_short: bool = False) -> None:
        self.free, self.whole, self.stops_short = free, whole, stops_short
        self.targets: list[int] = []

    def ram_bytes(self) -> int:
        return 512 * hs.MIB

    def reach(self, target_bytes: int, deadline_s: float = 0.0) -> Reach:
        self.targets.append(target_bytes)
        moved = self.ram_bytes() - target_bytes
        if moved:
            self.free[0] += self.whole
        return Reach(not (self.stops_short and moved), 0.5, moved)

"""The bisect's job runner, scripted: each job's blocks in ABBA order,
the kernels from a step on slower, a clock that moves a round a variant."""

from __future__ import annotations

import random

from memqual.host.core import record
from memqual.host.run import blocks


def measurement(values: list[float], metric: str = "deflate_s") -> record.Measurement:
    return record.Measurement(
        scenario="balloon.deflate",
        metric=metric,
        unit="s",
        better="lower",
        samples=values,
        settings={"guest_mib": 1024},
    )


class FakeRunner:
    """Each job: its blocks' variants in ABBA order, each one replicate of 5
    samples stamped with its arm and block, the kernels from ``step`` on
    ``effect`` times slower, a little noise; kernels in ``noisy`` noisy
    enough never to be decided.  A clock advances ``round_s`` a variant."""

    def __init__(
        self,
        step: int,
        effect: float = 1.5,
        noisy: frozenset[int] = frozenset(),
        round_s: float = 60.0,
        interrupt_after: int | None = None,
        drift: float = 1.0,
    ) -> None:
        self.step, self.effect, self.noisy, self.round_s = step, effect, noisy, round_s
        self.interrupt_after = interrupt_after
        self.drift = drift  # the host's slowdown of every job after the first, both arms alike
        self.calls: list[int] = []  # the kernel of each variant, in run order
        self.jobs: list[list[tuple[int, str, int]]] = []  # each job's (block, arm, kernel)
        self.now = 0.0
        self.rng = random.Random(7)

    def clock(self) -> float:
        return self.now

    def __call__(self, arms, first, count, directory):
        if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
            raise KeyboardInterrupt
        records, job = [], []
        for block, arm in blocks.block_order(first, count):
            if arm not in arms:
                continue
            index = int(arms[arm].cmdline_extra.rsplit("=", 1)[1])
            self.calls.append(index)
            job.append((block, arm, index))
            self.now += self.round_s
            base = (self.drift if self.jobs else 1.0) * (self.effect if index >= self.step else 1.0)
            spread = 0.8 if index in self.noisy else 0.01
            values = [base * (1 + self.rng.uniform(-spread, spread)) for _ in range(5)]
            for m in (measurement(values), measurement([3.0] * 5, "inflate_s")):
                blocks.stamp(m, arm, block)
                records.append(m)
        self.jobs.append(job)
        return records, "PASS 2", 0, str(directory)

"""The until-decided run's sequential tracker, scripted: decides one
scenario after the first look and another after the third."""

from __future__ import annotations


class FakeTracker:
    """Decides ksm.merge after the first look and balloon.deflate after the
    third: the run must add blocks for the balloon test alone."""

    decided_at = 3
    alpha_left = 0.01
    status = 0  # what its decisions say, as compare's exit status
    keep: set[str] | None = None  # what worth_a_block keeps (None: every undecided scenario)
    compared: list = []  # the last look's comparisons (none: the controls' power is patched)

    def __init__(self) -> None:
        self.looks: list[tuple[int, int, int]] = []
        self.fractions: list[float] = []

    def update(self, look, records_a, records_b, fraction=1.0):
        self.looks.append((look, len(records_a), len(records_b)))
        self.fractions.append(fraction)
        if fraction >= 1.0:
            self.alpha_left = 0.0
        return look >= self.decided_at

    def undecided_scenarios(self):
        return {"balloon.deflate"}

    def worth_a_block(self, left_s, block_s):
        return self.undecided_scenarios() if self.keep is None else self.keep

    def futile_reasons(self, scenarios):
        return [f"{s}: needs more than 200 blocks" for s in sorted(scenarios)]

    def progress_line(self):
        return f"look {len(self.looks)}: fake"

    def exit_status(self):
        return self.status

    def to_json(self, stopped, budget_min):
        return {"stopped": stopped, "budget_min": budget_min, "looks": len(self.looks)}

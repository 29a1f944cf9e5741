"""The until-decided run's sequential tracker, scripted: decides one
scenario after the first look and another after the third."""

from __future__ import annotations

from memqual.host.judge.until_decided import Look, LookResult


class FakeTracker:
    """Decides ksm.merge after the first look and balloon.deflate after the
    third: the run must add blocks for the balloon test alone.  What the
    run's outcome reads of a Tracker (its metrics, looks, levels) it has
    empty: no metric was tracked."""

    decided_at = 3
    alpha_left = 0.01
    threshold = 0.05
    alpha = 0.01
    status = 0  # what its decisions say, as compare's exit status
    keep: set[str] | None = None  # what worth_a_block keeps (None: every undecided scenario)

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int]] = []  # (look, A's records, B's)
        self.fractions: list[float] = []
        self.metrics: dict = {}
        self.looks: list[Look] = []
        self.controls_flagged: set[str] = set()

    def update(self, look, records_a, records_b, fraction=1.0):
        self.seen.append((look, len(records_a), len(records_b)))
        self.fractions.append(fraction)
        if fraction >= 1.0:
            self.alpha_left = 0.0
        return LookResult(Look(look, fraction, 0.0, 0), (), look >= self.decided_at)

    def undecided_scenarios(self):
        return {"balloon.deflate"}

    def worth_a_block(self, left_s, block_s):
        return self.undecided_scenarios() if self.keep is None else self.keep

    def futile_reasons(self, scenarios):
        return [f"{s}: needs more than 200 blocks" for s in sorted(scenarios)]

    def progress_line(self):
        return f"look {len(self.seen)}: fake"

    def exit_status(self):
        return self.status

    def to_json(self, stopped, budget_min):
        return {"stopped": stopped, "budget_min": budget_min, "looks": len(self.seen)}

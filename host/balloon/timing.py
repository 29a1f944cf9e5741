"""The balloon timing scenario (scenarios 1 and 2 of e2e/test_balloon.py):
its plan, one measured cycle, ``run_timing`` and the records of a run.

Main inflates alternate with smaller calibration sizes; each main repeat
is timed by the host alone, then by the guest too (``tracker_cost``).
``cycle_problems`` and ``guest_timing_problems`` say what a cycle and the
guest's timings must show, for the e2e test to assert.  docs/balloon.md,
"host/balloon/timing.py"."""

from __future__ import annotations

import dataclasses
from typing import Any

from memqual.host.balloon import host_thp
from memqual.host.balloon import model as transfer_model
from memqual.host.balloon.agent import GuestClock, GuestTiming, agent_stat
from memqual.host.balloon.device import PAGE, BalloonController, BalloonResult
from memqual.host.balloon.scenarios import MARGIN_MIB, Guest, guest_stat
from memqual.host.balloon.timed_move import POLLS_TIMING, STALL_S, TRACK_PERIOD_US, BalloonMover, Move
from memqual.host.core import descriptive
from memqual.host.core.record import Measurement
from memqual.host.core.shell import Shell

MIB = 1 << 20
# The guest's clock (CLOCK_MONOTONIC with high-resolution timers resolves
# 1 ns; a tick, 4 ms at HZ=250, without them) is what makes its timing finer
# than the host's QMP polls; no load on the host changes it.
GUEST_CLOCK_RESOLUTION_NS = 1000
# A host under test boots with THP off for the timed moves.  With it on,
# L1 backs the guest's memory with huge pages, the first inflate splits
# them, and khugepaged collapses them again between the moves at points of
# L1's clock that no boot repeats: the timed inflate then split 2 to 19
# of them, and took up to 3.5 % longer (docs/host-under-test.md).
HOST_UNDER_TEST_KNOBS = ("transparent_hugepage=never",)
# A timed inflate waits this long for a stalled guest: 5 of the driver's
# retries more than the floor's STALL_S, as the scenario never goes near it.
INFLATE_STALL_S = 5 * STALL_S


@dataclasses.dataclass(frozen=True)
class Step:
    fraction: float  # of the main size
    tracked: bool  # also timed inside the guest

    @property
    def main(self) -> bool:
        return self.fraction == 1.0


def plan(repeats: int, fractions: tuple[float, ...]) -> list[Step]:
    """``repeats`` main pairs (host-timed, then guest-timed too), the
    calibration sizes interleaved between the first pairs."""
    steps = [Step(1.0, False), Step(1.0, True)]
    for i in range(repeats - 1):
        if i < 2 * len(fractions):
            steps.append(Step(fractions[i % len(fractions)], False))
        steps += [Step(1.0, False), Step(1.0, True)]
    return steps


def safe_inflate_bytes(mem_available_kib: int, margin_mib: int) -> int:
    """What the guest can safely give: its own MemAvailable less a margin.
    (Probing the floor means dwelling at the guest's min watermark, which the
    correctness scenario does once; the timing scenario's inflates must not
    risk it.)"""
    return (mem_available_kib * 1024 - margin_mib * MIB) // PAGE * PAGE


@dataclasses.dataclass(frozen=True)
class Cycle:
    """One inflate and deflate of the plan, with the guest's counters and
    QEMU's RSS around it.  ``deflate`` and the later readings are None when
    the inflate did not reach its target."""

    step: Step
    size_bytes: int
    before: dict[str, int]
    rss_before_kib: int
    inflate: Move
    after: dict[str, int] | None = None
    rss_after_kib: int | None = None
    deflate: Move | None = None
    restored: dict[str, int] | None = None
    # What the host's THP counters moved by in the inflate (host_thp), where read.
    host_thp: dict[str, int] | None = None

    def cross_check(self) -> dict[str, Any]:
        """The inflate as the guest's balloon_inflate counter and MemTotal
        saw it, and QEMU's RSS around it."""
        assert self.after is not None
        return {
            "pages": self.inflate.host.pages,
            "balloon_inflate_delta": self.after["balloon_inflate"] - self.before["balloon_inflate"],
            "mem_total_drop_pages": (self.before["mem_total_kib"] - self.after["mem_total_kib"]) * 1024 // PAGE,
            "rss_before_kib": self.rss_before_kib,
            "rss_after_kib": self.rss_after_kib,
            "guest_timed": self.step.tracked,
            **({"host_thp": self.host_thp} if self.host_thp is not None else {}),
        }


def run_cycle(
    ssh: Shell, ctl: BalloonController, mover: BalloonMover, agent: str, step: Step, size_bytes: int, touch_mib: int
) -> Cycle:
    """Inflate ``size_bytes`` and deflate back, as the plan's ``step`` says."""
    if touch_mib:
        # touch and free: these pages are resident in QEMU until ballooned
        before = agent_stat(ssh.run([agent, "hold", str(touch_mib), "0"], timeout=120).stdout)
    else:
        before = guest_stat(ssh, agent)
    ram = ctl.ram_bytes()
    rss_before = ctl.rss_kib()
    thp_before = ctl.host_thp() if ctl.host_thp is not None else None
    inflate = mover.move(ram - size_bytes, stall_s=INFLATE_STALL_S, tracked=step.tracked)
    thp = host_thp.difference(thp_before, ctl.host_thp()) if ctl.host_thp and thp_before is not None else None
    cycle = Cycle(step, size_bytes, before, rss_before, inflate, host_thp=thp)
    if not inflate.reached:
        return cycle
    rss_after = ctl.rss_kib()
    after = guest_stat(ssh, agent)
    deflate = mover.move(ram, tracked=step.tracked)
    restored = guest_stat(ssh, agent) if deflate.reached else None
    return dataclasses.replace(cycle, after=after, rss_after_kib=rss_after, deflate=deflate, restored=restored)


@dataclasses.dataclass
class TimingRun:
    """The cycles of one guest's run, and its records."""

    memory_mib: int
    ram_bytes: int
    full_bytes: int  # the main size
    touch_mib: int
    margin_mib: int
    machine: str
    first: dict[str, int]  # the guest's counters before the first cycle
    cycles: list[Cycle] = dataclasses.field(default_factory=list)
    host_timing: str = POLLS_TIMING  # the mover's (BalloonMover.host_timing)
    host_knobs: tuple[str, ...] = ()  # a host under test's boot knobs (HOST_UNDER_TEST_KNOBS)
    started: str = ""  # how a guest-timed move starts, where not by memqual's QMP (BalloonMover.started)

    def _main(self, tracked: bool) -> list[Cycle]:
        return [c for c in self.cycles if c.step.main and c.step.tracked == tracked]

    @property
    def inflates(self) -> list[BalloonResult]:
        """The host-timed main inflates: the figures the claim uses."""
        return [c.inflate.host for c in self._main(False)]

    @property
    def deflates(self) -> list[BalloonResult]:
        return [c.deflate.host for c in self._main(False) if c.deflate]

    @property
    def guest_inflates(self) -> list[GuestTiming]:
        return [c.inflate.guest for c in self._main(True) if c.inflate.guest]

    @property
    def guest_deflates(self) -> list[GuestTiming]:
        return [c.deflate.guest for c in self._main(True) if c.deflate and c.deflate.guest]

    @property
    def observations(self) -> list[transfer_model.Observation]:
        """The model's calibration: every host-timed inflate, all sizes."""
        return [
            transfer_model.Observation.of_array_inflate(c.inflate.host.pages, c.inflate.host.seconds)
            for c in self.cycles
            if not c.step.tracked
        ]

    def prediction(self) -> dict[str, Any]:
        """The seed's table predicted from this run's calibration sizes."""
        return transfer_model.predict_seed(transfer_model.calibrate(self.observations))

    def host_thp_of(self, direction: str) -> dict[str, Any]:
        """The host's THP moves in each guest-timed inflate, where read:
        what the host did with its huge pages beside each timed figure."""
        moved = [c.host_thp for c in self._main(True) if c.host_thp is not None]
        return {"host_thp": moved} if direction == "inflate" and moved else {}

    def guest_resolution_s(self) -> float:
        return descriptive.median([g.resolution_s for g in self.guest_inflates + self.guest_deflates])

    def records(self, prediction: dict[str, Any] | None) -> list[Measurement]:
        """balloon.inflate (inflate_s, with the model's ``prediction`` if any),
        the guest-timed inflate_guest_s and deflate_guest_s, deflate_s."""
        inflates, deflates = self.inflates, self.deflates
        seconds = [r.seconds for r in inflates]
        summary = descriptive.summarize(seconds)
        gbps = [r.moved_bytes / r.seconds / 1e9 for r in inflates]
        # What was set only: the inflate size follows the guest's own
        # MemAvailable, which a kernel changes, so it is measured context.
        measured = {
            "inflate_mib": round(self.full_bytes / MIB, 1),
            "mem_available_mib": round(self.first["mem_available_kib"] / 1024, 1),
        }
        settings = {
            "guest_mib": self.memory_mib,
            "margin_mib": self.margin_mib,
            "touched_mib": self.touch_mib,
            "machine": self.machine,
            "timing": self.host_timing,
            # only where set: this machine's records keep the keys they had
            **({"host_knobs": " ".join(self.host_knobs)} if self.host_knobs else {}),
            **({"started": self.started} if self.started else {}),
            "guest_timing": f"balloon_agent track: /proc/vmstat balloon counters every {TRACK_PERIOD_US} us, "
            "back to back near the first change and the end (CLOCK_MONOTONIC)",
        }

        def seconds_record(
            scenario: str, metric: str, samples: list[float], claim: str | None = None, **extra: Any
        ) -> Measurement:
            """A lower-is-better record in seconds with this run's settings,
            the measured context and the spread of ``samples`` in ``extra``."""
            spread = descriptive.summarize(samples)
            return Measurement(
                scenario=scenario,
                claim=claim,
                metric=metric,
                unit="s",
                better="lower",
                samples=samples,
                settings=settings,
                extra={**measured, "cv": spread.cv, "summary": spread.to_json(), **extra},
            )

        model = {} if prediction is None else {"model": prediction}
        out = [
            seconds_record(
                "balloon.inflate",
                "inflate_s",
                seconds,
                claim="balloon-bitmap",
                gbps=descriptive.median(gbps),
                gbps_samples=gbps,
                pages_per_s=descriptive.median([r.pages / r.seconds for r in inflates]),
                ratio_of_guest=self.full_bytes / self.ram_bytes,
                poll_period_s=descriptive.median([r.poll_period_s for r in inflates]),
                resolution_s_median=descriptive.median([r.resolution_s for r in inflates]),
                resolution_s_max=max(r.resolution_s for r in inflates),
                cross_checks=[c.cross_check() for c in self.cycles if c.step.main],
                # host-timed seconds of the guest-timed repeats over those of
                # the host-only ones: what the guest's poller costs a move
                tracker_cost=descriptive.median([c.inflate.host.seconds for c in self._main(True)]) / summary.median,
                calibration_samples=[o.__dict__ for o in self.observations],
                seed_ms={f"bitmap{k}": v for k, v in transfer_model.SEED_MS.items()},
                seed_gbps={f"bitmap{k}": transfer_model.seed_gbps(v) for k, v in transfer_model.SEED_MS.items()},
                **model,
            )
        ]
        for direction, timings in (("inflate", self.guest_inflates), ("deflate", self.guest_deflates)):
            out.append(
                seconds_record(
                    f"balloon.{direction}",
                    f"{direction}_guest_s",
                    [g.seconds for g in timings],
                    gbps=descriptive.median([g.pages * PAGE / g.seconds / 1e9 for g in timings]),
                    resolution_s_median=descriptive.median([g.resolution_s for g in timings]),
                    resolution_s_max=max(g.resolution_s for g in timings),
                    poll_period_s=descriptive.median([g.period_s for g in timings]),
                    timed="in the guest: first poll that saw the counter move to the poll that saw "
                    "it reach the pages asked",
                    **self.host_thp_of(direction),
                )
            )
        out.append(
            seconds_record(
                "balloon.deflate",
                "deflate_s",
                [r.seconds for r in deflates],
                gbps=descriptive.median([r.moved_bytes / r.seconds / 1e9 for r in deflates]),
            )
        )
        return out


def run_timing(
    guest: Guest,
    ctl: BalloonController,
    mover: BalloonMover,
    agent: str,
    memory_mib: int,
    touch_mib: int,
    fractions: tuple[float, ...],
    repeats: int,
    machine: str,
    host_knobs: tuple[str, ...] = (),
) -> TimingRun:
    """The plan's cycles in one guest: the main size is what the guest can
    safely give (its MemAvailable less MARGIN_MIB).  Stops after the first
    cycle whose inflate or deflate did not reach its target (the balloon is
    then not back at RAM): ``cycle_problems`` says so."""
    first = guest_stat(guest.ssh, agent)
    full = safe_inflate_bytes(first["mem_available_kib"], MARGIN_MIB)
    run = TimingRun(
        memory_mib,
        ctl.ram_bytes(),
        full,
        touch_mib,
        MARGIN_MIB,
        machine,
        first,
        host_timing=mover.host_timing,
        host_knobs=host_knobs,
        started=mover.started,
    )
    # L1 sends its targets in whole MiB (the human monitor's unit)
    unit = MIB if mover.at_mark is not None else PAGE
    for step in plan(repeats, fractions):
        size = int(full * step.fraction) // unit * unit
        cycle = run_cycle(guest.ssh, ctl, mover, agent, step, size, touch_mib)
        run.cycles.append(cycle)
        if cycle.deflate is None or not cycle.deflate.reached:
            break
    return run


def cycle_problems(cycle: Cycle, first: dict[str, int], touch_mib: int, same_clock: bool) -> list[str]:
    """What is wrong with one cycle (empty: nothing): both moves reached,
    the guest's window inside the host's (``same_clock``: not on icount,
    where a guest second is a count of instructions), every page moved,
    MemTotal back to the page; for a main cycle also the guest's
    balloon_inflate counter and MemTotal within 1 % of the pages, and QEMU's
    RSS down by a quarter of the touched memory."""
    inflate, deflate = cycle.inflate, cycle.deflate
    if not inflate.reached:
        return [f"inflate to {inflate.host.target_bytes} stopped at {inflate.host.actual_bytes}"]
    if deflate is None or not deflate.reached or cycle.restored is None:
        return ["deflate did not return to guest RAM"]
    problems = []
    if inflate.guest and deflate.guest:
        for host_side, guest_side in ((inflate.host, inflate.guest), (deflate.host, deflate.guest)):
            # The guest's first-to-last window lies inside the host's
            # command-to-reached window, up to both resolutions.
            slack = host_side.resolution_s + guest_side.resolution_s
            if same_clock and guest_side.seconds > host_side.seconds + slack:
                problems.append(f"guest timed {guest_side} against host {host_side}")
            if guest_side.moved < inflate.pages_asked:
                problems.append(f"the guest saw {guest_side.moved} of {inflate.pages_asked} pages move")
    if abs(cycle.restored["mem_total_kib"] - first["mem_total_kib"]) > PAGE // 1024:
        problems.append(
            f"MemTotal {cycle.restored['mem_total_kib']} KiB after the deflate, {first['mem_total_kib']} before"
        )
    if not cycle.step.main:
        return problems
    check = cycle.cross_check()
    pages = check["pages"]
    if abs(check["balloon_inflate_delta"] - pages) > 0.01 * pages:
        problems.append(f"balloon_inflate delta: {check}")
    if abs(check["mem_total_drop_pages"] - pages) > 0.01 * pages:
        problems.append(f"MemTotal drop: {check}")
    if touch_mib and check["rss_after_kib"] >= check["rss_before_kib"] - touch_mib * 1024 // 4:
        problems.append(f"RSS did not fall by a quarter of the {touch_mib} MiB touched: {check}")
    return problems


def guest_timing_problems(clock: GuestClock, timings: list[GuestTiming]) -> list[str]:
    """What a loaded host cannot disturb in the guest's timing: its clock's
    resolution, and that every move spanned the gap between its polls."""
    problems = []
    if clock.resolution_ns > GUEST_CLOCK_RESOLUTION_NS:
        problems.append(f"the guest's clock is coarse: {clock} (no hrtimers?)")
    if not timings:
        problems.append("no move was timed in the guest")
    problems += [f"a move fell between two of the guest's polls: {t}" for t in timings if t.resolution_s >= t.seconds]
    return problems


def summary(run: TimingRun, prediction: dict[str, Any] | None) -> list[str]:
    """A run's figures as log lines: the model against seed 003, the
    inflate's median and spread, the guest's and the host's resolution."""
    lines = []
    if prediction is not None:
        lines.append("model against seed 003 (predicted ms for 15 of 16 GiB on this host):")
        lines += ["  {} | seed {} ms | {} | {}".format(*row) for row in transfer_model.side_by_side(prediction)]
    seconds = [r.seconds for r in run.inflates]
    lines.append(
        f"inflate {run.full_bytes / MIB:.0f} MiB of {run.memory_mib} MiB: median {descriptive.median(seconds):.3f} s "
        f"({descriptive.median([r.moved_bytes / r.seconds / 1e9 for r in run.inflates]):.3f} GB/s, "
        f"CV {descriptive.cv(seconds):.2f}); seed 512 KB bitmap {transfer_model.seed_gbps(1237):.2f} GB/s"
    )
    timings = run.guest_inflates + run.guest_deflates
    if run.guest_inflates:
        lines.append(
            f"guest-timed inflate: median {descriptive.median([g.seconds for g in run.guest_inflates]):.3f} s "
            "at resolution "
            f"{1e3 * descriptive.median([g.resolution_s for g in run.guest_inflates]):.2f} ms (host-timed resolution "
            f"{1e3 * descriptive.median([r.resolution_s for r in run.inflates]):.2f} ms)"
        )
    if timings:
        lines.append(
            "guest-timed resolution (the gap between polls around each end): "
            f"median {1e3 * descriptive.median([t.resolution_s for t in timings]):.2f} ms, "
            f"max {1e3 * max(t.resolution_s for t in timings):.2f} ms"
        )
    return lines

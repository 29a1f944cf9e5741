"""A/B runs in blocks: both arms' images built first, A and B interleaved as
Avocado variants inside one job (A B, then B A), the records split per
arm, more blocks while a primary is undecided (--until-decided, the
negative controls with them until they can tell), and the run's outcome
(host/judge/ab_outcome.py: the deciding table, the controls' power, the
exit status) built once and rendered: comparison.json and .html.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memqual.host.core import record
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.paths import write_private_atomic
from memqual.host.core.printable import one_line
from memqual.host.judge import clock_plan, control_power, verdicts
from memqual.host.judge.ab_outcome import of_results
from memqual.host.judge.control_power import ControlPower
from memqual.host.judge.exit_status import ExitStatus
from memqual.host.judge.primaries import is_control
from memqual.host.judge.sequential_run import AddedBlock, ControlLook, SequentialRun
from memqual.host.judge.until_decided import LookResult, Tracker
from memqual.host.report.compare_text import print_comparison
from memqual.host.run import blocks, budget, look_outputs
from memqual.host.run.block_jobs import BlockRequest, listed_tests, run_block_jobs
from memqual.host.run.config import Arm, GuestKernel, JobOutcome, RunConfig, TestOutcome, qemu_json
from memqual.host.run.outputs import ArmRecords, exit_status, write_arm_outputs
from memqual.images import balloon_driver, built_kernels

if TYPE_CHECKING:  # imported where used: a run loads the reporting only at its end
    from rich.console import Console

    from memqual.host.judge.results import Results

# ------------------------------------------------------- A/B in blocks


def make_tracker(config: RunConfig | None = None) -> Tracker:
    threshold, alpha = decision_levels(config)
    return Tracker(threshold=threshold, alpha=alpha)


def decision_levels(config: RunConfig | None) -> tuple[float, float]:
    """The run's --threshold and --alpha, else compare's defaults."""
    threshold = config.threshold if config is not None and config.threshold is not None else None
    alpha = config.alpha if config is not None and config.alpha is not None else None
    return (
        verdicts.DEFAULT_THRESHOLD if threshold is None else threshold,
        verdicts.DEFAULT_ALPHA if alpha is None else alpha,
    )


def prebuild(kernels: tuple[GuestKernel, ...], console: Console) -> None:
    """The given kernels' images and balloon driver variants, before any
    job: a kernel that cannot be built is bad input before anything ran,
    not a job of skips."""
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import KernelSource, build

    for k in kernels:
        try:
            image = build(KernelSource(k.bzimage, k.modules))
        except (CapabilityMissing, OSError, subprocess.CalledProcessError) as exc:
            raise BadInput(f"kernel {k.label} ({k.bzimage}): its guest image cannot be built: {exc}") from None
        try:
            if k.kernel_build is not None:
                variant = balloon_driver.build_from_tree(k.kernel_build, image.release)
            elif balloon_driver.debian_release_of(k.bzimage):
                variant = balloon_driver.build(image.release)
            elif built_kernels.of_bzimage(k.bzimage) is not None:
                # memqual kernel build made the variant beside the kernel,
                # or said why it could not (the tree's virtio_balloon.c)
                try:
                    built = balloon_driver.built_variant(k.bzimage)
                except CapabilityMissing as exc:
                    console.print(
                        f"kernel {k.label}: no balloon driver variant ({exc}): the balloon driver scenario skips on it",
                        highlight=False,
                        markup=False,
                    )
                    continue
                assert built is not None
                variant = built
            else:
                console.print(
                    f"kernel {k.label}: no --kernel-build tree, so the balloon driver scenario skips on it",
                    highlight=False,
                    markup=False,
                )
                continue
        except (CapabilityMissing, OSError, subprocess.CalledProcessError) as exc:
            raise BadInput(f"kernel {k.label}: its balloon driver variant cannot be built: {exc}") from None
        console.print(f"kernel {k.label}: image {image.release}, balloon driver {variant.ko}", highlight=False)


@dataclasses.dataclass
class BlockedRun:
    """The jobs of an A/B run and what their records say."""

    jobs: list[JobOutcome] = dataclasses.field(default_factory=list)
    records: list[Any] = dataclasses.field(default_factory=list)  # stamped with arm and block
    problems: list[str] = dataclasses.field(default_factory=list)
    tests: list[tuple[int, TestOutcome]] = dataclasses.field(default_factory=list)
    scenario_tests: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # scenario -> test names
    test_seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # test name -> each variant's
    # Test name -> how many of its runs went at a time (tests sharing the
    # host on icount; 1, the default, for the rest).
    slots: dict[str, int] = dataclasses.field(default_factory=dict)
    blocks: int = 0

    def take(self, job: JobOutcome, in_blocks: bool = True, slots: int = 1) -> None:
        """Add a finished job: its records stamped with the arm and block of
        the variant that wrote them.  Only a block job's tests are the ones
        more blocks of a scenario re-run: a once-per-arm check that records
        the same scenario (an off-control) runs once, and its time is no
        part of a block's."""
        self.jobs.append(job)
        number = len(self.jobs)
        self.tests += [(number, t) for t in job.tests]
        for t in job.tests:
            if t.time is not None:
                self.test_seconds.setdefault(t.id.split(";", 1)[0], []).append(float(t.time))
            if in_blocks:
                self.slots[t.id.split(";", 1)[0]] = slots
        if job.job_dir is None:
            return
        names = job.test_names

        for path in sorted(job.job_dir.rglob(record.RECORD_GLOB)):
            try:
                m = record.load(path)
            except BadInput as exc:
                self.problems.append(str(exc))
                continue
            test_dir = blocks.record_test_dir(path)
            where = blocks.arm_and_block(test_dir.name) if test_dir else None
            if where is None:
                self.problems.append(f"{path}: not from a variant of this run (no arm, no block)")
                continue
            blocks.stamp(m, *where)
            self.records.append(m)
            name = names.get(test_dir.name) if test_dir else None
            if name and in_blocks:
                self.scenario_tests.setdefault(m.scenario, set()).add(name.split(";", 1)[0])

    def of_arm(self, arm: str) -> list[Any]:
        return [m for m in self.records if m.arm == arm]

    def tests_of_arm(self, arm: str) -> list[tuple[int, TestOutcome]]:
        return [(n, t) for n, t in self.tests if (blocks.arm_and_block(t.id) or ("",))[0] == arm]

    def seconds_per_block(self, names: set[str]) -> float:
        """About how long one more block of these tests takes: each test's
        mean time per variant, twice (A and B), shared among the runs that
        went at a time."""
        # At most its A and B side by side are counted: an estimate that
        # errs long, as a budget's should.
        return sum(
            2 * sum(self.test_seconds[n]) / len(self.test_seconds[n]) / min(self.slots.get(n, 1), 2)
            for n in names
            if self.test_seconds.get(n)
        )


# memqual's own look between two jobs of blocks (reading the records,
# comparing): 0.2-1.2 s measured here.
LOOK_S = 1.5

# The negative controls (the host-only /dev/kvm benchmarks) run in every
# added block until they have at least this many blocks AND their power to
# catch a 10 % host drift at the last look's alpha is 80 % (host/judge/
# control_power.py); after that they leave the further blocks.  Measured
# through the real decision code on 26 controls (docs/ab-calibration.md,
# "Negative controls"): at a block spread of 2 % the power at a look's
# share of 0.001-0.0032 is 0-8 % on 2 blocks, 8-52 % on 3, 39-100 % on 4
# and 100 % on 6; at 5 % it needs 6-8 blocks.  They cost about 22 s a
# block here (two tests, 0.7 and 9.0 s an arm, and four test runs' job
# overhead), 6 % of a block of every scenario but a quarter of the
# one-scenario blocks late in a run, which is why they stop once they can
# tell.  A drift between A and B that the blocks do not cancel is the
# order of the arms inside a block (ABBA), the same in every block, so six
# blocks of it characterize it.
MIN_CONTROL_BLOCKS = 6


def say_sharing(config: RunConfig, slots: int, console: Console) -> None:
    """Which tests share the host on the run's clock, ``slots`` runs at a time."""
    sharing = sorted(t for t in clock_plan.beside_others_tests() if clock_plan.runs_beside_others(t, config.clock))
    if config.hosts and config.clock.icount:
        console.print(
            f"on {config.clock.label} every test's guests run on a host under test of their own, whose instructions "
            f"are the clock: the tests share this machine, {slots} run(s) at a time ({blocks.SLOTS_BY})",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    elif sharing:
        console.print(
            f"on {config.clock.strictest().label} these tests measure counts of their guests' instructions and share "
            f"the host, {slots} run(s) at a time ({blocks.SLOTS_BY}): {', '.join(sharing)}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def run_blocked(config: RunConfig, run_arms: tuple[Arm, Arm], console: Console) -> int:
    """Two arms (two kernels, two QEMUs, or two of each), interleaved: the
    images and balloon drivers of the given kernels built, then the
    once-per-arm tests (block 1 of each arm) and ONE job in which every
    other test runs its blocks A B, B A, ...; with until_decided, more
    blocks of only the tests whose scenarios are undecided."""
    started = time.monotonic()
    given = {a.kernel.bzimage: a.kernel for a in run_arms if a.kernel is not None}
    prebuild(tuple(given.values()), console)
    for a in run_arms:
        console.print(f"arm {a.label}: {arm_line(a)}", highlight=False, markup=False, soft_wrap=True)
    arms = {a.label: a.variant_params() for a in run_arms}
    run_state = BlockedRun()
    slots = blocks.host_slots()
    say_sharing(config, slots, console)

    def job(
        selection: str, first: int, count: int, references: tuple[str, ...] = (), listed: list[str] | None = None
    ) -> None:
        """A job of ``selection``'s tests (those ``references`` name, else the
        selection's, which ``listed`` holds where avocado listed them
        already).  A selection avocado lists no test of (--only chose none
        of them) starts no job: nothing runs, nothing fails."""
        if not references and listed is None:
            listed = listed_tests(config, selection)
        if listed == []:
            which = "once-per-arm tests" if selection == "once" else "tests that run in blocks"
            console.print(
                f"no {which} selected" + ("" if selection == "once" else ": nothing to compare"),
                highlight=False,
                markup=False,
            )
            return
        number = len(run_state.jobs) + 1
        order = blocks.block_order(first, count)
        request = BlockRequest(arms, order, selection, references, None if references else listed)
        for done in run_block_jobs(config, request, number, console, slots):
            outcome = done.outcome
            what = "once per arm" if selection == "once" else f"block(s) {first}-{first + count - 1}"
            if done.slots > 1:
                what += f", {done.tests} test(s) sharing the host on icount, {done.slots} runs at a time"
            console.print(
                f"job {len(run_state.jobs) + 1} ({what}) avocado: {outcome.summary or 'no summary'} "
                f"(exit {outcome.exit_status}); job directory {outcome.job_dir}",
                highlight=False,
                soft_wrap=True,
                markup=False,
            )
            run_state.take(outcome, in_blocks=selection != "once", slots=done.slots)

    # The once-per-arm checks pass or fail; no decision reads them.  Under
    # --until-decided they run after the looks, with their time kept from
    # the budget, so that every decision comes that much sooner (some 3.5
    # minutes here); otherwise, and when avocado cannot list them, first.
    checks = checks_after_looks(config, console) if config.until_decided else None
    if checks is None:
        job("once", 1, 1)
    job("blocks", 1, config.rounds)
    run_state.blocks = config.rounds
    looks: SequentialRun | None = None
    reserve_s = 0.0
    if config.until_decided:
        reserve_s = blocks.checks_reserve_s(len(checks or ()), config.clock.icount)

        def at_look(so_far: SequentialRun, now: LookResult, power: tuple[int | None, ControlPower]) -> None:
            look_outputs.write_look(config, run_arms, run_state, so_far, now, power)

        looks = add_blocks_until_decided(config, run_state, job, started, console, reserve_s=reserve_s, at_look=at_look)
    if checks:
        looks = checks_in_budget(
            config, len(checks), reserve_s, started, lambda: job("once", 1, 1, listed=checks), console, looks
        )
    results = []
    for a in run_arms:
        results.append(write_arm_outputs(config.output / a.label, ArmRecords.so_far(run_state, a), config, console))
    # With --until-decided the run's decisions are the looks' (each at its
    # share of alpha); the comparison of the whole run at the full alpha
    # after optional stopping would not hold its error rate: it is shown
    # as descriptive and sets no exit status.
    decided = _compare_arms(config, run_arms, results, console, looks)
    if decided == ExitStatus.HOST_DRIFTED:
        console.print("[bold red]a negative control moved: the host drifted, exit 3[/]", highlight=False)
    elif decided == ExitStatus.SLOWER:
        console.print("[bold red]a primary metric is slower on B, exit 1[/]", highlight=False)
    return max(exit_status(run_state.jobs, console), int(decided))


def checks_in_budget(
    config: RunConfig,
    checks: int,
    reserve_s: float,
    started: float,
    run: Callable[[], None],
    console: Console,
    looks: SequentialRun | None,
) -> SequentialRun | None:
    """The once-per-arm checks after the looks (``run``), when what is left
    of the budget holds them (host/run/budget.py); when not, the ``looks``
    say why, in until-decided.json too."""
    why = budget.run_checks(config, checks, reserve_s, time.monotonic() - started, run, console)
    if why is None or looks is None:
        return looks
    looks = dataclasses.replace(looks, checks_not_run=why)
    look_outputs.write_summary(config.output, looks)
    return looks


def checks_after_looks(config: RunConfig, console: Console) -> list[str] | None:
    """The once-per-arm checks a run after its looks will make (empty:
    none selected), or None when avocado could not list them (they then
    run first, as without --until-decided)."""
    checks = listed_tests(config, "once")
    if checks:
        console.print(
            f"the {len(checks)} once-per-arm checks run after the looks: about "
            f"{blocks.checks_reserve_s(len(checks), config.clock.icount) / 60:.1f} min of the budget kept for "
            f"them ({config.clock.label})",
            highlight=False,
            markup=False,
        )
    return checks


def add_blocks_until_decided(
    config: RunConfig,
    run_state: BlockedRun,
    job: Any,
    started: float,
    console: Console,
    reserve_s: float = 0.0,
    at_look: Callable[[SequentialRun, LookResult, tuple[int | None, ControlPower]], None] | None = None,
) -> SequentialRun:
    """More blocks (the order going on ABBA) of only the tests whose
    scenarios have an undecided primary that the budget can still decide,
    until none has, the budget is spent, or its alpha is; the negative
    controls' tests ride along in each added block until they can tell
    (MIN_CONTROL_BLOCKS, 80 % power); writes OUTPUT/until-decided.json
    (with the controls' blocks at each look, for their power).  ``reserve_s`` of the budget is kept for
    what runs after the looks (the once-per-arm checks): the looks' clock
    is the rest.  ``at_look`` is given the looks so far (unfinished), the
    look just taken and the controls' power at it after each look
    (host/run/look_outputs.py writes them), so that a run ended later
    keeps what its looks decided.  What the looks did, for the run's
    outcome."""
    tracker = make_tracker(config)
    budget_s = config.budget_min * 60.0 - reserve_s
    budget_text = f"{config.budget_min:g} min" + (
        f", {reserve_s / 60:.1f} of them kept for the checks" if reserve_s else ""
    )

    def tests_of(scenarios: set[str]) -> set[str]:
        return set().union(*(run_state.scenario_tests.get(s, set()) for s in scenarios)) if scenarios else set()

    controls = control_tests(run_state)
    keep_controls = bool(controls)
    control_blocks = run_state.blocks if controls else 0
    control_looks: list[ControlLook] = []

    def block_s(scenarios: set[str]) -> float:
        names = tests_of(scenarios) | (controls if keep_controls else set())
        return run_state.seconds_per_block(names) + blocks.job_overhead_s(2 * len(names)) + LOOK_S

    # The scenarios the next block would run, as known before a look: a
    # look after which that block cannot fit the budget is the last, and
    # spends all the alpha left (when it falls is a matter of wall time,
    # never of what it measured).
    running = set(run_state.scenario_tests)
    look = 1
    stopped = "every primary decided"
    added: list[AddedBlock] = []
    look_wall_s: list[float] = []  # when each look fell: a decision's time is its look's
    told: set[str] = set()  # the scenarios already said to be left out

    def so_far(stopped: str, finished: bool) -> SequentialRun:
        return SequentialRun(
            tracker=tracker,
            stopped=stopped,
            budget_min=config.budget_min,
            blocks=run_state.blocks,
            added=tuple(added),
            look_wall_s=tuple(look_wall_s),
            checks_reserved_s=round(reserve_s, 1),
            control_tests=tuple(sorted(controls)),
            control_blocks=control_blocks,
            min_control_blocks=MIN_CONTROL_BLOCKS,
            control_looks=tuple(control_looks),
            wall_s=round(time.monotonic() - started, 1),
            finished=finished,
        )

    while True:
        elapsed = time.monotonic() - started
        last = elapsed + block_s(running) > budget_s
        fraction = 1.0 if last else elapsed / budget_s
        look_wall_s.append(round(elapsed, 1))
        left_before = tracker.alpha_left
        now = tracker.update(look, run_state.of_arm("A"), run_state.of_arm("B"), fraction)
        decided = now.all_decided
        level = max(0.0, left_before - tracker.alpha_left)
        console.print(
            f"{tracker.progress_line()} at {elapsed / 60:.1f} of {config.budget_min:g} min",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        # The controls' power at this look, simulated once (some 2.6 s on
        # 26 controls): what the look writes and what says whether the
        # controls may leave the further blocks are the same figure.
        if controls:
            control_looks.append(ControlLook(look, control_blocks, level))
        at = (look, control_blocks, level) if controls else None
        power = control_power.of_look(now.compared, at, threshold=tracker.threshold)
        if at_look is not None:
            at_look(so_far(f"not finished: look {look} was the last taken", False), now, power)
        if keep_controls and control_blocks >= MIN_CONTROL_BLOCKS and not decided and power[1].sufficient:
            keep_controls = False
            console.print(
                f"{power[1].line()}: they leave the further blocks", highlight=False, markup=False, soft_wrap=True
            )
        if decided:
            break
        if tracker.alpha_left <= 0:
            stopped = (
                f"budget spent ({budget_text}; one more block of the undecided scenarios' "
                f"tests takes about {block_s(running) / 60:.1f} min): the last look spent the alpha left"
            )
            break
        undecided = tracker.undecided_scenarios()
        running = tracker.worth_a_block(budget_s - (time.monotonic() - started), block_s)
        for reason in tracker.futile_reasons(undecided - running - told):
            console.print(f"left out of further blocks: {reason}", highlight=False, markup=False, soft_wrap=True)
        told |= undecided - running
        if not running:
            stopped = "no undecided scenario can be decided in what is left of the budget: " + "; ".join(
                tracker.futile_reasons(undecided)
            )
            break
        names = tests_of(running)
        if not names:
            stopped = "no test left to run for the undecided scenarios: " + ", ".join(sorted(running))
            break
        need = block_s(running)
        if time.monotonic() - started + need > budget_s:
            stopped = (
                f"budget spent ({budget_text}; one more block of {len(names)} test(s) takes about {need / 60:.1f} min)"
            )
            break
        block = run_state.blocks + 1
        with_controls = names | (controls if keep_controls else set())
        job("blocks", block, 1, tuple(sorted(blocks.test_reference(n) for n in with_controls)))
        run_state.blocks = block
        control_blocks += 1 if keep_controls else 0
        added.append(
            AddedBlock(
                block,
                tuple(sorted(running)),
                tuple(sorted(with_controls)),
                keep_controls,
                tuple(sorted(undecided - running)),
            )
        )
        look += 1
    looks = so_far(stopped, True)
    look_outputs.write_summary(config.output, looks)
    console.print(
        f"until decided: {run_state.blocks} block(s), {stopped}", highlight=False, markup=False, soft_wrap=True
    )
    console.print(f"wrote {config.output / 'until-decided.json'}", highlight=False, markup=False)
    return looks


def control_tests(run_state: BlockedRun) -> set[str]:
    """The block tests of the negative controls' scenarios."""
    return {name for scenario, names in run_state.scenario_tests.items() if is_control(scenario) for name in names}


def arm_line(arm: Arm) -> str:
    """What an arm is made of, in one line: its kernel, its QEMU and its host."""
    kernel = f"kernel {arm.kernel.bzimage}" if arm.kernel is not None else "the default kernel"
    qemu = (
        f"QEMU {arm.qemu.version} ({arm.qemu.origin})"
        if arm.qemu is not None
        else "the QEMU of the environment ($MEMQUAL_QEMU or the system's)"
    )
    host = f"host {arm.host.name} (under test)" if arm.host is not None else "this machine's host"
    return f"{kernel}, {qemu}, {host}"


def _compare_arms(
    config: RunConfig,
    arms: tuple[Arm, Arm],
    results: list[Results],
    console: Console,
    looks: SequentialRun | None = None,
) -> ExitStatus:
    """The run's outcome, built once from the two arms' results (and with
    --until-decided from the ``looks``, whose decisions it takes; the whole
    run compared again is its descriptive part) and rendered:
    comparison.json and .html and the terminal's table.  Its exit status;
    without a comparison, the looks' (none: 0)."""
    try:
        threshold, alpha = decision_levels(config)
        # an A/B of host kernels compares two hosts on purpose
        across_hosts = arms[0].host != arms[1].host
        outcome = of_results(
            [results[0]], [results[1]], looks, threshold=threshold, alpha=alpha, across_hosts=across_hosts
        )
    except BadInput as exc:
        console.print(f"[yellow]no comparison of A and B:[/] {exc}", highlight=False)
        return looks.exit_status if looks is not None else ExitStatus.NO_REGRESSION
    for a in arms:
        console.print(f"{a.label}: {arm_line(a)}", highlight=False, markup=False, soft_wrap=True)
    out = outcome.to_json()
    out.update({"a": str(config.output / "A" / "results.json"), "b": str(config.output / "B" / "results.json")})
    out["arms"] = {
        a.label: {
            "kernel": str(a.kernel.bzimage) if a.kernel is not None else None,
            "kernel_sha256": a.kernel.sha256 if a.kernel is not None else None,
            "qemu": qemu_json(a.qemu),
            "host": a.host.to_json() if a.host is not None else None,
        }
        for a in arms
    }
    names = ("A", "B")
    if config.patch is not None:  # memqual run --patch: A and B built from source
        out["patch"] = config.patch.to_json()
        names = config.patch.arm_names()
    if config.host_patch is not None:  # memqual run --host-patch: the host kernels built from source
        out["host_patch"] = config.host_patch.to_json()
        names = config.host_patch.arm_names()
        # file names from the user's patch: shown escaped
        console.print(one_line(config.host_patch.axis()), highlight=False, markup=False, soft_wrap=True)
    write_private_atomic(config.output / "comparison.json", (json.dumps(out, indent=2) + "\n").encode(), 0o644)
    print_comparison(outcome, console, *names)
    # lazy: the pages bring jinja2, numpy and scipy (~300 ms); only this path writes one
    from memqual.host.report.compare_report import comparison_page, write_comparison_html

    page = comparison_page(
        outcome, results[0], results[1], *names, patch=out.get("patch"), host_patch=out.get("host_patch")
    )
    write_comparison_html(page, config.output / "comparison.html")
    console.print(f"wrote {config.output / 'comparison.json'} and {config.output / 'comparison.html'}", highlight=False)
    return outcome.exit_status

"""A/B runs in blocks: both arms' images built first, A and B interleaved as
Avocado variants inside one job (A B, then B A), the records split per
arm, more blocks while a primary is undecided (--until-decided), and the
two arms compared.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from memqual.host.core.errors import BadInput
from memqual.host.core.paths import write_private_atomic
from memqual.host.run.avocado import run_avocado
from memqual.host.run.config import Arm, GuestKernel, JobOutcome, RunConfig, TestOutcome, arm_params, qemu_json
from memqual.host.run.outputs import exit_status, write_arm_outputs
from memqual.host.run.signals import terminate_as_exception

if TYPE_CHECKING:  # imported where used: a run loads the reporting only at its end
    from memqual.host.judge.results import Results

# ------------------------------------------------------- A/B in blocks


class DecisionTracker(Protocol):
    """What the run needs of host/run/bisect/until.py's Tracker."""

    @property
    def alpha_left(self) -> float: ...
    def update(self, look: int, records_a: list[Any], records_b: list[Any], fraction: float = 1.0) -> bool: ...
    def undecided_scenarios(self) -> set[str]: ...
    def worth_a_block(self, left_s: float, block_s: Callable[[set[str]], float]) -> set[str]: ...
    def futile_reasons(self, scenarios: set[str]) -> list[str]: ...
    def progress_line(self) -> str: ...
    def exit_status(self) -> int: ...
    def to_json(self, stopped: str, budget_min: float) -> dict[str, Any]: ...


def make_tracker() -> DecisionTracker:
    from memqual.host.judge import comparison
    from memqual.host.run.bisect.until import Tracker

    return cast(DecisionTracker, Tracker(threshold=comparison.DEFAULT_THRESHOLD, alpha=comparison.DEFAULT_ALPHA))


def prebuild(kernels: tuple[GuestKernel, ...], console: Any) -> None:
    """The given kernels' images and balloon driver variants, before any
    job: a kernel that cannot be built is bad input before anything ran,
    not a job of skips."""
    from memqual.host.core.errors import CapabilityMissing
    from memqual.images import balloon_driver, built_kernels
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
    blocks: int = 0

    def take(self, job: JobOutcome, in_blocks: bool = True) -> None:
        """Add a finished job: its records stamped with the arm and block of
        the variant that wrote them.  Only a block job's tests are the ones
        more blocks of a scenario re-run: a once-per-arm check that records
        the same scenario (an off-control) runs once, and its time is no
        part of a block's."""
        from memqual.host.run import blocks

        self.jobs.append(job)
        number = len(self.jobs)
        self.tests += [(number, t) for t in job.tests]
        for t in job.tests:
            if t.time is not None:
                self.test_seconds.setdefault(t.id.split(";", 1)[0], []).append(float(t.time))
        if job.job_dir is None:
            return
        names = _logdir_names(job.job_dir)
        from memqual.host.core import record

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
        from memqual.host.run import blocks

        return [(n, t) for n, t in self.tests if (blocks.arm_and_block(t.id) or ("",))[0] == arm]

    def seconds_per_block(self, names: set[str]) -> float:
        """About how long one more block of these tests takes: each test's
        mean time per variant, twice (A and B)."""
        return sum(2 * sum(self.test_seconds[n]) / len(self.test_seconds[n]) for n in names if self.test_seconds.get(n))


def _logdir_names(job_dir: Path) -> dict[str, str]:
    """Results directory name -> test name, from avocado's results.json."""
    try:
        data = json.loads((job_dir / "results.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {Path(str(t.get("logdir") or "")).name: str(t.get("name") or "") for t in data.get("tests", [])}


# memqual's own look between two jobs of blocks (reading the records,
# comparing): 0.2-1.2 s measured here.
LOOK_S = 1.5


def run_block_job(
    config: RunConfig,
    arms: dict[str, Any],
    order: list[tuple[int, str]],
    number: int,
    console: Any,
    selection: str = "blocks",
    references: tuple[str, ...] = (),
) -> JobOutcome:
    """One avocado job of the (block, arm) variants in ``order`` (arms:
    blocks.ArmParams by arm), its variants file OUTPUT/variants/job-N.json
    and its jobs under OUTPUT/avocado; feed it to BlockedRun.take."""
    from memqual.host.run import blocks

    variants_file = config.output / "variants" / f"job-{number}.json"
    variants_file.parent.mkdir(parents=True, exist_ok=True)
    variants_file.write_text(json.dumps(blocks.variants(order, arms), indent=1) + "\n")
    job_config = dataclasses.replace(
        config,
        variants_file=variants_file,
        selection=selection,
        references=references,
        rounds=max((block for block, _ in order), default=1),
    )
    with terminate_as_exception():
        return run_avocado(job_config, config.output / "avocado", None, console, number)


def run_blocked(config: RunConfig, run_arms: tuple[Arm, Arm], console: Any) -> int:
    """Two arms (two kernels, two QEMUs, or two of each), interleaved: the
    images and balloon drivers of the given kernels built, then the
    once-per-arm tests (block 1 of each arm) and ONE job in which every
    other test runs its blocks A B, B A, ...; with until_decided, more
    blocks of only the tests whose scenarios are undecided."""
    from memqual.host.core import record
    from memqual.host.run import blocks

    started = time.monotonic()
    given = {a.kernel.bzimage: a.kernel for a in run_arms if a.kernel is not None}
    prebuild(tuple(given.values()), console)
    for a in run_arms:
        console.print(f"arm {a.label}: {arm_line(a)}", highlight=False, markup=False, soft_wrap=True)
    arms = {a.label: arm_params(a.kernel, a.qemu, a.label) for a in run_arms}
    run_state = BlockedRun()

    def job(selection: str, first: int, count: int, references: tuple[str, ...] = ()) -> None:
        number = len(run_state.jobs) + 1
        outcome = run_block_job(config, arms, blocks.block_order(first, count), number, console, selection, references)
        what = "once per arm" if selection == "once" else f"block(s) {first}-{first + count - 1}"
        if selection == "once" and outcome.job_dir is None and "could not be created" in outcome.summary:
            # --only selected none of the once-per-arm tests: nothing ran, nothing failed.
            console.print("no once-per-arm tests selected", highlight=False, markup=False)
            return
        console.print(
            f"job {number} ({what}) avocado: {outcome.summary or 'no summary'} (exit {outcome.exit_status}); "
            f"job directory {outcome.job_dir}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        run_state.take(outcome, in_blocks=selection != "once")

    # The once-per-arm checks pass or fail; no decision reads them.  Under
    # --until-decided they run after the looks, with their time kept from
    # the budget, so that every decision comes that much sooner (some 3.5
    # minutes here); otherwise, and when avocado cannot list them, first.
    checks = checks_after_looks(config, console) if config.until_decided else None
    if checks is None:
        job("once", 1, 1)
    job("blocks", 1, config.rounds)
    run_state.blocks = config.rounds
    sequential: int | None = None
    if config.until_decided:
        reserve_s = blocks.checks_reserve_s(len(checks or ()))
        sequential = add_blocks_until_decided(config, run_state, job, started, console, reserve_s=reserve_s)
    if checks:
        job("once", 1, 1)
    results = []
    for a in run_arms:
        results.append(
            write_arm_outputs(
                config.output / a.label,
                record.merge_rounds(run_state.of_arm(a.label)),
                run_state.problems,
                run_state.tests_of_arm(a.label),
                run_state.jobs,
                config,
                a.kernel,
                console,
                qemu=a.qemu,
                label=a.label,
            )
        )
    compared = _compare_arms(config, run_arms, results, console)
    # With --until-decided the run's decisions are the looks' (each at its
    # share of alpha); the comparison of the whole run at the full alpha
    # after optional stopping would not hold its error rate.
    decided = compared if sequential is None else sequential
    if decided == 3:
        console.print("[bold red]a negative control moved: the host drifted, exit 3[/]", highlight=False)
    elif decided == 1:
        console.print("[bold red]a primary metric is slower on B, exit 1[/]", highlight=False)
    return max(exit_status(run_state.jobs, console), decided)


def checks_after_looks(config: RunConfig, console: Any) -> list[str] | None:
    """The once-per-arm checks a run after its looks will make (empty:
    none selected), or None when avocado could not list them (they then
    run first, as without --until-decided)."""
    from memqual.host.run import blocks
    from memqual.host.run.avocado import list_tests

    checks = list_tests(dataclasses.replace(config, selection="once"))
    if checks:
        console.print(
            f"the {len(checks)} once-per-arm checks run after the looks: about "
            f"{blocks.checks_reserve_s(len(checks)) / 60:.1f} min of the budget kept for them",
            highlight=False,
            markup=False,
        )
    return checks


def add_blocks_until_decided(
    config: RunConfig, run_state: BlockedRun, job: Any, started: float, console: Any, reserve_s: float = 0.0
) -> int:
    """More blocks (the order going on ABBA) of only the tests whose
    scenarios have an undecided primary that the budget can still decide,
    until none has, the budget is spent, or its alpha is; writes
    OUTPUT/until-decided.json.  ``reserve_s`` of the budget is kept for
    what runs after the looks (the once-per-arm checks): the looks' clock
    is the rest.  The decisions' exit status, as compare's."""
    from memqual.host.run import blocks

    tracker = make_tracker()
    budget_s = config.budget_min * 60.0 - reserve_s
    budget_text = f"{config.budget_min:g} min" + (
        f", {reserve_s / 60:.1f} of them kept for the checks" if reserve_s else ""
    )

    def tests_of(scenarios: set[str]) -> set[str]:
        return set().union(*(run_state.scenario_tests.get(s, set()) for s in scenarios)) if scenarios else set()

    def block_s(scenarios: set[str]) -> float:
        names = tests_of(scenarios)
        return run_state.seconds_per_block(names) + blocks.job_overhead_s(2 * len(names)) + LOOK_S

    # The scenarios the next block would run, as known before a look: a
    # look after which that block cannot fit the budget is the last, and
    # spends all the alpha left (when it falls is a matter of wall time,
    # never of what it measured).
    running = set(run_state.scenario_tests)
    look = 1
    stopped = "every primary decided"
    added: list[dict[str, Any]] = []
    look_wall_s: list[float] = []  # when each look fell: a decision's time is its look's
    told: set[str] = set()  # the scenarios already said to be left out
    while True:
        elapsed = time.monotonic() - started
        last = elapsed + block_s(running) > budget_s
        fraction = 1.0 if last else elapsed / budget_s
        look_wall_s.append(round(elapsed, 1))
        decided = tracker.update(look, run_state.of_arm("A"), run_state.of_arm("B"), fraction)
        console.print(
            f"{tracker.progress_line()} at {elapsed / 60:.1f} of {config.budget_min:g} min",
            highlight=False,
            markup=False,
            soft_wrap=True,
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
        job("blocks", block, 1, tuple(sorted(blocks.test_reference(n) for n in names)))
        run_state.blocks = block
        added.append(
            {
                "block": block,
                "scenarios": sorted(running),
                "tests": sorted(names),
                "left_out": sorted(undecided - running),
            }
        )
        look += 1
    summary = tracker.to_json(stopped, config.budget_min)
    summary["blocks"] = run_state.blocks
    summary["added_blocks"] = added
    summary["look_wall_s"] = look_wall_s
    summary["checks_reserved_s"] = round(reserve_s, 1)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    write_private_atomic(config.output / "until-decided.json", (json.dumps(summary, indent=2) + "\n").encode(), 0o644)
    console.print(
        f"until decided: {run_state.blocks} block(s), {stopped}", highlight=False, markup=False, soft_wrap=True
    )
    console.print(f"wrote {config.output / 'until-decided.json'}", highlight=False, markup=False)
    return tracker.exit_status()


def arm_line(arm: Arm) -> str:
    """What an arm is made of, in one line: its kernel and its QEMU."""
    kernel = f"kernel {arm.kernel.bzimage}" if arm.kernel is not None else "the default kernel"
    qemu = (
        f"QEMU {arm.qemu.version} ({arm.qemu.origin})"
        if arm.qemu is not None
        else "the QEMU of the environment ($MEMQUAL_QEMU or the system's)"
    )
    return f"{kernel}, {qemu}"


def _compare_arms(config: RunConfig, arms: tuple[Arm, Arm], results: list[Results], console: Any) -> int:
    """Compare the two arms' results, write comparison.json and .html; the
    comparison's exit status (0 when there is none)."""
    from memqual.host.judge.comparison import compare_results
    from memqual.host.report.compare_text import print_comparison

    try:
        result = compare_results(results[0], results[1])
    except BadInput as exc:
        console.print(f"[yellow]no comparison of A and B:[/] {exc}", highlight=False)
        return 0
    for a in arms:
        console.print(f"{a.label}: {arm_line(a)}", highlight=False, markup=False, soft_wrap=True)
    out = result.to_json()
    out.update({"a": str(config.output / "A" / "results.json"), "b": str(config.output / "B" / "results.json")})
    out["arms"] = {
        a.label: {
            "kernel": str(a.kernel.bzimage) if a.kernel is not None else None,
            "kernel_sha256": a.kernel.sha256 if a.kernel is not None else None,
            "qemu": qemu_json(a.qemu),
        }
        for a in arms
    }
    names = ("A", "B")
    if (config.output / "patch.json").is_file():  # memqual run --patch: A and B built from source
        out["patch"] = json.loads((config.output / "patch.json").read_text())
        titles = "; ".join(str(p["subject"]) for p in out["patch"]["patches"]) or "a second source"
        names = (f"A {out['patch']['a']['name']}", f"B {out['patch']['b']['name']} (+ {titles})")
    write_private_atomic(config.output / "comparison.json", (json.dumps(out, indent=2) + "\n").encode(), 0o644)
    print_comparison(result, console)
    from memqual.host.report.compare_report import write_comparison_html

    write_comparison_html(result, results[0], results[1], config.output / "comparison.html", *names)
    console.print(f"wrote {config.output / 'comparison.json'} and {config.output / 'comparison.html'}", highlight=False)
    return result.exit_status()

"""Running a bisect: probes made of rounds, its state on disk, its log.

Why it is built so: docs/architecture.md, "Module notes", host/run/bisect/run.py.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from memqual.host.core.errors import BadInput, MemqualError
from memqual.host.core.jsonfile import read_json
from memqual.host.core.paths import open_nofollow, write_private_atomic
from memqual.host.judge.bisect_evidence import PROBE_ALPHA, Evidence, evidence_of
from memqual.host.judge.results import metric_key
from memqual.host.run import blocks
from memqual.host.run.bisect import decide
from memqual.host.run.bisect.axis import Axis
from memqual.host.run.bisect.series import KernelSpec, MetricSpec, parse_kernel, select_metric, unknown_in_run

SCHEMA = "memqual.bisect/2"
# States written before the four verdicts: their rounds are the same, and
# every decision is recomputed from the rounds on resume.
OLD_SCHEMAS = ("memqual.bisect/1",)
PAIRED = "paired"
START = "start"
REFERENCES = (PAIRED, START)
UNDECIDED_TEXT = "undecided"
FAILED_ROUNDS_TO_SKIP = 2  # a kernel whose scenarios fail twice in a row is skipped, not retried forever


class BisectFailed(MemqualError):
    """The reference kernel itself cannot be measured: no bisect is possible."""

    exit_status = 1


@dataclasses.dataclass(frozen=True)
class Settings:
    kernels: tuple[KernelSpec, ...]
    metric: str
    threshold: float = 0.05
    budget_min: float = 30.0  # per probe
    max_rounds: int = 10  # per probe: also the looks alpha is spent over
    alpha: float = PROBE_ALPHA  # per probe, over all its looks
    reference: str = PAIRED
    only: tuple[str, ...] = ()
    profile: str = "quick"
    tests: str = ""  # what avocado runs each round: a directory, a file or one test; "" the e2e/ directory
    axis: Axis = Axis()  # what the series is of (guest or host kernels) and what stays fixed

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kernels"] = [k.name for k in self.kernels]
        d["only"] = list(self.only)
        d["axis"] = self.axis.to_json()
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settings:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["kernels"] = tuple(parse_kernel(k) for k in data["kernels"])
        values["only"] = tuple(data.get("only") or ())
        values["axis"] = Axis.from_json(data.get("axis"))
        return cls(**values)


@dataclasses.dataclass
class RoundResult:
    """What one arm of one probe step (one avocado job) gave for the metric."""

    kernel: int  # index in the series
    probe: int  # the probe it served (the reference's rounds serve one too)
    replicates: list[list[float]]  # the metric's, empty when it was not recorded
    seconds: float
    status: str  # "ok", "no metric", "failed"
    summary: str = ""
    job_dir: str | None = None
    metric_key: str | None = None
    started: str = ""
    blocks: list[int] = dataclasses.field(default_factory=list)  # one per replicate; empty in states before blocks
    arm: str = ""  # "A" (the reference's arm) or "B" (the probe's)
    step: int = 0  # the probe's step (job) that measured it, from 1; 0 in states before steps were kept

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class RoundRunner(Protocol):
    """Runs ONE avocado job of blocks ``first`` .. ``first + count - 1`` of
    the arms given ("A": the reference, "B": the probe; an arm left out does
    not run); returns its records (memqual.host.core.record Measurements, each
    stamped with its arm and blocks), the job's summary and exit status, the
    job dir."""

    def __call__(
        self, arms: dict[str, KernelSpec], first: int, count: int, directory: Path
    ) -> tuple[list[Any], str, int, str | None]: ...


@dataclasses.dataclass(frozen=True)
class Look:
    """One look at a probe: after a step (one job), what the blocks so far
    decided, and the probe's time so far."""

    step: int
    evidence: Evidence
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "seconds": self.seconds, **self.evidence.to_json()}


@dataclasses.dataclass
class ProbeRecord:
    index: int
    verdict: str  # the search's mark: good, bad or skip
    evidence: Evidence  # the last look: its decision is evidence.verdict
    rounds: int
    seconds: float
    reason: str = ""
    looks: list[Look] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "verdict": self.verdict,
            "decision": self.evidence.verdict,
            "evidence": self.evidence.to_json(),
            "rounds": self.rounds,
            "seconds": self.seconds,
            "reason": self.reason,
            "looks": [look.to_json() for look in self.looks],
        }


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Bisector:
    """One bisect in DIR; ``run()`` goes on until the search is over."""

    def __init__(
        self,
        settings: Settings,
        directory: Path,
        runner: RoundRunner,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.dir = directory
        self.runner = runner
        self.say = say
        self.clock = clock
        self.metric = MetricSpec(settings.metric)
        self.metric_key: str | None = None
        self.rounds: list[RoundResult] = []
        self.probes: dict[int, ProbeRecord] = {}
        self.step: str | None = None  # SLOWER or FASTER once Kn is decided bad
        self.search = decide.Bisection(len(settings.kernels))
        self.created = _now()
        self.interrupted = False
        self.better = "lower"  # the metric's direction, from its first record
        self.unit = ""
        self._order: list[int] = []  # probes in the order they were decided

    # ---------------------------------------------------------- state
    @property
    def state_path(self) -> Path:
        return self.dir / "bisect.json"

    @property
    def log_path(self) -> Path:
        return self.dir / "bisect.log"

    def to_json(self) -> dict[str, Any]:
        outcome = self.search.outcome()
        return {
            "schema": SCHEMA,
            "created": self.created,
            "updated": _now(),
            "settings": self.settings.to_json(),
            "metric_key": self.metric_key,
            "metric_unit": self.unit,
            "metric_better": self.better,
            "step": self.step,
            "rounds": [r.to_json() for r in self.rounds],
            "axis": self.settings.axis.kind,
            "probes": [self.probes[i].to_json() | {"host": self.host_name(i)} for i in sorted(self.probes)],
            "probe_order": list(self._order),
            "outcome": dataclasses.asdict(outcome) | {"text": self.outcome_text()},
            "interrupted": self.interrupted,
        }

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # never a half-written state to resume from
        write_private_atomic(self.state_path, (json.dumps(self.to_json(), indent=2) + "\n").encode(), 0o644)
        # lazy: the pages bring jinja2, numpy and scipy (~300 ms); only this path writes one
        from memqual.host.report.bisect_page import write_page

        write_page(self.to_json(), self.dir / "bisect.html")

    @classmethod
    def resume(cls, directory: Path, runner: RoundRunner, say: Callable[[str], None] = print) -> Bisector:
        data = read_json(directory / "bisect.json", "bisect state", "give the DIR of an earlier memqual bisect")
        if not isinstance(data, dict) or data.get("schema") not in (SCHEMA, *OLD_SCHEMAS):
            raise BadInput(f"{directory / 'bisect.json'}: not a memqual bisect state ({SCHEMA})")
        try:
            settings = Settings.from_json(data["settings"])
            rounds = [RoundResult(**r) for r in data["rounds"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{directory / 'bisect.json'}: incomplete bisect state ({exc})") from exc
        self = cls(settings, directory, runner, say)
        self.created = data.get("created", self.created)
        self.metric_key = data.get("metric_key")
        self.unit = data.get("metric_unit") or ""
        self.better = data.get("metric_better") or "lower"
        self.rounds = rounds
        self._log(f"# resumed {_now()} with {len(rounds)} rounds done")
        return self

    def _log(self, line: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with os.fdopen(open_nofollow(self.log_path, append=True), "a") as fh:
            fh.write(line + "\n")
        self.say(line)

    # ---------------------------------------------------------- evidence
    def _reps(self, index: int, upto: int | None = None) -> list[list[float]]:
        rounds = self.rounds if upto is None else self._probe_rounds(index, upto)
        return [rep for r in rounds if r.kernel == index and r.status == "ok" for rep in r.replicates]

    def _probe_rounds(self, probe: int, upto: int | None = None) -> list[RoundResult]:
        """The rounds run for this probe (its own and K1's beside it), of
        its first ``upto`` steps when given."""
        return [r for r in self.rounds if r.probe == probe and (upto is None or r.step <= upto)]

    def paired_blocks(
        self, index: int, upto: int | None = None
    ) -> tuple[list[list[float]], list[list[float]], list[int], list[int]]:
        """K1's and the probe's replicates of the blocks of this probe that
        both arms measured, block by block in the same order, and each
        replicate's block (empty when no block has both: the start
        reference, or a state from before blocks)."""
        by_arm: dict[str, dict[int, list[list[float]]]] = {"A": {}, "B": {}}
        for r in self._probe_rounds(index, upto):
            if r.status != "ok" or not r.blocks or r.arm not in by_arm:
                continue
            for block, rep in zip(r.blocks, r.replicates, strict=False):
                by_arm[r.arm].setdefault(block, []).append(rep)
        common = sorted(set(by_arm["A"]) & set(by_arm["B"]))
        return (
            [rep for b in common for rep in by_arm["A"][b]],
            [rep for b in common for rep in by_arm["B"][b]],
            [b for b in common for _ in by_arm["A"][b]],
            [b for b in common for _ in by_arm["B"][b]],
        )

    def evidence(self, index: int, upto: int | None = None) -> Evidence:
        """The probe decided against K1 at the look after its step ``upto``
        (the last when None): by its own blocks when paired, else against
        K1's replicates pooled (unpaired)."""
        s = self.settings
        reference, probe, ref_blocks, probe_blocks = self.paired_blocks(index, upto)
        if not probe:
            reference, probe, ref_blocks, probe_blocks = self._reps(0), self._reps(index, upto), [], []
        return evidence_of(
            reference,
            probe,
            ref_blocks or None,
            probe_blocks or None,
            threshold=s.threshold,
            alpha=s.alpha,
            planned=s.max_rounds,
            better=self.better,
        )

    def _label(self, index: int) -> str:
        return f"[K{index + 1}] {self.settings.axis.label(self.settings.kernels[index])}"

    def host_name(self, index: int) -> str:
        """The host under test kernel ``index`` of the series runs its
        guests on, as records name it ("" this machine)."""
        host = self.settings.axis.host_of(self.settings.kernels[index])
        return host.name if host is not None else ""

    @staticmethod
    def _ci_text(e: Evidence) -> str:
        if e.ratio is None:
            return "no measurement yet"
        ci = f"[{e.ci_low:.3f}, {e.ci_high:.3f}]" if e.ci_low is not None and e.ci_high is not None else "[n/a]"
        units = (
            f"{e.look} block{'s' if e.look != 1 else ''}"
            if e.paired
            else f"{e.n_reference}+{e.n_probe} replicates, unpaired"
        )
        return f"B/A {e.ratio:.3f} {ci} ({units})"

    # ---------------------------------------------------------- rounds
    def _run_step(self, index: int, paired: bool) -> list[RoundResult]:
        """One job: the next block of this probe, K1 and the probe
        interleaved (or the probe alone when not paired); one RoundResult
        an arm."""
        block = 1 + sum(1 for r in self._probe_rounds(index) if r.kernel == index)
        directory = self.dir / "rounds" / f"K{index + 1}-b{block}"
        arms = {"B": self.settings.kernels[index]}
        if paired:
            arms["A"] = self.settings.kernels[0]
        started, t0 = _now(), self.clock()
        records, summary, exit_status, job_dir = self.runner(arms, block, 1, directory)
        seconds = self.clock() - t0
        results = []
        for arm in [a for _, a in blocks.block_order(block, 1) if a in arms]:
            kernel = index if arm == "B" else 0
            mine = [m for m in records if m.arm == arm]
            rec, keys = select_metric(mine, self.metric, self.metric_key)
            if rec is None and mine and self.metric_key is None:
                # The first job that recorded anything settles whether the
                # metric exists at all: a bisect of a metric no scenario
                # records is bad input, not a series of skips.
                raise unknown_in_run(self.metric, keys)
            share = seconds / len(arms)  # the job's time, half an arm when paired
            if rec is not None:
                self.metric_key = metric_key(rec)
                self.better, self.unit = rec.better, rec.unit
                result = RoundResult(
                    kernel,
                    index,
                    [list(g) for g in rec.replicates],
                    share,
                    "ok",
                    summary,
                    job_dir,
                    self.metric_key,
                    started,
                    list(rec.blocks) if len(rec.blocks) == len(rec.replicates) else [],
                    arm,
                    block,
                )
            else:
                status = "failed" if exit_status else "no metric"
                result = RoundResult(kernel, index, [], share, status, summary, job_dir, None, started, [], arm, block)
            results.append(result)
            self.rounds.append(result)
            self._log(
                f"#   block {block} of {self._label(kernel)} (arm {arm}): {result.status}, "
                f"{len(result.replicates)} replicate(s), {seconds / 60:.1f} min job"
                + (f" ({summary})" if result.status != "ok" and summary else "")
            )
        self.save()
        return results

    def _failing(self, index: int) -> bool:
        mine = [r for r in self.rounds if r.kernel == index]
        tail = mine[-FAILED_ROUNDS_TO_SKIP:]
        return len(tail) == FAILED_ROUNDS_TO_SKIP and all(r.status != "ok" for r in tail)

    def _give_up(self, index: int, rounds: int, spent: float) -> str:
        """Why an undecided probe of kernel ``index`` ends here as a skip
        ("" when another round may run)."""
        s = self.settings
        if self._failing(index):
            return (
                f"the scenarios failed or did not record the metric on this kernel "
                f"{FAILED_ROUNDS_TO_SKIP} rounds in a row"
            )
        if rounds >= s.max_rounds:
            return f"still undecided after {rounds} steps (--max-rounds {s.max_rounds})"
        # A round of this probe: one job, the probe's arm and, paired, K1's.
        per_round = (spent / rounds) if rounds else 0.0
        if spent + per_round > s.budget_min * 60.0:
            return (
                f"still undecided when the budget ended ({s.budget_min:g} min a probe; {spent / 60:.1f} min spent, "
                f"{per_round / 60:.1f} min a step)"
            )
        return ""

    def probe(self, index: int) -> ProbeRecord:
        """Blocks of kernel ``index`` (and of K1 beside it) until decided,
        or out of budget or rounds: then undecided, and skipped."""
        s = self.settings
        last = index == len(s.kernels) - 1
        paired = s.reference == PAIRED or last
        # The looks of steps already run (a resumed bisect), as they were.
        done = self._probe_rounds(index)
        looks = [
            Look(k, self.evidence(index, k), sum(r.seconds for r in done if r.step <= k))
            for k in range(1, sum(1 for r in done if r.kernel == index))
        ]
        while True:
            evidence = self.evidence(index)
            done = self._probe_rounds(index)
            spent = sum(r.seconds for r in done)
            rounds = sum(1 for r in done if r.kernel == index)
            if rounds and (not looks or looks[-1].step != rounds):
                looks.append(Look(rounds, evidence, spent))
                self._log(
                    f"#   look {evidence.look} (step {rounds}, {spent / 60:.1f} min): "
                    f"{self._ci_text(evidence)}: {evidence.text()} at alpha {evidence.alpha:.2g}"
                )
            verdict = decide.classify(evidence, None if last else self.step)
            if verdict != decide.UNDECIDED:
                why = f"{evidence.verdict}, the other way from the last kernel" if verdict == decide.SKIP else ""
                return ProbeRecord(index, verdict, evidence, rounds, spent, why, looks)
            if self._failing(0):
                raise BisectFailed(
                    f"the reference {self._label(0)} failed {FAILED_ROUNDS_TO_SKIP} rounds in a row: "
                    f"{self.rounds[-1].summary or 'no summary'}; see {self.dir / 'rounds'}"
                )
            give_up = self._give_up(index, rounds, spent)
            if give_up:
                return ProbeRecord(index, decide.SKIP, evidence, rounds, spent, give_up, looks)
            self._run_step(index, paired)

    # ---------------------------------------------------------- the search
    def run(self) -> decide.Outcome:
        s = self.settings
        self._order = []
        self.interrupted = False
        if not self.log_path.exists():
            self._log(
                f"# memqual bisect {_now()}: metric {self.metric.text!r}, threshold {s.threshold:.0%}, "
                f"budget {s.budget_min:g} min a probe, reference {s.reference}"
            )
            self._log(f"# the series: {s.axis.describe()}")
            for i, k in enumerate(s.kernels):
                self._log(f"#   K{i + 1} = {s.axis.label(k)}")
            self._log(f"# good: {self._label(0)} (the reference)")
        try:
            while (index := self.search.next_probe()) is not None:
                if index != len(s.kernels) - 1:
                    left = len(self.search.remaining())
                    self._log(
                        f"Bisecting: {left - 1} kernel(s) left to test after this "
                        f"(roughly {max(self.search.steps_left() - 1, 0)} step(s))"
                    )
                self._log(f"{self._label(index)}")
                record = self.probe(index)
                self._order.append(index)
                self.probes[index] = record
                mark = record.verdict
                if index == len(s.kernels) - 1:
                    mark = {decide.EQUIVALENT: decide.GOOD, decide.SLOWER: decide.BAD, decide.FASTER: decide.BAD}.get(
                        record.verdict, decide.SKIP
                    )
                    if mark == decide.BAD:
                        self.step = record.verdict
                record.verdict = mark
                self.search.mark(index, mark)
                why = f"; {record.reason}" if record.reason else ""
                self._log(
                    f"# {mark}: {self._label(index)} {record.evidence.text()}: {self._ci_text(record.evidence)} "
                    f"after {record.rounds} step(s), {record.seconds / 60:.1f} min{why}"
                )
                self._log(f"memqual bisect {mark} K{index + 1}")
                self.save()
        except KeyboardInterrupt:  # Ctrl-C, and SIGTERM/SIGHUP through memqual.host.run.signals
            self.interrupted = True
            self._log(f"# stopped {_now()}: resume with memqual bisect --resume {self.dir}")
            self.save()
            raise
        except MemqualError as exc:
            self._log(f"# stopped {_now()}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            self.save()
            raise
        self._log(self.outcome_text())
        self.save()
        return self.search.outcome()

    def outcome_text(self) -> str:
        o = self.search.outcome()
        s = self.settings
        if o.kind == "first bad" and o.first_bad is not None and o.last_good is not None:
            bad = self.probes.get(o.first_bad)
            found = f" ({self._ci_text(bad.evidence)})" if bad else ""
            before = "K1 itself" if o.last_good == 0 else f"{self._label(o.last_good)} equivalent to K1"
            return (
                f"{self._label(o.first_bad)} is the first bad kernel: {self.metric.text} {self.step} than "
                f"{self._label(0)} beyond {s.threshold:.0%}{found}, the kernel before it {before}; "
                f"{self.search.probes} probe(s)" + (f"; {o.note}" if o.note else "")
            )
        if o.kind == "range" and o.last_good is not None:
            names = ", ".join(f"K{i + 1}" for i in o.candidates)
            stayed = "; ".join(
                f"K{i + 1} stayed {self.probes[i].evidence.text()}"
                for i in o.candidates
                if i in self.probes and not self.probes[i].evidence.decided
            )
            return (
                f"There are only 'skip'ped kernels left to test. The first bad kernel could be any of: {names} "
                f"(after {self._label(o.last_good)})"
                + (f"; {stayed}" if stayed else "")
                + (f"; {o.note}" if o.note else "")
            )
        last = self.probes.get(len(s.kernels) - 1)
        if o.kind == "no step":
            return (
                f"no step: {self._label(len(s.kernels) - 1)} is equivalent to {self._label(0)} within "
                f"{s.threshold:.0%} in {self.metric.text}"
                + (f" ({self._ci_text(last.evidence)})" if last else "")
                + "; nothing to bisect"
            )
        if o.kind == "undecided ends":
            return (
                f"undecided: {self._label(len(s.kernels) - 1)} against {self._label(0)} stayed "
                + (f"{last.evidence.text()} ({self._ci_text(last.evidence)})" if last else UNDECIDED_TEXT)
                + " within the budget; nothing bisected (raise --budget or --max-rounds)"
            )
        return f"incomplete: {o.note}"

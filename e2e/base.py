"""The Avocado base class of every scenario that needs a guest.

``boot(config)`` gives a booted Machine with SSH ready, shut down in
tearDown whatever happened; ``require(cond, reason)`` is the skip (CANCEL
under Avocado, SKIPPED under pytest); ``record(m)`` writes a measurement
with its environment; the host-wide measurement lock is held from setUp to
tearDown (exclusive when ``measures()``), always before the KSM lock; stale
knobs are restored first; QMP and SSH chatter goes to WIRE_LOG.  Every test
class carries ``:avocado: enable`` (tests/e2e/test_e2e_discovery.py checks it).
docs/architecture.md, "e2e/base.py", says why each is so."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import re
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import avocado
from avocado.core import exceptions

from memqual.host.core import clock, nested, profiles, settings
from memqual.host.core.environment import Environment
from memqual.host.core.errors import CapabilityMissing, GuestError, GuestStopped, Timeout
from memqual.host.core.locks import FileLock
from memqual.host.core.machine import Machine
from memqual.host.core.nested import HostUnderTest
from memqual.host.core.qemu import ENV_QEMU, MachineConfig
from memqual.host.core.record import Measurement, write
from memqual.host.core.ssh import STATE_NOTE
from memqual.host.core.trust import check_output_dir

# Parameters of a whole run, set by ``memqual run`` (or by hand).
ENV_KERNEL = settings.GUEST_KERNEL
ENV_MODULES = settings.GUEST_MODULES
MEASURES_NOTHING = "memqual_measures_nothing"  # the attribute @measures_nothing sets
# A test class that is no GuestTest but takes the measurement lock exclusive
# itself for each of its tests says so with this class attribute set True:
# ./run-tests starts it among the measuring tests (tests/support/e2e_order.py).
HOLDS_THE_LOCK_ALONE = "holds_the_lock_alone"
TestMethod = TypeVar("TestMethod", bound=Callable[..., None])


# The guests' protocol chatter: every QMP command, reply and event
# (qemu.qmp at DEBUG; a balloon test polls query-balloon every 1-10 ms)
# and paramiko's transport (DEBUG): 9 of a test's 10 log records.
# Avocado's runner passes a test's log records to the job through a pipe
# and reads one per 10 ms: a balloon test's burst of them filled the pipe
# (about 210 records), so the test's end reached the job 2.1 s late and,
# worse, the test's own logging call blocked for 60-130 ms inside its
# timed polling loop until the runner had read a page of them.  They go to
# WIRE_LOG in the test's results directory instead, written at once; their
# INFO and above still reach debug.log.
WIRE_LOGGERS = ("qemu.qmp", "paramiko")
WIRE_LOG = "wire.log"
WIRE_FORMAT = "%(asctime)s %(name)s %(levelname)-5.5s| %(message)s"


class _ToRoot(logging.Handler):
    """Hands a record on to the root logger's handlers (Avocado's: the
    test's debug.log), as propagation would."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger().handle(record)


class WireLog:
    """While started: the records of ``loggers`` go to ``path``, and only
    those at ``keep_level`` and above also go on to the root logger."""

    def __init__(self, path: Path, loggers: tuple[str, ...] = WIRE_LOGGERS, keep_level: int = logging.INFO) -> None:
        self.path = path
        self.loggers = loggers
        self._file = logging.FileHandler(path, encoding="utf-8", delay=True)
        self._file.setFormatter(logging.Formatter(WIRE_FORMAT))
        self._up = _ToRoot(keep_level)
        self._propagate: dict[str, bool] = {}

    def start(self) -> None:
        for name in self.loggers:
            logger = logging.getLogger(name)
            self._propagate[name] = logger.propagate
            logger.addHandler(self._file)
            logger.addHandler(self._up)
            logger.propagate = False

    def stop(self) -> None:
        for name, propagate in self._propagate.items():
            logger = logging.getLogger(name)
            logger.removeHandler(self._file)
            logger.removeHandler(self._up)
            logger.propagate = propagate
        self._propagate.clear()
        self._file.close()


# Above the time a quick run's measuring tests take in all (about 7
# minutes here): however Avocado's runner slots interleave them, a waiting
# test is behind at most those.
MEASURE_LOCK_DEADLINE_S = 600.0


class MeasurementLock:
    """The host-wide lock of the tests: flock on ``measure.lock`` in the
    state directory (the kernel drops it when its holder dies, even by
    SIGKILL), or in the cache directory where the state directory cannot be
    used (not root).  A test that measures takes it exclusive; one that
    measures nothing takes it shared.  No waiter is preferred: a test
    nested in one that holds it shared (tests/ and e2e/test_cleanup.py
    run such) must get its shared hold at once, and a measuring test
    waiting in one runner slot wins the gap while the other slot starts
    its next test, which takes a second or more."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or self._default_path()
        self._lock = FileLock(self.path, mode=0o644, holder_pid=True)

    @staticmethod
    def _default_path() -> Path:
        from memqual.host.core.knobs import default_state_dir
        from memqual.host.core.paths import cache_dir
        from memqual.host.ksm.state import HostState

        state = HostState(default_state_dir())
        try:
            state.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            state.check_dir()
            if os.access(state.state_dir, os.W_OK):
                return state.state_dir / "measure.lock"
        except PermissionError:
            pass
        return cache_dir() / "measure.lock"

    def acquire(
        self, deadline_s: float = MEASURE_LOCK_DEADLINE_S, poll_s: float = 0.02, *, exclusive: bool = True
    ) -> float:
        """Take the lock (exclusive, or shared with other shared holders)
        within ``deadline_s``; the seconds waited.  A short poll period: a
        waiter should win over a test that has just started when the holder
        lets go (flock wakes no one in order)."""
        return self._lock.take(
            deadline_s=deadline_s,
            exclusive=exclusive,
            poll_s=poll_s,
            on_timeout=lambda: Timeout(
                f"the measurement lock {self.path} is still held by pid {self.holder() or '?'} after {deadline_s:.0f} s"
            ),
        )

    def release(self) -> None:
        self._lock.release()

    def holder(self) -> int | None:
        return self._lock.holder()


# The guest's /proc/cpuinfo by (QEMU binary, accelerator), read at the
# first boot of each in this process.
_CPUINFO: dict[tuple[str, str], str] = {}


def _cpu_key(vm: Machine) -> tuple[str, str]:
    return (settings.qemu() or "", vm.accel)


def measures_nothing(method: TestMethod) -> TestMethod:
    """Mark a test method that measures neither time nor host-wide state:
    it holds the measurement lock shared (GuestTest.measures)."""
    setattr(method, MEASURES_NOTHING, True)
    return method


REQUIRES = "memqual_requires"  # the attribute @requires sets


def requires(condition: Callable[[], bool], reason: str) -> Callable[[TestMethod], TestMethod]:
    """Mark a test method that runs only when ``condition()`` holds (a
    profile's size, say): GuestTest.setUp asks before it waits for the
    measurement lock, so a test that will only be cancelled does not hold
    one of the job's slots waiting (one waited 47 s in ./run-tests)."""

    def mark(method: TestMethod) -> TestMethod:
        setattr(method, REQUIRES, (condition, reason))
        return method

    return mark


DRIVES_THE_HOST_UNDER_TEST = "memqual_drives_the_host_under_test"  # the attribute @drives_its_host sets


def drives_its_host(method: TestMethod) -> TestMethod:
    """Mark a test method no scenario row names (a row's scenario in a
    variant the rows leave out) that drives its guest's host through the
    guest (``Machine.host_ssh`` under a host under test, this machine's
    knobs otherwise): it runs under ``--host-kernel`` too, on L1's knobs.
    A row's test is not marked: its row says it
    (``Scenario.on_a_host_under_test``, host/judge/host_under_test_plan.py)."""
    setattr(method, DRIVES_THE_HOST_UNDER_TEST, True)
    return method


def under_pytest() -> bool:
    return "PYTEST_CURRENT_TEST" in os.environ


def profile() -> str:
    """The run's profile (host/core/profiles.py): quick, full or ab."""
    return profiles.current()


def skip(test: avocado.Test, reason: str) -> None:
    """End ``test`` as skipped, with the reason: CANCEL under avocado,
    SKIPPED under pytest, never a pass."""
    if under_pytest():
        import pytest

        pytest.skip(reason)
    test.cancel(reason)


def put_boot_seed(block: int) -> None:
    """On icount A and B of a block boot from the same inputs, and each
    block from its own (host/core/clock.py, ICOUNT_RTC_BASE): the blocks
    stay independent boots, the arms of one block are paired.  Outside
    blocks (``block`` 0) no seed is left behind: the clock's default."""
    settings.put(settings.BOOT_SEED, str(block) if block else None)


def reference_of(test: unittest.TestCase) -> str:
    """The test as the scenario rows name it (``Scenario.e2e``):
    ``test_file_stem:Class.method``."""
    return reference_in(type(test), test._testMethodName)


def reference_in(cls: type, method: str) -> str:
    """Test ``method`` of ``cls`` as the scenario rows name it."""
    return f"{Path(inspect.getfile(cls)).stem}:{cls.__name__}.{method}"


def runs_under_a_host_under_test(cls: type, method: str) -> bool:
    """Can test ``method`` of ``cls`` run under a host under test as it is?
    A scenario's test as its rows say (host/judge/host_under_test_plan.py,
    which a host patch's scope reads too): under a host under test the
    guest's clock is L1's, the host's work included, and a test driving
    its host drives L1's.  A test that turns this machine's knobs or reads
    its processes (KSM, THP, the huge page pool, QEMU's RSS, /dev/kvm)
    would read the wrong host.  A test no row names runs there when its
    class counts only its guests' instructions or it is ``@drives_its_host``."""
    from memqual.host.judge import host_under_test_plan

    return (
        getattr(cls, "counts_only_its_guests", False)
        or getattr(getattr(cls, method, None), DRIVES_THE_HOST_UNDER_TEST, False)
        or reference_in(cls, method) in host_under_test_plan.tests()
    )


def off_the_host_under_test(test: avocado.Test) -> str:
    """Why ``test`` is skipped here, "" when it runs: under a host under
    test (the process's, which a GuestTest's arm sets; else its variant's
    ``host_kernel``, for a test that is no GuestTest) a test that cannot
    run there."""
    host = nested.from_environment()
    name = host.name if host is not None else str(test.params.get("host_kernel", default="") or "")
    return skipped_under(name, type(test), test._testMethodName)


def skipped_under(host: str, cls: type, method: str) -> str:
    """Why test ``method`` of ``cls`` is skipped under the host under test
    named ``host`` ("": this machine, or a test that runs there,
    ``runs_under_a_host_under_test``)."""
    if not host or runs_under_a_host_under_test(cls, method):
        return ""
    from memqual.host.judge import host_under_test_plan

    why = host_under_test_plan.reason_for(reference_in(cls, method)) or (
        "this test turns or reads this machine's host (its knobs, its processes, its /dev/kvm)"
    )
    return f"not on the host under test ({host}): {why}; run it without --host-kernel"


def put_clock(reference: str) -> None:
    """Under a run's plan (``--clock auto``) the clock of the test
    ``reference`` (host/judge/clock_plan.py), made its process's before its
    first guest: its guests run on it and its records name it.  Any
    other clock stays as the job set it."""
    the_clock = clock.current()
    if the_clock.auto:
        from memqual.host.judge import clock_plan

        clock.put(clock_plan.for_test(reference, the_clock))


def beside_others(reference: str) -> bool:
    """Whether the test ``reference``, on its process's clock, may measure
    beside other such tests: on icount, a test whose every primary is read
    by its guests' own instruction count and which changes no host-wide
    state (host/judge/clock_plan.py ``shares_host``).  The host's load,
    another guest's included, moves no guest's instruction count."""
    the_clock = clock.current()
    if not the_clock.icount:
        return False
    from memqual.host.judge import clock_plan

    return clock_plan.runs_beside_others(reference, the_clock)


# How long a guest has, after a failure, to answer a command that does
# nothing before it is taken for stopped (its SSH's slowdown stretches
# nothing here: a guest that answers does so in well under a second).
ALIVE_PROBE_S = 20.0


class GuestTest(avocado.Test):
    """Base class; it has no tests of its own."""

    timeout = 900  # Avocado kills a test after this; QEMU dies with it

    def measures(self) -> bool:
        """Does this test measure time or host-wide state?  Then it holds
        the measurement lock exclusive and runs alone.  A test method marked
        ``@measures_nothing`` holds it shared and overlaps only other such
        tests."""
        method = getattr(self, self._testMethodName, None)
        return not getattr(method, MEASURES_NOTHING, False)

    # A test whose every figure is a count of its own guests' instructions
    # (an icount clock's check) says so: it holds the lock shared.
    counts_only_its_guests = False

    def needs_the_host_alone(self) -> bool:
        """Does this test hold the measurement lock exclusive?  A test that
        measures, unless on icount its primaries are counts of its own
        guests' instructions (``beside_others``): call it after put_clock."""
        if self.counts_only_its_guests:
            return False
        if clock.current().icount and self.host_under_test() is not None and self.runs_under_a_host_under_test():
            # Its guests and their host are one L1 of its own: on icount
            # every figure is a count of that L1's instructions.
            return False
        return self.measures() and not beside_others(reference_of(self))

    def runs_under_a_host_under_test(self) -> bool:
        """Can this test's guests run under a host under test as they are?
        (``runs_under_a_host_under_test``)"""
        return runs_under_a_host_under_test(type(self), self._testMethodName)

    def host_under_test(self) -> HostUnderTest | None:
        """The run's host under test (``--host-kernel``), or None: this machine."""
        return nested.from_environment()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        method = getattr(self, self._testMethodName, None)
        if callable(method):
            setattr(self, self._testMethodName, self._watched(method))

    def setUp(self) -> None:
        self._machines: list[Machine] = []
        self._image: Any = None
        self._measure_lock: MeasurementLock | None = None
        self._wire: WireLog | None = None
        if not under_pytest():
            # Under pytest no runner pipe is in between: its capture keeps all.
            self._wire = WireLog(Path(self.logdir) / WIRE_LOG)
            self._wire.start()
        needed = getattr(getattr(self, self._testMethodName, None), REQUIRES, None)
        if needed is not None and not needed[0]():
            self.skip_because(needed[1])
        # The arm first: its host under test decides where this test's
        # guests run.  Then the clock: on icount what this test measures
        # may decide whether it needs the host to itself.
        self._take_arm()
        # Before the lock: a test that cannot run here must not wait behind
        # the measuring tests to say so.
        off = off_the_host_under_test(self)
        if off:
            self.skip_because(off)
        put_clock(reference_of(self))
        lock = MeasurementLock()
        exclusive = self.needs_the_host_alone()
        waited = lock.acquire(exclusive=exclusive)
        self._measure_lock = lock
        if waited > 1:
            how = "exclusive" if exclusive else "shared"
            self.log.info("waited %.1f s for the measurement lock %s (%s)", waited, lock.path, how)
        if self.measures() and not exclusive:
            self.log.info(
                "on %s this test's primaries are counts of its guests' instructions: it holds the measurement lock "
                "shared, beside other such tests",
                clock.current().label,
            )
        self._restore_stale_host_state()

    # -- the arm of an interleaved A/B (host/run/blocks.py) ---------------------
    def _take_arm(self) -> None:
        """In an A/B run every test runs as variants, one per arm and
        block; the variant names its arm's kernel and QEMU.  The test's
        process is its own, so the environment is where the image build,
        the balloon driver, the guest command line and the QEMU launcher
        (which read it) find them."""
        self.arm = str(self.params.get("arm", default="") or "")
        self.block = int(self.params.get("block", default=0) or 0)
        put_boot_seed(self.block)
        if not self.arm:
            return
        for name, param in (
            (ENV_KERNEL, "kernel"),
            (ENV_MODULES, "modules"),
            (settings.GUEST_KERNEL_BUILD, "kernel_build"),
            (settings.GUEST_CMDLINE_EXTRA, "cmdline_extra"),
            (settings.HOST_KERNEL, "host_kernel"),
            (settings.HOST_KERNEL_PARAMS, "host_kernel_params"),
        ):
            settings.put(name, str(self.params.get(param, default="") or ""))
        # An arm's QEMU: every guest of this test (memqual.host.core.qemu reads
        # the variable at each start), its records' environment and its
        # warm snapshot key follow it.  Empty: the QEMU the job inherited.
        qemu = str(self.params.get("qemu", default="") or "")
        if qemu:
            settings.put(ENV_QEMU, qemu)
        settings.put(settings.RUN_LABEL, self.arm)
        self.log.info(
            "arm %s, block %d: kernel %s, QEMU %s",
            self.arm,
            self.block,
            settings.guest_kernel() or "default",
            settings.qemu() or "the system's",
        )

    def block_config(self, config: MachineConfig) -> MachineConfig:
        """In a block of an A/B (or a bisect's probe) every guest boots
        cold, and so does every guest of a measuring test of ``memqual run``
        outside blocks (MEMQUAL_COLD_MEASURING, which it sets: its results
        are what ``memqual compare`` and ``history`` compare).  A warm start
        restores the one boot its snapshot saved, so every block of an arm,
        or every run of a host, would repeat that boot's memory state: a
        boot-state metric (the balloon floor) then varies less between
        blocks than between real boots (measured: 1-2 % against 7 %), and
        two arms or runs differ by their snapshots, not by their kernels.
        A cold boot costs about 2.5 s more here (docs/ab-calibration.md,
        "Cold guests").  Tests that measure nothing (test_warm.py's among
        them) keep warm starts."""
        cold = self.block > 0 or (settings.cold_measuring() and self.measures())
        return dataclasses.replace(config, warm=False) if cold else config

    def first_unit(self) -> int:
        """The index a scenario's first fresh guest counts from when it
        rotates an order between guests (sizes, variants first): the block
        before this one, so that with one guest per block the order still
        rotates between blocks, and A and B of one block share it."""
        return max(self.block - 1, 0)

    def tearDown(self) -> None:
        try:
            for machine in reversed(getattr(self, "_machines", [])):
                machine.shutdown()
        finally:
            lock = getattr(self, "_measure_lock", None)
            if lock is not None:
                lock.release()
            wire = getattr(self, "_wire", None)
            if wire is not None:
                wire.stop()  # after the guests: their shutdown's QMP goes there too

    def _watched(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` (the test), run so that a failure first asks its
        guests whether they still answer.  Here, not in tearDown: a guest's
        QEMU dies with the thread that started it (PR_SET_PDEATHSIG), and
        Avocado ends the test's thread before tearDown."""

        @functools.wraps(method)
        def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except (exceptions.TestCancel, exceptions.TestSkipError):
                raise
            except Exception as failure:
                stopped = [seen for m in getattr(self, "_machines", []) if (seen := self._did_it_stop(m, failure))]
                if stopped:
                    # what the run's summary shows: the stop, then what failed by it
                    raise GuestStopped(
                        f"the guest stopped answering: {'; '.join(stopped)} (then: {failure})"
                    ) from failure
                raise

        return watched

    def _did_it_stop(self, machine: Machine, failure: Exception) -> str:
        """After ``failure``, ask a guest that still runs for a command: one
        that does not answer stopped, and what its vCPUs were doing is
        returned (also in this test's log and its stuck-N.txt:
        Machine.stuck_evidence); "" for a guest that answers or is gone."""
        if not machine.is_running() or not machine.ssh_ready:
            return ""
        try:
            machine.ssh.run(["true"], timeout=ALIVE_PROBE_S)
        except GuestError as exc:
            seen = "; ".join(getattr(exc, "__notes__", None) or [machine.stuck_evidence()])
            seen = seen.removeprefix(STATE_NOTE)
            self.log.info("the guest did not answer after the failure (%s): %s", exc, seen)
            return seen
        return ""

    # -- capabilities -----------------------------------------------------
    def require(self, condition: bool, reason: str) -> None:
        """Skip (with the reason) unless ``condition``."""
        if not condition:
            self.skip_because(reason)

    def skip_because(self, reason: str) -> None:
        skip(self, reason)

    # -- guests -----------------------------------------------------------
    def image(self) -> Any:
        if self._image is None:
            from memqual.images.build import KernelSource, build

            kernel, modules = settings.guest_kernel(), settings.guest_modules()
            source = KernelSource(Path(kernel) if kernel else None, Path(modules) if modules else None)
            try:
                self._image = build(source)
            except CapabilityMissing as exc:
                self.skip_because(str(exc))
        return self._image

    def boot(
        self, config: MachineConfig | None = None, boot_timeout: float = 120.0, host: HostUnderTest | None = None
    ) -> Machine:
        """A fresh guest of this test, on ``host`` (else the run's host
        under test, else this machine)."""
        the_host = host if host is not None else nested.from_environment()
        machine = Machine(
            self.block_config(config or MachineConfig()),
            image=self.image(),
            log_dir=self.outdir,
            boot_timeout=boot_timeout * (nested.BOOT_TIMEOUT_FACTOR if the_host is not None else 1),
            host=the_host,
        )
        self._machines.append(machine)  # registered first: tearDown reaps even a failed launch
        try:
            machine.launch()
        except CapabilityMissing as exc:
            self.skip_because(str(exc))
        self.log.info(
            "guest up: %s start, %s, SSH after %.2f s",
            "warm" if machine.started_warm else "cold",
            machine.accel,
            machine.boot_to_ssh_s,
        )
        self._note_guest_cpu(machine)
        return machine

    def _guest_cpuinfo(self, vm: Machine) -> str:
        """The guest's /proc/cpuinfo (its first processor), as read by the
        first guest of this QEMU and accelerator; "" when none could be."""
        return _CPUINFO.get(_cpu_key(vm), "")

    def _note_guest_cpu(self, vm: Machine) -> None:
        """Read the guest's CPU once per QEMU and accelerator in this test's
        process (every guest of one QEMU's ``-cpu max`` sees the same CPU),
        right after its first boot, before the test measures anything."""
        key = _cpu_key(vm)
        if key in _CPUINFO:
            return
        try:
            out = vm.ssh.run(["head", "-n", "40", "/proc/cpuinfo"], timeout=20, check=False)
            _CPUINFO[key] = out.stdout if out.status == 0 else ""
        except (GuestError, Timeout, OSError) as exc:
            self.log.info("guest CPU not read: %s", exc)
            _CPUINFO[key] = ""

    # -- results ----------------------------------------------------------
    @property
    def outdir(self) -> Path:
        override = settings.output_dir()
        if override and under_pytest():
            # root writes records there: a folder nobody else can change
            check_output_dir(override, f"records folder (${settings.OUTPUT_DIR})")
            path = override
        else:
            path = Path(self.outputdir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def environment(self) -> Environment:
        """The host's environment (memqual.host.core.probe), with the accelerator of this
        test's last guest and its image."""
        from memqual.host.core import probe

        # A test with no guest timed everything on the host: the wall clock.
        env = probe.environment().with_clock(clock.WALL)
        if self._machines:
            vm = self._machines[-1]
            env = (
                env.with_accel(vm.accel, vm.accel_reason)
                .with_clock(vm.clock.label, vm.config.cpus)
                .with_guest_cpu(self._guest_cpuinfo(vm))
            )
            if vm.host is not None and vm.host_image is not None:
                env = env.with_host(vm.host_label, vm.host_image.release)
        if self._image is not None:
            env = env.with_guest(self._image)
        return env

    def record(self, measurement: Measurement) -> Path:
        measurement.environment = {**self.environment().to_json(), **measurement.environment}
        if getattr(self, "arm", ""):
            # Every replicate of this test came from this arm's guests in this block.
            measurement.arm = self.arm
            measurement.blocks = [self.block] * len(measurement.replicates)
        path = write(measurement, self.outdir)
        self.log.info("record %s/%s: %s", measurement.scenario, measurement.metric, path)
        return path

    # -- host hygiene -----------------------------------------------------
    def _restore_stale_host_state(self) -> None:
        from memqual.host.core import knobs, scenario

        for restored in knobs.restore_every_stale(scenario.knob_sets()):
            self.log.warning("restored host knobs a killed run left changed: %s", restored)


# Guest seconds of quiet before a timed loop: the boot's and the agent
# push's deferred work (writeback, workqueues) runs first.  Under sleep=off
# an idle guest's clock jumps to its next timer, so this costs the host
# well under a second.
SETTLE = ["sh", "-c", "sync; sleep 20"]


def fill_runs(vm: Machine, mib: int, runs: int, timeout_s: float = 300.0) -> list[float]:
    """The guest-timed seconds of ``runs`` runs of ksm_stress's fill (a
    memset of every page of a fresh ``mib`` MiB mapping, timed by the
    guest's CLOCK_MONOTONIC), after the agent's push and a settle."""
    agent = vm.deploy("ksm_stress")
    vm.ssh.run(SETTLE, timeout=timeout_s)
    seconds = []
    for _ in range(runs):
        command = [agent, "--mib", str(mib), "--phases", "fill", "--timeout", str(int(timeout_s))]
        out = vm.ssh.run(command, timeout=2 * timeout_s).stdout
        match = re.search(r"event=fill_done \S+ \S+ duration_s=([0-9.]+)", out)
        if match is None:
            raise GuestError(f"ksm_stress printed no fill_done: {out[-300:]}")
        seconds.append(float(match.group(1)))
    return seconds

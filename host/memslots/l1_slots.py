"""The /dev/kvm slot operations in the host under test (L1):
guest/kvm_slots.c, kvm_bench.py's twin in C (L1 has no Python), pushed
into L1 over its SSH and run there once with a deadline, in kvm_bench's
order.  Its JSON lines become kvm_bench's own result (the probes' errnos,
each fresh VM's creation, move and delete times and guest passes), so
``memqual memslots kvm`` summarises, prints and records it as it does a
run on this machine; its times are L1's clock.  docs/memslots-kvm.md,
"The slot operations in L1"."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from memqual.host.core.environment import Environment
from memqual.host.core.errors import BadInput, GuestError
from memqual.host.core.printable import one_line
from memqual.host.core.shell import Shell
from memqual.host.memslots import l1_program
from memqual.host.memslots.kvm_bench import (
    EXPECTED_ERRNO,
    BenchConfig,
    BenchResult,
    RunSample,
    VcpuSample,
    full_vm_probe,
    make_probe,
    schedule,
    warmup_slots,
)
from memqual.host.memslots.kvm_guest import SlotGeometry, balanced_tree_nodes, model_walk

AGENT = "kvm_slots"
L1_PATH = "/tmp/kvm_slots"
# guest/kvm_slots.c's bounds: runs a process, its deadline.
MAX_RUNS = 4096
MAX_DEADLINE_S = 86400
# This machine's wait beyond the program's own deadline (its SIGALRM in
# L1): time for its line on stderr to come back over SSH.
DEADLINE_SLACK_S = 30.0
NS = 1e-9
VCPU_KEYS = ("empty_ns", "first_ns", "warm_ns", "same_ns", "mmio_ns", "mmio_exits", "mmio_mismatches", "touched_ok")


class L1SlotsFailed(GuestError):
    """kvm_slots failed in L1: an ioctl, or a guest pass that stopped where
    none may: a failure, never a skip."""


@dataclass(frozen=True)
class L1SlotsConfig:
    """kvm_bench's configuration as L1 runs it, and the deadline of the
    whole run there."""

    bench: BenchConfig
    deadline_s: int = 3600

    def check(self) -> None:
        for n in self.bench.slots:
            SlotGeometry(n, self.bench.slot_pages).check()
        runs = len(self.bench.slots) * self.bench.repeats
        if runs > MAX_RUNS:
            raise BadInput(f"{runs} runs: kvm_slots takes at most {MAX_RUNS} a process; give fewer repeats")
        if not 1 <= self.deadline_s <= MAX_DEADLINE_S:
            raise BadInput(f"deadline {self.deadline_s} s: give 1 to {MAX_DEADLINE_S}")

    def argv(self, program: str) -> list[str]:
        """The program's command line: numbers and fixed words only, the
        runs in kvm_bench's order after its discarded warm-up."""
        out = [program, "bench", "slot-pages", str(self.bench.slot_pages), "deadline", str(self.deadline_s)]
        out += [] if self.bench.vcpu else ["no-vcpu"]
        out += ["warmup", str(warmup_slots(self.bench.slots))]
        for repeat, n in schedule(self.bench.slots, self.bench.repeats):
            out += ["run", str(n), str(repeat)]
        return out


def _count(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise GuestError(f"kvm_slots printed {key}={one_line(str(value))!s:.40}, not a count")
    return value


def _word(obj: dict[str, Any], key: str, allowed: frozenset[str] | None = None) -> str:
    """A name kvm_slots prints (a module, a release, an errno): records and
    pages carry it, so only a name's characters pass."""
    value = obj.get(key)
    if not isinstance(value, str) or not WORD.fullmatch(value) or (allowed is not None and value not in allowed):
        raise GuestError(f"kvm_slots printed {key}={one_line(str(value))!s:.64}, not what it says there")
    return value


WORD = re.compile(r"[A-Za-z0-9_.+~ -]{1,64}")
ERRNOS = frozenset({"EINVAL", "EEXIST", "ENOMEM", "EFAULT", "EPERM", "ENOSPC", "accepted", "another errno"})


def _vcpu(obj: object, n: int) -> VcpuSample | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise GuestError(f"kvm_slots printed vcpu {one_line(str(obj)):.80}, not an object")
    c = {key: _count(obj, key) for key in VCPU_KEYS}
    reported = obj.get("reported")
    if not isinstance(reported, list):
        reported = None
    counts = reported is not None and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in reported)
    if reported is None or not counts or len(reported) != 4:
        raise GuestError(f"kvm_slots printed reported={one_line(str(reported)):.60}, not four counts")
    return VcpuSample(
        empty_pass_s=c["empty_ns"] * NS,
        first_touch_s=c["first_ns"] * NS,
        warm_touch_s=c["warm_ns"] * NS,
        same_slot_s=c["same_ns"] * NS,
        mmio_s=c["mmio_ns"] * NS,
        accesses=n,
        reported=(reported[0], reported[1], reported[2], reported[3]),
        mmio_exits=c["mmio_exits"],
        mmio_mismatches=c["mmio_mismatches"],
        touched_ok=c["touched_ok"],
        other_exits=_count(obj, "other_exits"),
    )


def parse(text: str, config: L1SlotsConfig) -> BenchResult:
    """kvm_slots' lines as kvm_bench's result (the model's walks added as
    kvm_bench adds them); a line it does not print is an error."""
    kvm: dict[str, Any] | None = None
    probes, samples, vcpu_error = [], [], None
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or obj.get("line") not in ("kvm", "probe", "vcpu", "run"):
            raise GuestError(f"not a line of kvm_slots: {one_line(line):.120}")
        if obj["line"] == "kvm":
            kvm = obj
        elif kvm is None:
            raise GuestError("kvm_slots printed a result before what /dev/kvm said")
        elif obj["line"] == "probe":
            name = _word(obj, "name", frozenset(EXPECTED_ERRNO))
            probes.append(make_probe(name, _count(kvm, "nr_memslots"), _word(obj, "observed", ERRNOS)))
        elif obj["line"] == "vcpu":
            error = obj.get("error")
            vcpu_error = None if error is None else one_line(str(error))[:300]
        else:
            n = _count(obj, "slots")
            limit = obj.get("limit")
            samples.append(
                RunSample(
                    slots=n,
                    repeat=_count(obj, "repeat"),
                    setup_s=_count(obj, "setup_ns") * NS,
                    move_s=_count(obj, "move_ns") * NS,
                    delete_s=_count(obj, "delete_ns") * NS,
                    vcpu=_vcpu(obj.get("vcpu"), n),
                    limit=None
                    if limit is None
                    else full_vm_probe(_count(kvm, "nr_memslots"), n, _word(obj, "limit", ERRNOS)),
                )
            )
    if kvm is None:
        raise GuestError("kvm_slots printed nothing")
    expected = list(schedule(config.bench.slots, config.bench.repeats))
    if [(s.repeat, s.slots) for s in samples] != expected or [p.name for p in probes] != list(EXPECTED_ERRNO):
        raise GuestError(
            f"kvm_slots printed {len(samples)} runs and {len(probes)} probes, not the {len(expected)} runs and "
            f"the {len(EXPECTED_ERRNO)} probes asked, in their order"
        )
    # The guest's passes ran in every VM, or in none: not asked, or a vCPU
    # that cannot run the guest (the "vcpu" line says why).
    passes = config.bench.vcpu and vcpu_error is None
    if any((s.vcpu is not None) != passes for s in samples):
        raise GuestError(
            f"kvm_slots printed guest passes in {sum(s.vcpu is not None for s in samples)} runs, not in "
            f"{'every' if passes else 'none'}"
        )
    result = BenchResult(
        config=config.bench,
        api_version=_count(kvm, "api_version"),
        nr_memslots=_count(kvm, "nr_memslots"),
        address_spaces=_count(kvm, "address_spaces"),
        vcpu_mmap_size=_count(kvm, "vcpu_mmap_size"),
        kvm_module=_word(kvm, "kvm_module"),
        host_kernel=_word(kvm, "release"),
        probes=probes,
        samples=samples,
        vcpu_error=vcpu_error,
        model_source=balanced_tree_nodes(1)[1],
    )
    for n in config.bench.slots:
        result.model_walks[n] = model_walk(SlotGeometry(n, config.bench.slot_pages))
    return result


def deploy(shell: Shell, path: str = L1_PATH) -> str:
    """Build guest/kvm_slots.c (cached, static) and stream it to ``path``."""
    return l1_program.deploy(shell, AGENT, path)


def run(
    shell: Shell, config: L1SlotsConfig, environment: Environment | None = None, program: str | None = None
) -> BenchResult:
    """The slot operations in the host ``shell`` reaches (L1's SSH; this
    machine in tests), deployed first unless ``program`` names it there;
    ``environment`` is the host's its records carry."""
    config.check()
    path = program or deploy(shell)
    started = time.monotonic()
    out = shell.run(config.argv(path), timeout=config.deadline_s + DEADLINE_SLACK_S, check=False)
    if out.status != 0:
        raise l1_program.failure(out.status, out.stderr, "kvm_slots", L1SlotsFailed)
    result = parse(out.stdout, config)
    result.duration_s = time.monotonic() - started
    result.environment = environment
    return result


def pooled(results: list[BenchResult]) -> BenchResult:
    """Several boots' results as one: each boot's fresh VMs numbered after
    the last boot's repeats, every boot's probes kept (each must hold)."""
    first = results[0]
    repeats = first.config.repeats
    samples = [
        dataclasses.replace(s, repeat=s.repeat + boot * repeats) for boot, r in enumerate(results) for s in r.samples
    ]
    return dataclasses.replace(
        first,
        config=dataclasses.replace(first.config, repeats=repeats * len(results)),
        probes=[p for r in results for p in r.probes],
        samples=samples,
        vcpu_error=next((r.vcpu_error for r in results if r.vcpu_error), None),
        duration_s=sum(r.duration_s for r in results),
    )

"""Where a verdict's evidence ran: the host its records' guests ran on
(this machine, or a host under test with its kernel and parameters) and
the clock their timings were read on, from the records' environments.
Records of one claim that disagree (two hosts, two clocks) are named as
mixed: picking one would hide that the ratio spans them.  A model and a
claim not measured have no host or clock of their own.
docs/claims-and-report.md, "Host and clock".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memqual.host.core.environment import Environment
from memqual.host.core.nested import THIS_MACHINE, on_emulated_svm
from memqual.host.core.record import Measurement

NO_MEASUREMENT = "no measurement"
NOT_RECORDED = "not recorded"
MIXED = "mixed"
# What a figure of an L1 under TCG with emulated SVM is, by its clock.
EMULATED_ON_ICOUNT = (
    "an emulated CPU (TCG with SVM): figures are L1 instructions and emulated exits, not a real CPU's cycles"
)
EMULATED_ON_WALL = (
    "an emulated CPU (TCG with SVM): figures are this machine's time emulating L1's instructions and exits, "
    "not a real CPU's cycles"
)


@dataclasses.dataclass(frozen=True)
class RanOn:
    """The hosts and clocks of a verdict's records, each named once, in
    order; none: no measurement (a model, or nothing measured)."""

    hosts: tuple[str, ...] = ()
    clocks: tuple[str, ...] = ()
    emulated_svm: bool = False  # one of the hosts is an L1 under TCG with emulated SVM

    @property
    def measured(self) -> bool:
        return bool(self.hosts)

    @property
    def host(self) -> str:
        """ "this machine (accel tcg)", a host under test's label, "mixed:
        ..." or "no measurement"."""
        return _one_or_mixed(self.hosts)

    @property
    def clock(self) -> str:
        """ "wall", "icount:N", "mixed: ..." or "no measurement"."""
        return _one_or_mixed(self.clocks)

    @property
    def emulated_cpu(self) -> str:
        """The one line that says what an emulated CPU's figures are, or ''."""
        if not self.emulated_svm:
            return ""
        on_icount = all(c.startswith("icount") for c in self.clocks)
        return EMULATED_ON_ICOUNT if on_icount else EMULATED_ON_WALL

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "clock": self.clock,
            "hosts": list(self.hosts),
            "clocks": list(self.clocks),
            "emulated_svm": self.emulated_svm,
            "emulated_cpu": self.emulated_cpu,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RanOn | None:
        """A verdict's ``ran_on``; None for a file written before verdicts
        named their host."""
        if not isinstance(data, Mapping):
            return None
        return cls(
            hosts=tuple(str(h) for h in data.get("hosts") or ()),
            clocks=tuple(str(c) for c in data.get("clocks") or ()),
            emulated_svm=bool(data.get("emulated_svm")),
        )


def ran_on(*records: Measurement) -> RanOn:
    """The hosts and clocks of these records, each distinct one once."""
    envs = [Environment.from_json(r.environment or {}) for r in records]
    hosts = tuple(dict.fromkeys(host_of(e) for e in envs))
    return RanOn(
        hosts=hosts,
        clocks=tuple(dict.fromkeys(e.clock or NOT_RECORDED for e in envs)),
        emulated_svm=any(on_emulated_svm(h) for h in hosts),
    )


def host_of(env: Environment) -> str:
    """The host a record's guests ran on: the host under test's label, or
    this machine with its accelerator."""
    if env.host_under_test:
        return env.host_under_test
    return f"{THIS_MACHINE} (accel {env.accel or NOT_RECORDED})"


def _one_or_mixed(names: tuple[str, ...]) -> str:
    if not names:
        return NO_MEASUREMENT
    if len(names) == 1:
        return names[0]
    return f"{MIXED}: {'; '.join(names)}"

"""Boot faults counted (lab/count_panics.py): a console's fault found and
named, the modes taken in turn up to a deadline, the rates and their test."""

from __future__ import annotations

import json

import pytest

from memqual.host.core.errors import GuestError, Timeout
from memqual.lab import count_panics
from memqual.lab.count_panics import Boot, Mode

# The 6.12 fault as a multi-threaded TCG boot printed it (trimmed).
OOPS = """\
[    1.812345] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[    1.812400] CPU: 1 PID: 0 Comm: swapper/1 Not tainted 6.12.111+deb12-amd64 #1
[    1.812450] RIP: 0010:sched_clock_cpu+0x9/0x190
[    1.812500] Kernel panic - not syncing: Attempted to kill the idle task!
"""


@pytest.mark.parametrize(
    ("console", "error", "outcome", "signature"),
    [
        ("[ 0.1] Linux version 6.1\nmemqual-ready\n", None, "ok", ""),
        (
            OOPS,
            GuestError("QEMU exited during boot (status 0)"),
            "fault",
            "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI at sched_clock_cpu+0x9/0x190",
        ),
        # a fault the boot survived is still a fault
        (OOPS.splitlines()[0] + "\nmemqual-ready\n", None, "fault", "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI"),
        (
            "[ 0.1] x86: Booting SMP configuration\n",
            Timeout("the guest did not answer SSH within 90 s"),
            "hang",
            "the guest did not answer SSH within 90 s",
        ),
        # a hang whose vCPUs were read: their state is its signature
        (
            "",
            Timeout("the guest did not answer SSH within 90 s (accel tcg); its vCPUs: vCPU 0 halted at f+0x1"),
            "hang",
            "vCPUs: vCPU 0 halted at f+0x1",
        ),
        ("", GuestError("QEMU did not come up"), "error", "QEMU did not come up"),
    ],
)
def test_classify(console: str, error: Exception | None, outcome: str, signature: str) -> None:
    assert count_panics.classify(console, error) == (outcome, signature)


def test_modes_are_taken_in_turn_until_the_deadline() -> None:
    modes = [Mode("6.12.111+deb12-amd64"), Mode("6.12.111+deb12-amd64", tcg_thread="single")]
    t = [0.0]

    def one(mode: Mode, index: int, timeout: float) -> Boot:
        t[0] += 10.0
        return Boot(mode.name, index, "ok", 10.0, "", "7.2.22")

    seen: list[Boot] = []
    done = count_panics.count(modes, 100, 45.0, 90.0, seen.append, one=one, now=lambda: t[0])
    assert [b.mode for b in done] == [modes[0].name, modes[1].name] * 2 + [modes[0].name]
    assert seen == done
    assert [b.index for b in done] == [0, 0, 1, 1, 2]


def test_rates_count_faults_apart_from_hangs(tmp_path) -> None:
    boots = [
        Boot("m", i, o, 1.0, "Oops: int3" if o == "fault" else "", "7.2")
        for i, o in enumerate(["ok", "fault", "hang", "ok"])
    ]
    out = tmp_path / "boots.jsonl"
    write = count_panics.appender(out)
    for b in boots:
        write(b)
    (rate,) = count_panics.rates(count_panics.load(out))
    assert (rate.boots, rate.faults, rate.hangs, rate.errors) == (4, 1, 1, 0)
    assert rate.signatures == ("Oops: int3",)
    assert json.loads(out.read_text().splitlines()[1])["outcome"] == "fault"


def test_fisher_says_a_few_faults_against_none_is_weak() -> None:
    multi = count_panics.Rate("a", 130, 4, 0, 0, 0, 0, ())
    single = count_panics.Rate("b", 130, 0, 0, 0, 0, 0, ())
    p = count_panics.fisher_greater(multi, single)
    assert 0.05 < p < 0.13  # 4 of 130 against 0 of 130 does not show a cause at 5 %
    assert count_panics.fisher_greater(count_panics.Rate("a", 200, 12, 0, 0, 0, 0, ()), single) < 0.01


def test_mode_names_and_parsing() -> None:
    assert count_panics.parse_mode("6.12.111+deb12-amd64:tcg-multi") == Mode("6.12.111+deb12-amd64")
    assert count_panics.parse_mode("6.1.0-57-amd64:tcg-single").name == "6.1.0-57-amd64 tcg-single 2cpu"
    assert count_panics.parse_mode("6.1.0-57-amd64:icount:3").name == "6.1.0-57-amd64 icount:3 2cpu"
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        count_panics.parse_mode("6.1.0-57-amd64:fast")

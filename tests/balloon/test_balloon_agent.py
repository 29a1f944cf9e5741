"""guest/balloon_agent.c built and run on the host (the parts that do not
need a guest: output format, allocation, argument checks, the time bound)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess

import pytest

from memqual.host.balloon.agent import agent_records, agent_stat

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed (./setup installs it)")

LINE = re.compile(r"^t=\d+\.\d{9}( [a-z_]+=\S+)+$")


@pytest.fixture(scope="module")
def agent() -> str:
    from memqual.images.agents import build_agent

    return str(build_agent("balloon_agent"))


def run(agent: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([agent, *args], capture_output=True, text=True, timeout=timeout)


def test_stat_lines_are_timestamped_records(agent):
    out = run(agent, "stat")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines
    stat = agent_stat(out.stdout)
    assert stat["mem_total_kib"] > 0 and stat["mem_available_kib"] > 0
    assert "balloon_inflate" in stat and "balloon_deflate" in stat
    assert agent_records(out.stdout, "buddy"), "no per-zone buddyinfo lines"


def test_hold_touches_and_frees(agent):
    out = run(agent, "hold", "16", "0")
    assert out.returncode == 0
    events = [r["event"] for r in agent_records(out.stdout)]
    assert events == ["stat", "allocated", "stat", "freed", "stat"]
    allocated = agent_records(out.stdout, "allocated")[0]
    assert allocated["mib"] == "16" and allocated["touched"] == "1"
    stamps = [float(r["t"]) for r in agent_records(out.stdout)]
    assert stamps == sorted(stamps)  # monotonic


def test_pressure_steps(agent):
    out = run(agent, "pressure", "24", "8", "20")
    assert out.returncode == 0
    assert [r["allocated_mib"] for r in agent_records(out.stdout, "progress")] == ["8", "16", "24"]


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["nope"],
        ["hold", "0", "1"],
        ["hold", "-5", "1"],
        ["hold", "8", "x"],
        ["hold", "8", "1", "maybe"],
        ["watch", "0", "1"],
        ["pressure", "8", "0", "5"],
        ["stat", "extra"],
        ["track", "sideways", "10", "1000", "5"],
        ["track", "inflate", "0", "1000", "5"],
        ["track", "inflate", "10", "1000000", "5"],
        ["track", "inflate", "10", "1000"],
    ],
)
def test_bad_arguments_exit_2(agent, args):
    out = run(agent, *args)
    assert out.returncode == 2 and "usage:" in out.stderr


def test_time_bound_ends_the_agent(agent):
    proc = subprocess.Popen([agent, "hold", "1", "60"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "event=stat" in proc.stdout.readline()  # started: the handler is set before the first line
    proc.send_signal(signal.SIGALRM)  # what alarm() delivers at the bound
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 3
    assert LINE.match(out.splitlines()[-1]) and out.splitlines()[-1].endswith("event=timeout")


def test_track_arms_on_the_hosts_counter_then_hits_its_bound(agent):
    """The host's own balloon_inflate never moves: the tracker arms (reads
    the base), keeps polling, and its 1 s bound ends it with status 3."""
    out = run(agent, "track", "inflate", "10", "1000", "1", timeout=10)
    assert out.returncode == 3
    armed = agent_records(out.stdout, "tracking")
    assert armed and armed[0]["counter"] == "balloon_inflate" and int(armed[0]["base"]) >= 0
    assert out.stdout.splitlines()[-1].endswith("event=timeout")
